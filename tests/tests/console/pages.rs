//! The operator console in headless Chromium: real pages, a real DCI, DEN and server.
//! Screenshots of every page land in `<target>/ui-screenshots/`.

use std::path::Path;
use std::time::Duration;

use bson::doc;
use bson::oid::ObjectId;
use disbatch_model::status;
use disbatch_tests::{wait_for, write_config, Browser, Dci, Den, TestDb};
use serde_json::json;

const ENTER: &str = "\u{E007}";

async fn queue_doc(db: &TestDb, name: &str) -> Option<bson::Document> {
    db.db
        .collection::<bson::Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("find")
}

/// Nothing the console did was blocked by its Content-Security-Policy, its stylesheet
/// applies, and the policy is in force: an inline script is blocked and reported.
async fn runs_under_its_csp(b: &Browser) {
    assert_eq!(b.csp_violations().await, Vec::<String>::new());
    let styled = b
        .client
        .execute(
            "return [...document.styleSheets].some((s) => s.cssRules.length > 0)",
            vec![],
        )
        .await
        .expect("stylesheets");
    assert_eq!(styled, json!(true), "the console's stylesheet applies");
    b.client
        .execute(
            "const s = document.createElement('script'); s.textContent = 'window.__inline = 1'; \
             document.head.appendChild(s); return null",
            vec![],
        )
        .await
        .expect("inline script");
    wait_for(
        "the inline script's violation",
        Duration::from_secs(30),
        || async {
            b.csp_violations()
                .await
                .iter()
                .any(|v| v.starts_with("script-src"))
        },
    )
    .await;
    let ran = b
        .client
        .execute("return window.__inline === 1", vec![])
        .await
        .expect("inline result");
    assert_eq!(ran, json!(false), "an inline script ran despite the policy");
}

#[tokio::test]
async fn an_operator_creates_a_queue_runs_it_and_manages_tasks_from_the_console() {
    let db = TestDb::new("ui_flow").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let b = Browser::start(1280, 800).await;
    b.record_csp_violations().await;
    b.open(&format!("{}/", dci.url), "queues").await;

    let queue = check_a_bad_name_is_refused_and_a_paused_queue_created(&db, &b).await;

    // Each task runs until the test opens this gate, so the page can be watched part-way.
    let gate = db.path("console.gate");
    let ids = db
        .insert_tasks(
            queue,
            (0..16)
                .map(|i| doc! {"i": i, "hold_until": gate.to_string_lossy().to_string()}.into())
                .collect(),
        )
        .await;
    let den = Den::start(&config, "n1");
    b.wait_text("tr[data-queue=\"console\"] .queued", "queued count", |t| {
        t.trim() == "16"
    })
    .await;

    check_cancel_of_a_queued_task_from_the_tasks_page(&db, &dci, &b, &ids).await;

    check_threads_set_inline_and_the_counts_as_the_queue_drains(&db, &dci, &b, &gate).await;

    check_the_task_nodes_and_balance_pages(&db, &dci, &b, &ids).await;
    runs_under_its_csp(&b).await;

    drop(den);
    b.close().await;
    db.drop().await;
}

async fn check_a_bad_name_is_refused_and_a_paused_queue_created(
    db: &TestDb,
    b: &Browser,
) -> ObjectId {
    // Bad input is refused in the page with a visible message, and nothing is created.
    b.find("#new-queue-name")
        .await
        .send_keys("bad name!")
        .await
        .expect("type");
    b.find("#new-queue-submit")
        .await
        .click()
        .await
        .expect("submit");
    let msg = b
        .wait_text("#new-queue-msg", "validation message", |t| !t.is_empty())
        .await;
    assert!(
        b.find("#new-queue-msg.error")
            .await
            .is_displayed()
            .await
            .unwrap_or(false),
        "{msg}"
    );
    b.screenshot("queues-bad-input").await;
    assert!(queue_doc(db, "bad name!").await.is_none());

    // Create a paused queue through the form.
    let name = b.find("#new-queue-name").await;
    name.clear().await.expect("clear");
    name.send_keys("console").await.expect("type");
    b.select_option("#new-queue-plugin", "echo").await;
    b.find("#new-queue-threads")
        .await
        .send_keys("0")
        .await
        .expect("type");
    b.find("#new-queue-submit")
        .await
        .click()
        .await
        .expect("submit");
    b.find("tr[data-queue=\"console\"]").await;
    let stored = queue_doc(db, "console")
        .await
        .expect("queue created through the page");
    let queue: ObjectId = stored.get_object_id("_id").expect("id");
    assert_eq!(stored.get_i64("threads").ok(), Some(0));
    queue
}

async fn check_cancel_of_a_queued_task_from_the_tasks_page(
    db: &TestDb,
    dci: &Dci,
    b: &Browser,
    ids: &[ObjectId],
) {
    // Cancel one queued task from the Tasks page.
    b.open(&format!("{}/#/tasks", dci.url), "tasks").await;
    b.select_option("#search-queue", "console").await;
    b.find("#search-submit")
        .await
        .click()
        .await
        .expect("search");
    b.wait_text("#task-count", "task count", |t| t.contains("16"))
        .await;
    let victim = ids[15];
    b.find(&format!(
        "tr[data-task=\"{}\"] button.cancel",
        victim.to_hex()
    ))
    .await
    .click()
    .await
    .expect("cancel");
    wait_for(
        "the task to be cancelled",
        Duration::from_secs(30),
        || async { db.task(victim).await.get_i32("status").ok() == Some(status::CANCELLED) },
    )
    .await;
    b.screenshot("tasks").await;
}

async fn check_threads_set_inline_and_the_counts_as_the_queue_drains(
    db: &TestDb,
    dci: &Dci,
    b: &Browser,
    gate: &Path,
) {
    // Set threads inline and watch the node drain the queue as the counts change.
    b.open(&format!("{}/#/queues", dci.url), "queues").await;
    let threads = b.find("tr[data-queue=\"console\"] input.threads").await;
    threads.clear().await.expect("clear");
    threads.send_keys(&format!("2{ENTER}")).await.expect("type");
    wait_for(
        "threads 2 to be stored",
        Duration::from_secs(30),
        || async {
            queue_doc(db, "console")
                .await
                .and_then(|q| q.get_i64("threads").ok())
                == Some(2)
        },
    )
    .await;
    // Part-way: two run, held at the gate, and the page shows it without a reload.
    b.wait_text(
        "tr[data-queue=\"console\"] .running",
        "running count",
        |t| t.trim() == "2",
    )
    .await;
    b.wait_text("tr[data-queue=\"console\"] .queued", "queued count", |t| {
        t.trim() == "13"
    })
    .await;
    std::fs::write(gate, "").expect("open the gate");
    let text = b
        .wait_text(
            "tr[data-queue=\"console\"] .succeeded",
            "succeeded count",
            |t| t.trim() == "15",
        )
        .await;
    assert_eq!(text.trim(), "15");
    b.screenshot("queues").await;
}

async fn check_the_task_nodes_and_balance_pages(
    db: &TestDb,
    dci: &Dci,
    b: &Browser,
    ids: &[ObjectId],
) {
    // Open a task and read its stdout (the echo plugin prints its params).
    b.open(&format!("{}/#/task/{}", dci.url, ids[3].to_hex()), "task")
        .await;
    let stdout = b
        .wait_text("#task-stdout", "task stdout", |t| t.contains("hold_until"))
        .await;
    assert!(stdout.contains("\"i\":3"), "{stdout}");
    b.wait_text("#task-status", "task status", |t| t.contains("succeeded"))
        .await;
    b.screenshot("task").await;

    // Nodes: the DEN shows as live; maxthreads is editable.
    b.open(&format!("{}/#/nodes", dci.url), "nodes").await;
    b.wait_text("tr[data-node=\"n1\"]", "live node", |t| t.contains("live"))
        .await;
    let max = b.find("tr[data-node=\"n1\"] input.maxthreads").await;
    max.send_keys(&format!("5{ENTER}")).await.expect("type");
    wait_for("maxthreads 5", Duration::from_secs(30), || async {
        db.node("n1").await.get_i64("maxthreads").ok() == Some(5)
    })
    .await;
    b.screenshot("nodes").await;

    // Balance: refused input shows the reason.
    b.open(&format!("{}/#/balance", dci.url), "balance").await;
    b.find("input.bal-tier")
        .await
        .send_keys("no-such-queue")
        .await
        .expect("type");
    b.find("#balance-save").await.click().await.expect("save");
    let msg = b
        .wait_text("#balance-msg", "balance message", |t| !t.is_empty())
        .await;
    assert!(msg.contains("no-such-queue"), "{msg}");
    b.screenshot("balance").await;
}

#[tokio::test]
async fn large_output_is_paged_and_every_page_fits_a_phone() {
    let db = TestDb::new("ui_phone").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let queue = db.insert_queue("demo", "Disbatch::Plugin::Demo", 2).await;
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"commands": "ea"}.into(),
                doc! {"commands": "abc"}.into(),
            ],
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let b = Browser::start(500, 844).await;
    b.record_csp_violations().await;
    b.client.goto(&format!("{}/", dci.url)).await.expect("open");
    b.emulate_phone(390, 844).await;
    let widths = b
        .client
        .execute(
            "return [window.innerWidth, document.documentElement.clientWidth, screen.width]",
            vec![],
        )
        .await
        .expect("width");
    assert_eq!(
        widths,
        json!([390, 390, 390]),
        "the page is laid out at phone width"
    );

    b.open(&format!("{}/#/task/{}", dci.url, ids[0].to_hex()), "task")
        .await;
    let range = b
        .wait_text(
            "section.output-panel[data-stream=\"stdout\"] .range",
            "range",
            |t| t.contains("15728671"),
        )
        .await;
    assert!(
        range.contains("showing bytes 0–65536"),
        "only the first page is loaded: {range}"
    );
    let shown = b
        .find("#task-stdout")
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(shown.len() <= 65536, "the page holds {} bytes", shown.len());
    b.find("section.output-panel[data-stream=\"stdout\"] button.newer")
        .await
        .click()
        .await
        .expect("next page");
    b.wait_text(
        "section.output-panel[data-stream=\"stdout\"] .range",
        "second page",
        |t| t.contains("showing bytes 65536–"),
    )
    .await;
    b.screenshot("phone-task-gridfs").await;

    b.open(&format!("{}/#/task/{}", dci.url, ids[1].to_hex()), "task")
        .await;
    b.wait_text("#task-stderr", "stderr", |t| t.contains("cherry"))
        .await;
    b.wait_text("#task-status", "failed status", |t| t.contains("failed"))
        .await;
    b.screenshot("phone-task-failed").await;
    for page in ["queues", "nodes", "tasks", "balance"] {
        b.open(&format!("{}/#/{page}", dci.url), page).await;
        b.screenshot(&format!("phone-{page}")).await;
    }
    runs_under_its_csp(&b).await;
    drop(den);
    b.close().await;
    db.drop().await;
}

/// What the page's DOM holds as text (`textContent`), for the stored-name checks.
async fn dom_texts(b: &Browser, css: &str) -> Vec<String> {
    let found = b
        .client
        .execute(
            "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent)",
            vec![json!(css)],
        )
        .await
        .expect("read the DOM");
    serde_json::from_value(found).expect("texts")
}

/// Controls (but the line feeds of a `<pre>`) and bidi characters a page must not render raw.
fn raw_hidden(text: &str) -> bool {
    text.chars().any(|c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

#[tokio::test]
async fn stored_names_show_escaped_in_the_console_and_inject_nothing() {
    let db = TestDb::new("ui_hostile_names").await;
    let config = write_config(&db, "node.json", json!({}));
    let names = [
        "esc\u{1b}[31mred".to_string(),
        "rtl\u{202e}txt.exe".to_string(),
        "nul\0name".to_string(),
        "trailing  ".to_string(),
        "<img src=x onerror=window.__pwned=1>".to_string(),
        format!("long{}", "L".repeat(100_000)),
    ];
    let mut queues = Vec::new();
    for name in &names {
        queues.push(db.insert_queue(name, "ech\u{1b}[2Jo", 1).await);
    }
    db.insert_node("node\u{202e}x", Duration::from_secs(1))
        .await;
    let task = db
        .insert_tasks(
            queues[1],
            vec![doc! {"p": "<b>bold</b>\u{202e}\u{1b}[2J", "q": &names[4]}.into()],
        )
        .await[0];
    db.set_task(task, doc! {"node": "node\u{202e}x", "status": 1})
        .await;
    let dci = Dci::start(&config);
    let b = Browser::start(1280, 800).await;

    b.open(&format!("{}/#/queues", dci.url), "queues").await;
    let links = dom_texts(&b, ".queue-link").await;
    assert_eq!(links.len(), names.len(), "{links:?}");
    assert!(!links.iter().any(|l| raw_hidden(l)), "{links:?}");
    for shown in [
        "esc\\u{1b}[31mred",
        "rtl\\u{202e}txt.exe",
        "nul\\u{0}name",
        "trailing\\u{20}\\u{20}",
        "<img src=x onerror=window.__pwned=1>",
    ] {
        assert!(links.iter().any(|l| l == shown), "{shown:?} in {links:?}");
    }
    assert!(
        links.iter().any(|l| l.ends_with("…[+99748 chars]")),
        "the long name is cut: {:?}",
        links.iter().map(|l| l.len()).collect::<Vec<_>>()
    );
    let plugins = dom_texts(&b, "select.plugin option").await;
    assert!(plugins.iter().any(|p| p == "ech\\u{1b}[2Jo"), "{plugins:?}");
    assert!(!plugins.iter().any(|p| raw_hidden(p)), "{plugins:?}");
    let injected = b
        .client
        .execute(
            "return [document.querySelectorAll('img').length, !!window.__pwned]",
            vec![],
        )
        .await
        .expect("read the DOM");
    assert_eq!(injected, json!([0, false]));
    b.screenshot("hostile-queues").await;

    b.open(&format!("{}/#/nodes", dci.url), "nodes").await;
    let nodes = dom_texts(&b, "#nodes-table td.name").await;
    assert_eq!(nodes, ["node\\u{202e}x"]);

    b.open(&format!("{}/#/tasks", dci.url), "tasks").await;
    let options = dom_texts(&b, "#search-queue option").await;
    assert!(!options.iter().any(|o| raw_hidden(o)), "{options:?}");
    assert!(
        options.iter().any(|o| o == "rtl\\u{202e}txt.exe"),
        "{options:?}"
    );

    b.open(&format!("{}/#/task/{}", dci.url, task.to_hex()), "task")
        .await;
    let queue = dom_texts(&b, "#task-queue").await.join("");
    let node = dom_texts(&b, "#task-node").await.join("");
    let params = dom_texts(&b, "#task-params").await.join("");
    assert_eq!(queue, "rtl\\u{202e}txt.exe");
    assert_eq!(node, "node\\u{202e}x");
    assert!(!raw_hidden(&params), "{params:?}");
    assert!(
        params.contains("<b>bold</b>\\u202e\\u001b[2J"),
        "params are text, bidi escaped: {params}"
    );

    // Nothing the names carried became markup or ran.
    let injected = b
        .client
        .execute(
            "return [document.querySelectorAll('img, b').length, !!window.__pwned]",
            vec![],
        )
        .await
        .expect("read the DOM");
    assert_eq!(injected, json!([0, false]));
    b.close().await;
    db.drop().await;
}
