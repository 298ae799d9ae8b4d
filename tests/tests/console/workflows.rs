//! Workflows in the console (headless Chromium): a graph's page draws every task as a box in
//! its dependency layer with an edge per dependency, coloured and labelled by its final state;
//! a batch's page draws its members with an edge from each to its callback; the Workflows page
//! lists both; all under the console's CSP.

use std::time::Duration;

use disbatch_tests::{wait_for, write_config, Browser, Dci, Den, TestDb};
use serde_json::{json, Value};

/// What the drawing holds now: the SVG's state, its task boxes (name, state, layer, the box's
/// two texts) and its edges (from, to).
async fn drawing(b: &Browser) -> Value {
    b.client
        .execute(
            "const svg = document.querySelector('#wf-svg');
             if (!svg) return null;
             const text = (g, c) => (g.querySelector(c) || {}).textContent || '';
             return {
               state: svg.dataset.state,
               nodes: [...svg.querySelectorAll('g.wf-node')].map((g) => ({
                 task: g.dataset.task, name: g.dataset.name || null, state: g.dataset.state,
                 layer: g.dataset.layer === undefined ? null : Number(g.dataset.layer),
                 label: text(g, '.wf-name'), shown: text(g, '.wf-state'),
                 callback: g.classList.contains('wf-callback') })),
               edges: [...svg.querySelectorAll('path.wf-edge')].map((p) => [p.dataset.from, p.dataset.to]),
             };",
            vec![],
        )
        .await
        .expect("read the drawing")
}

/// Waits until the drawing shows the workflow ended and every box in a state that lasts.
async fn final_drawing(b: &Browser, what: &str) -> Value {
    let last = std::cell::RefCell::new(Value::Null);
    wait_for(what, Duration::from_secs(120), || async {
        let seen = drawing(b).await;
        let ended = ["succeeded", "failed", "cancelled"];
        let done = seen["state"].as_str().is_some_and(|s| ended.contains(&s))
            && seen["nodes"].as_array().is_some_and(|nodes| {
                nodes
                    .iter()
                    .all(|n| n["state"].as_str().is_some_and(|s| ended.contains(&s)))
            });
        *last.borrow_mut() = seen;
        done
    })
    .await;
    last.into_inner()
}

/// How the boxes and edges lie: boxes that overlap, edges that do not run downwards, edges
/// that pass through a box other than their two ends (sampled every 3 px), and whether the
/// drawing scrolls sideways in its frame.
async fn layout(b: &Browser) -> Value {
    b.client
        .execute(
            "const svg = document.querySelector('#wf-svg');
             const boxes = [...svg.querySelectorAll('g.wf-node, g.wf-ext')].map((g) => {
               const m = g.transform.baseVal.consolidate().matrix;
               const r = g.querySelector('rect');
               return { id: g.dataset.task, name: g.dataset.name, x: m.e, y: m.f,
                 w: r.width.baseVal.value, h: r.height.baseVal.value };
             });
             const byId = new Map(boxes.map((r) => [r.id, r]));
             let overlaps = 0;
             boxes.forEach((a, i) => boxes.slice(i + 1).forEach((b) => {
               if (a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h) overlaps++;
             }));
             let upward = 0;
             const through = [];
             for (const p of svg.querySelectorAll('path.wf-edge')) {
               const from = byId.get(p.dataset.from), to = byId.get(p.dataset.to);
               if (!(from.y + from.h < to.y)) upward++;
               const len = p.getTotalLength();
               outer: for (let at = 0; at <= len; at += 3) {
                 const pt = p.getPointAtLength(at);
                 for (const r of boxes) {
                   if (r === from || r === to) continue;
                   if (pt.x > r.x + 1 && pt.x < r.x + r.w - 1 && pt.y > r.y + 1 && pt.y < r.y + r.h - 1) {
                     through.push(`${from.name}->${to.name} through ${r.name}`);
                     break outer;
                   }
                 }
               }
             }
             const canvas = document.querySelector('#wf-canvas');
             const rowsOf = (re) => new Set(boxes.filter((r) => re.test(r.name || '')).map((r) => r.y)).size;
             return { overlaps, upward, through, scrolls: canvas.scrollWidth > canvas.clientWidth,
               c_rows: rowsOf(/^c[0-9]+$/), external: svg.querySelectorAll('g.wf-ext').length };",
            vec![],
        )
        .await
        .expect("read the layout")
}

fn node<'a>(d: &'a Value, name: &str) -> &'a Value {
    d["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["name"] == name))
        .unwrap_or_else(|| panic!("no box for {name} in {d}"))
}

#[tokio::test]
async fn the_console_draws_a_graph_and_a_batch_with_their_final_states() {
    let db = TestDb::new("ui_workflows").await;
    let config = write_config(&db, "node.json", json!({}));
    db.insert_queue("w", "echo", 4).await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "ui-wf-node");
    // Eight tasks in four layers; `bad` fails, so `after_bad` is cancelled.
    let t = |name: &str, deps: &[&str], params: Value| json!({"name": name, "queue": "w", "depends_on": deps, "params": params});
    let ok = json!({});
    let (s, made) = dci
        .post(
            "/graphs",
            json!({"tasks": [
                t("root", &[], ok.clone()),
                t("fetch_a", &["root"], ok.clone()),
                t("fetch_b", &["root"], ok.clone()),
                t("fetch_c", &["root"], ok.clone()),
                t("parse_a", &["fetch_a"], ok.clone()),
                t("bad", &["fetch_b"], json!({"exit_code": 1})),
                t("after_bad", &["bad"], ok.clone()),
                t("report", &["fetch_c", "parse_a"], ok.clone()),
            ]}),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let graph = made["graph"].as_str().expect("graph id").to_string();

    let b = Browser::start(1280, 900).await;
    b.record_csp_violations().await;
    check_the_graph_is_drawn_with_its_final_states(&dci, &b, &graph, &made).await;

    check_a_wide_graph_wraps_into_rows_and_scrolls(&db, &dci, &b, &made).await;

    let id = check_a_batch_and_its_callback_are_drawn(&dci, &b).await;

    // The list links to both.
    b.open(&format!("{}/#/workflows", dci.url), "workflows")
        .await;
    b.wait_text("#graphs-table", "the graph listed", |t| t.contains(&graph))
        .await;
    b.wait_text("#batches-table", "the batch listed", |t| t.contains(&id))
        .await;
    b.find(&format!("#batches-table a[href=\"#/batches/{id}\"]"))
        .await;
    b.screenshot("workflows-list").await;
    assert_eq!(b.csp_violations().await, Vec::<String>::new());
    b.close().await;
    drop(den);
    drop(dci);
    db.drop().await;
}

async fn check_the_graph_is_drawn_with_its_final_states(
    dci: &Dci,
    b: &Browser,
    graph: &str,
    made: &Value,
) {
    b.open(&format!("{}/#/graphs/{graph}", dci.url), "graphs")
        .await;
    let d = final_drawing(b, "the graph's final states").await;
    assert_eq!(d["state"], "failed", "{d}");
    assert_eq!(d["nodes"].as_array().map(Vec::len), Some(8), "{d}");
    assert_eq!(d["edges"].as_array().map(Vec::len), Some(8), "{d}");
    let expect = [
        ("root", 0, "succeeded"),
        ("fetch_a", 1, "succeeded"),
        ("fetch_b", 1, "succeeded"),
        ("fetch_c", 1, "succeeded"),
        ("parse_a", 2, "succeeded"),
        ("bad", 2, "failed"),
        ("after_bad", 3, "cancelled"),
        ("report", 3, "succeeded"),
    ];
    for (name, layer, state) in expect {
        let n = node(&d, name);
        assert_eq!(n["layer"], layer, "{name}: {n}");
        assert_eq!(n["state"], state, "{name}: {n}");
        assert_eq!(n["label"], name, "the box names its task: {n}");
        assert_eq!(n["shown"], state, "the box says its state: {n}");
        let id = made["ids"][name].as_str().expect("id");
        assert_eq!(n["task"], id, "{n}");
    }
    let report = made["ids"]["report"].as_str().expect("id");
    let parse_a = made["ids"]["parse_a"].as_str().expect("id");
    assert!(
        d["edges"]
            .as_array()
            .is_some_and(|e| e.contains(&json!([parse_a, report]))),
        "an edge from the dependency to its dependent: {d}"
    );
    let counts = b
        .wait_text("#wf-counts", "the counts", |t| t.contains("1 cancelled"))
        .await;
    assert!(
        counts.contains("6 succeeded") && counts.contains("1 failed"),
        "{counts}"
    );
    assert_eq!(
        b.find("#wf-state").await.text().await.ok().as_deref(),
        Some("failed")
    );
    let reasons = b
        .wait_text("#wf-tasks", "the task table", |t| t.contains("after_bad"))
        .await;
    let bad = made["ids"]["bad"].as_str().expect("id");
    assert!(
        reasons.contains(bad),
        "the cancel reason is listed: {reasons}"
    );
    let lay = layout(b).await;
    assert_eq!(lay["overlaps"], 0, "{lay}");
    assert_eq!(lay["upward"], 0, "{lay}");
    assert_eq!(
        lay["through"],
        json!([]),
        "report's edge from fetch_c skirts bad: {lay}"
    );
    let shot = b.screenshot("workflows-graph").await;
    assert!(shot.exists());
}

async fn check_a_wide_graph_wraps_into_rows_and_scrolls(
    db: &TestDb,
    dci: &Dci,
    b: &Browser,
    made: &Value,
) {
    // 50 tasks on a paused queue, one waiting on a task outside the graph: the 24-wide layer
    // wraps into rows, the drawing scrolls, and no edge runs behind a box.
    db.insert_queue("paused", "echo", 0).await;
    let outside = made["ids"]["root"].as_str().expect("id");
    let mut wide = vec![json!({"name": "split", "queue": "paused", "depends_on": [outside]})];
    let mut edges = 1;
    let mut add = |name: String, deps: Vec<String>| {
        edges += deps.len();
        wide.push(json!({"name": name, "queue": "paused", "depends_on": deps}));
    };
    for i in 0..10 {
        add(format!("a{i}"), vec!["split".into()]);
        add(format!("b{i}"), vec![format!("a{i}")]);
    }
    add("top".into(), (0..10).map(|i| format!("b{i}")).collect());
    add("left".into(), vec!["top".into()]);
    add("right".into(), vec!["top".into()]);
    add("bottom".into(), vec!["left".into(), "right".into()]);
    for i in 0..24 {
        add(format!("c{i}"), vec!["bottom".into()]);
    }
    add("merge".into(), (0..24).map(|i| format!("c{i}")).collect());
    let (s, big) = dci.post("/graphs", json!({"tasks": wide})).await;
    assert_eq!(s, 200, "{big}");
    let big_id = big["graph"].as_str().expect("graph id");
    b.open(&format!("{}/#/graphs/{big_id}", dci.url), "graphs")
        .await;
    let d = drawing(b).await;
    assert_eq!(d["state"], "active", "{d}");
    assert_eq!(d["nodes"].as_array().map(Vec::len), Some(50), "{d}");
    assert_eq!(d["edges"].as_array().map(Vec::len), Some(edges), "{d}");
    assert_eq!(node(&d, "split")["state"], "queued", "{d}");
    assert_eq!(node(&d, "merge")["state"], "blocked", "{d}");
    assert_eq!(node(&d, "merge")["layer"], 8, "{d}");
    assert_eq!(node(&d, "merge")["shown"], "blocked · waits on 24", "{d}");
    let lay = layout(b).await;
    assert_eq!(lay["external"], 1, "{lay}");
    assert_eq!(lay["c_rows"], 3, "24 tasks in rows of 8: {lay}");
    assert_eq!(lay["overlaps"], 0, "{lay}");
    assert_eq!(lay["upward"], 0, "{lay}");
    assert_eq!(lay["through"], json!([]), "{lay}");
    assert_eq!(lay["scrolls"], true, "{lay}");
    b.screenshot("workflows-graph-wide").await;
}

async fn check_a_batch_and_its_callback_are_drawn(dci: &Dci, b: &Browser) -> String {
    // A batch: five members, one failing, and a callback that runs after them all.
    let members: Vec<Value> = (0..5)
        .map(|i| {
            let params = if i == 2 {
                json!({"exit_code": 1})
            } else {
                json!({"n": i})
            };
            json!({"queue": "w", "params": params})
        })
        .collect();
    let (s, batch) = dci
        .post(
            "/batches",
            json!({"tasks": members, "callback": {"queue": "w"}}),
        )
        .await;
    assert_eq!(s, 200, "{batch}");
    let id = batch["batch"].as_str().expect("batch id").to_string();
    let callback = batch["callback"].as_str().expect("callback id").to_string();
    b.open(&format!("{}/#/batches/{id}", dci.url), "batches")
        .await;
    let d = final_drawing(b, "the batch's final states").await;
    assert_eq!(d["state"], "failed", "{d}");
    let nodes = d["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 6, "five members and the callback: {d}");
    let edges = d["edges"].as_array().expect("edges");
    assert_eq!(edges.len(), 5, "{d}");
    assert!(edges.iter().all(|e| e[1] == callback.as_str()), "{d}");
    let cb: Vec<&Value> = nodes.iter().filter(|n| n["callback"] == true).collect();
    assert_eq!(cb.len(), 1, "{d}");
    assert_eq!(cb[0]["task"], callback.as_str());
    assert_eq!(cb[0]["state"], "succeeded", "the callback ran: {d}");
    let failed = nodes.iter().filter(|n| n["state"] == "failed").count();
    assert_eq!(failed, 1, "{d}");
    b.wait_text("#wf-counts", "the batch counts", |t| {
        t.contains("4 succeeded") && t.contains("1 failed")
    })
    .await;
    b.screenshot("workflows-batch").await;
    id
}
