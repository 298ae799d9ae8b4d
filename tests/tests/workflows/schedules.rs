//! Cron schedules on queues: the API refuses bad ones, the maintenance leader enqueues one task
//! per tick (never two, whichever leader tries), missed ticks follow the queue's policy, and a
//! pause passes ticks over without a flood on resume.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::{wait_for, write_config, Browser, Dci, Den, TestDb};
use futures::TryStreamExt;
use serde_json::{json, Value};

async fn queue_named(db: &TestDb, name: &str) -> Option<Document> {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("read queue")
}

async fn queue_by_id(db: &TestDb, id: ObjectId) -> Document {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"_id": id})
        .await
        .expect("read queue")
        .expect("the queue")
}

/// The queue's settled tick, in ms (`schedule_last`), once its schedule has started.
async fn settled(db: &TestDb, id: ObjectId) -> Option<i64> {
    let q = queue_by_id(db, id).await;
    q.get_datetime("schedule_last")
        .ok()
        .map(|d| d.timestamp_millis())
}

/// The queue's scheduled tasks as (tick ms, `schedule_missed_ticks`), by tick.
async fn scheduled(db: &TestDb, queue: ObjectId) -> Vec<(i64, Option<i64>)> {
    let mut out: Vec<(i64, Option<i64>)> = db
        .tasks()
        .find(doc! {"queue": queue, "schedule_tick": {"$exists": true}})
        .await
        .expect("find tasks")
        .try_collect::<Vec<Document>>()
        .await
        .expect("read tasks")
        .iter()
        .map(|t| {
            let tick = t.get_datetime("schedule_tick").expect("a date");
            (
                tick.timestamp_millis(),
                t.get_i64("schedule_missed_ticks").ok(),
            )
        })
        .collect();
    out.sort();
    out
}

fn now_ms() -> i64 {
    DateTime::now().timestamp_millis()
}

/// The maintenance leader while its lease runs, and when that lease ends (ms).
async fn leader_lease(db: &TestDb) -> Option<(String, i64)> {
    let lease = db
        .db
        .collection::<Document>("leases")
        .find_one(doc! {"_id": "maintenance"})
        .await
        .expect("lease")?;
    let until = lease.get_datetime("until").ok()?.timestamp_millis();
    let owner = lease.get_str("owner").ok()?.to_string();
    (until > now_ms()).then_some((owner, until))
}

/// The maintenance leader while its lease runs.
async fn leader(db: &TestDb) -> Option<String> {
    leader_lease(db).await.map(|(owner, _)| owner)
}

async fn wait_leader(db: &TestDb, not: Option<&str>) -> String {
    let found = std::cell::RefCell::new(None);
    wait_for("a maintenance leader", Duration::from_secs(60), || async {
        let l = leader(db).await.filter(|l| Some(l.as_str()) != not);
        let some = l.is_some();
        *found.borrow_mut() = l;
        some
    })
    .await;
    found.into_inner().expect("a leader")
}

fn error_text(body: &Value) -> String {
    body["error"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn bad_schedules_are_refused_with_400_and_nothing_is_stored() {
    let db = TestDb::new("schedules_api").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    let base = json!({"name": "cron", "plugin": "echo", "threads": 1});
    let with = |extra: Value| {
        let mut body = base.clone();
        if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
            b.extend(extra);
        }
        body
    };
    for (extra, needle) in [
        (json!({"schedule": "every minute"}), "schedule"),
        (json!({"schedule": "61 * * * *"}), "schedule"),
        (json!({"schedule": "0 0 30 2 *"}), "never fires"),
        (json!({"schedule": 5}), "schedule must be a string"),
        (
            json!({"schedule": "* * * * *", "schedule_tz": "Mars/Olympus_Mons"}),
            "schedule_tz",
        ),
        (
            json!({"schedule": "* * * * *", "schedule_missed": "twice"}),
            "schedule_missed",
        ),
        (
            json!({"schedule": "* * * * *", "schedule_params": [1]}),
            "schedule_params",
        ),
    ] {
        let (status, body) = dci.post("/queues", with(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {body}");
        assert!(error_text(&body).contains(needle), "{extra}: {body}");
        assert!(queue_named(&db, "cron").await.is_none(), "{extra} stored");
    }

    let (status, body) = dci
        .post(
            "/queues",
            with(
                json!({"schedule": "*/5 * * * *", "schedule_tz": "America/New_York",
                        "schedule_params": {"report": "hourly"}, "schedule_missed": "once"}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let stored = queue_named(&db, "cron").await.expect("created");
    assert_eq!(stored.get_str("schedule").ok(), Some("*/5 * * * *"));
    assert_eq!(stored.get_str("schedule_tz").ok(), Some("America/New_York"));
    assert_eq!(stored.get_str("schedule_missed").ok(), Some("once"));
    assert_eq!(
        stored.get_document("schedule_params").ok(),
        Some(&doc! {"report": "hourly"})
    );
    let (_, row) = dci.get("/queues/cron").await;
    assert_eq!(row["schedule"], "*/5 * * * *", "{row}");
    assert_eq!(row["schedule_params"], json!({"report": "hourly"}), "{row}");

    for (update, needle) in [
        (json!({"schedule": "* * *"}), "schedule"),
        (json!({"schedule_tz": "Nowhere"}), "schedule_tz"),
        (json!({"schedule_missed": 1}), "schedule_missed"),
        (json!({"schedule_params": "soon"}), "schedule_params"),
    ] {
        let (status, body) = dci.post("/queues/cron", update.clone()).await;
        assert_eq!(status, 400, "{update}: {body}");
        assert!(error_text(&body).contains(needle), "{update}: {body}");
    }
    assert_eq!(
        queue_named(&db, "cron").await.expect("kept"),
        stored,
        "refused updates change nothing"
    );

    // Removing the schedule removes the leader's record of it too: set again, it starts anew.
    let id = stored.get_object_id("_id").expect("id");
    db.set_queue(
        id,
        doc! {"schedule_last": DateTime::now(), "schedule_basis": "x"},
    )
    .await;
    let (status, body) = dci.post("/queues/cron", json!({"schedule": null})).await;
    assert_eq!(status, 200, "{body}");
    let q = queue_by_id(&db, id).await;
    for gone in ["schedule", "schedule_last", "schedule_basis"] {
        assert!(!q.contains_key(gone), "{gone} left in {q}");
    }
    assert_eq!(
        q.get_str("schedule_tz").ok(),
        Some("America/New_York"),
        "only what was sent is removed"
    );

    // Work specs: checked before anything is written; a reload without it removes it.
    let (status, body) = dci
        .post(
            "/specs",
            json!({"specs": [{"name": "ok", "plugin": "echo", "schedule": "@hourly"},
                             {"name": "bad", "plugin": "echo", "schedule": "0 0 30 2 *"}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error_text(&body).starts_with("specs[1]: schedule"),
        "{body}"
    );
    assert!(queue_named(&db, "ok").await.is_none() && queue_named(&db, "bad").await.is_none());
    let spec = json!({"name": "ok", "plugin": "echo", "schedule": "@hourly", "schedule_tz": "Europe/Paris"});
    let (status, body) = dci.post("/specs", json!({"specs": [spec]})).await;
    assert_eq!(status, 200, "{body}");
    let q = queue_named(&db, "ok").await.expect("loaded");
    assert_eq!(q.get_str("schedule").ok(), Some("@hourly"));
    assert_eq!(q.get_str("schedule_tz").ok(), Some("Europe/Paris"));
    let (status, body) = dci
        .post(
            "/specs",
            json!({"specs": [{"name": "ok", "plugin": "echo"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let q = queue_named(&db, "ok").await.expect("reloaded");
    assert!(
        !q.contains_key("schedule") && !q.contains_key("schedule_tz"),
        "{q}"
    );
    drop(dci);
    db.drop().await;
}

/// The line of `queues` output naming queue `name` (its third column).
fn cli_line<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().nth(2) == Some(name))
        .unwrap_or_else(|| panic!("no line for {name} in\n{out}"))
}

#[tokio::test]
async fn scheduled_queues_are_marked_with_their_next_tick_in_utc_and_their_zone() {
    let db = TestDb::new("schedules_shown").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    let (status, body) = dci
        .post(
            "/queues",
            json!({"name": "plain", "plugin": "echo", "threads": 1}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // A fleet without schedules keeps Disbatch's table.
    let o = dci.cli(&["queues"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success() && !out.contains("Next tick"), "{out}");

    // Asia/Kolkata has no DST: 09:00 there is 03:30 UTC on every day.
    let cron = json!({"name": "daily", "plugin": "echo", "threads": 1,
                      "schedule": "0 9 * * *", "schedule_tz": "Asia/Kolkata"});
    let (status, body) = dci.post("/queues", cron).await;
    assert_eq!(status, 200, "{body}");
    let paused =
        json!({"name": "quarter", "plugin": "echo", "threads": 0, "schedule": "*/15 * * * *"});
    let (status, body) = dci.post("/queues", paused).await;
    assert_eq!(status, 200, "{body}");
    // Written by hand past the API: the leader skips it, and the list says why.
    let bad = db.insert_queue("handmade", "echo", 1).await;
    db.set_queue(bad, doc! {"schedule": "every minute"}).await;

    let (status, rows) = dci.get("/queues").await;
    assert_eq!(status, 200, "{rows}");
    let row = |name: &str| {
        rows.as_array()
            .and_then(|a| a.iter().find(|r| r["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no row {name} in {rows}"))
    };
    let daily = row("daily");
    assert_eq!(daily["scheduled"], true, "{daily}");
    let next = &daily["schedule_next"];
    let utc = next["utc"].as_str().unwrap_or_default();
    let local = next["local"].as_str().unwrap_or_default();
    assert!(utc.ends_with("T03:30:00Z"), "{daily}");
    assert!(local.ends_with("T09:00:00+05:30"), "{daily}");
    assert_eq!(next["zone"], "Asia/Kolkata", "{daily}");
    // The next tick, not a past one: within the coming day.
    let tick = DateTime::parse_rfc3339_str(utc).expect("an RFC 3339 date");
    let ahead = tick.timestamp_millis() - now_ms();
    assert!(
        ahead > 0 && ahead <= 86_400_000 + 60_000,
        "{utc} is {ahead} ms ahead"
    );
    let quarter = row("quarter");
    let q_utc = quarter["schedule_next"]["utc"].as_str().unwrap_or_default();
    assert!(
        [":00:00Z", ":15:00Z", ":30:00Z", ":45:00Z"]
            .iter()
            .any(|m| q_utc.ends_with(m)),
        "{quarter}"
    );
    assert_eq!(quarter["schedule_next"]["zone"], "UTC", "{quarter}");
    let plain = row("plain");
    for absent in ["scheduled", "schedule_next", "schedule_error"] {
        assert!(plain.get(absent).is_none(), "{absent} on {plain}");
    }
    let handmade = row("handmade");
    assert_eq!(handmade["scheduled"], true, "{handmade}");
    assert!(
        handmade["schedule_error"]
            .as_str()
            .unwrap_or_default()
            .contains("schedule"),
        "{handmade}"
    );
    assert!(handmade.get("schedule_next").is_none(), "{handmade}");
    let (_, one) = dci.get("/queues/daily").await;
    assert_eq!(one["schedule_next"], daily["schedule_next"], "{one}");

    let o = dci.cli(&["queues"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{out}");
    assert!(
        out.lines().next().unwrap_or_default().contains("Next tick"),
        "{out}"
    );
    let line = cli_line(&out, "daily");
    assert!(
        line.contains(&format!("{utc} ({local} Asia/Kolkata)")) && !line.contains("paused"),
        "{line}"
    );
    assert!(cli_line(&out, "quarter")
        .trim_end()
        .ends_with(&format!("{q_utc} [paused: ticks pass]")));
    assert!(
        cli_line(&out, "handmade").contains("invalid: schedule"),
        "{out}"
    );
    assert!(!cli_line(&out, "plain").contains('Z'), "{out}");

    let b = Browser::start(1280, 900).await;
    b.open(&format!("{}/#/queues", dci.url), "queues").await;
    let shown = b
        .wait_text(
            "tr[data-queue=\"daily\"] .schedule-next",
            "daily's next tick",
            |t| !t.is_empty(),
        )
        .await;
    assert!(
        shown.contains("03:30:00 UTC") && shown.contains("09:00:00 Asia/Kolkata"),
        "{shown}"
    );
    let shown = b
        .find("tr[data-queue=\"quarter\"] .schedule-next")
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        shown.contains(" UTC") && shown.contains("paused"),
        "{shown}"
    );
    let shown = b
        .find("tr[data-queue=\"handmade\"] .schedule-next")
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(shown.contains("schedule not run"), "{shown}");
    assert!(
        b.client
            .find(fantoccini::Locator::Css(
                "tr[data-queue=\"plain\"] .schedule-next"
            ))
            .await
            .is_err(),
        "an unscheduled queue is not marked"
    );
    b.screenshot("queues-scheduled").await;
    b.close().await;
    drop(dci);
    db.drop().await;
}

/// The scenario's length, and how often the maintenance leader is killed within it.
const RUN: Duration = Duration::from_secs(120);
const KILL_EVERY: Duration = Duration::from_secs(20);
/// A tick the killed leader had not reached yet may be missed: a pass and the grace before it.
const BEFORE_KILL_MS: i64 = 3_000;
/// The schedule's period, and the nodes' pass.
const TICK_MS: i64 = 2_000;
const LOOP_MS: u64 = 500;
/// A leader is killed only with this much of its lease left: no other node can lead before
/// the lease ends, so the gap outlasts the grace by more than a tick and misses one for sure.
/// (A leader whose renewal came late under load may hold less; the kill then waits for it.)
const LEFT_AT_KILL_MS: i64 = 5_500;

#[tokio::test]
async fn every_two_seconds_for_two_minutes_each_tick_once_while_leaders_are_killed() {
    let db = TestDb::new("schedules_kills").await;
    // Half-second passes: the maintenance lease lasts 7.5 s (15 passes), renewed every 2.5 s,
    // and a tick is on time within 2.5 s (5 passes): a dead leader's gap misses ticks.
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": LOOP_MS}));
    let queue = db.insert_queue("every2s", "echo", 4).await;
    let mut dens: Vec<Den> = (1..=3)
        .map(|i| Den::start(&config, &format!("n{i}")))
        .collect();
    wait_leader(&db, None).await;
    let set_at = now_ms();
    db.set_queue(
        queue,
        doc! {"schedule": "*/2 * * * * *", "schedule_missed": "once"},
    )
    .await;
    wait_for("the first tick", Duration::from_secs(60), || async {
        !scheduled(&db, queue).await.is_empty()
    })
    .await;
    // The first tick after the leader started the schedule: none before it is owed.
    let first = scheduled(&db, queue).await[0].0;
    assert!(
        first > set_at,
        "tick {first} is older than the schedule ({set_at}): a backfill"
    );
    let began = Instant::now();
    // Per kill: when it happened and when the test first saw the next leader (ms).
    let mut gaps: Vec<(i64, i64)> = Vec::new();
    // Per kill: how much of the killed leader's lease was left (ms).
    let mut left: Vec<i64> = Vec::new();
    for round in 1..=(RUN.as_secs() / KILL_EVERY.as_secs()) - 1 {
        tokio::time::sleep_until((began + KILL_EVERY * round as u32).into()).await;
        let leading = wait_leader(&db, None).await;
        // Killed only once it has led: a tick enqueued since it was seen leading.
        let since = gaps.last().map_or(first, |g| g.1);
        wait_for(
            "the leader's first tick",
            Duration::from_secs(30),
            || async {
                scheduled(&db, queue)
                    .await
                    .last()
                    .is_some_and(|t| t.0 > since)
            },
        )
        .await;
        // Right after a renewal, so the gap's length is the lease's doing, not the load's.
        let until = std::cell::Cell::new(0);
        wait_for(
            "the leader to renew its lease",
            Duration::from_secs(30),
            || async {
                let lease = leader_lease(&db).await;
                let renewed =
                    lease.filter(|(owner, u)| *owner == leading && u - now_ms() >= LEFT_AT_KILL_MS);
                until.set(renewed.as_ref().map_or(0, |(_, u)| *u));
                renewed.is_some()
            },
        )
        .await;
        let at = dens
            .iter()
            .position(|d| d.node == leading)
            .expect("the leader is one of ours");
        dens.remove(at).kill_hard();
        let killed = now_ms();
        left.push(until.get() - killed);
        // The fleet keeps three nodes (two while this one starts).
        dens.push(Den::start(&config, &format!("r{round}")));
        let next = wait_leader(&db, Some(&leading)).await;
        let seen = now_ms();
        println!(
            "round {round}: killed leader {leading} with {} ms of its lease left; {next} leads {} ms later",
            until.get() - killed,
            seen - killed
        );
        gaps.push((killed, seen));
    }
    tokio::time::sleep_until((began + RUN).into()).await;
    let end = now_ms();
    wait_for(
        "the leader to settle the last tick",
        Duration::from_secs(30),
        || async { settled(&db, queue).await.is_some_and(|s| s >= end - 2_000) },
    )
    .await;
    let end = settled(&db, queue).await.expect("settled");

    let tasks = scheduled(&db, queue).await;
    let mut per_tick: BTreeMap<i64, Vec<Option<i64>>> = BTreeMap::new();
    for (tick, missed) in &tasks {
        per_tick.entry(*tick).or_default().push(*missed);
    }
    let doubled: Vec<_> = per_tick.iter().filter(|(_, t)| t.len() > 1).collect();
    let expected: BTreeSet<i64> = (first / 2_000..=end / 2_000).map(|t| t * 2_000).collect();
    let present: BTreeSet<i64> = per_tick.keys().copied().filter(|t| *t <= end).collect();
    let missing: Vec<i64> = expected.difference(&present).copied().collect();
    let catch_ups: Vec<(i64, i64)> = tasks
        .iter()
        .filter_map(|(tick, missed)| missed.map(|n| (*tick, n)))
        .filter(|(tick, _)| *tick <= end)
        .collect();
    println!(
        "ticks expected {}, enqueued {} ({} of them late, one per gap, each for the latest \
         tick missed past the grace), not enqueued {}, doubled {}; {} leader gaps",
        expected.len(),
        present.len(),
        catch_ups.len(),
        missing.len(),
        doubled.len(),
        gaps.len(),
    );
    println!(
        "gaps (killed, next leader seen): {gaps:?}\nnot enqueued: {missing:?}\n\
         enqueued late (tick, missed ticks it stands for): {catch_ups:?}"
    );

    assert!(doubled.is_empty(), "ticks enqueued twice: {doubled:?}");
    for tick in &present {
        assert!(tick % 2_000 == 0, "{tick} is not a tick of */2 s");
    }
    assert!(
        present.is_subset(&expected),
        "ticks off the schedule: {:?}",
        present.difference(&expected).collect::<Vec<_>>()
    );
    let gap_of = |tick: i64| {
        gaps.iter()
            .position(|(killed, seen)| (killed - BEFORE_KILL_MS..=*seen).contains(&tick))
    };
    for tick in &missing {
        assert!(
            gap_of(*tick).is_some(),
            "tick {tick} was missed outside every leader gap {gaps:?}"
        );
    }
    // "once": after each gap one task, for its latest missed tick, standing for the run of
    // missed ticks right before it; no other missed tick of the gap is enqueued. It may stand
    // for more: a tick the dead leader enqueued but had not recorded as settled counts too.
    let mut per_gap = vec![0; gaps.len()];
    for (tick, standing_for) in &catch_ups {
        let gap = gap_of(*tick)
            .unwrap_or_else(|| panic!("tick {tick} enqueued as missed outside every gap {gaps:?}"));
        per_gap[gap] += 1;
        let run = (1..)
            .map(|k| tick - 2_000 * k)
            .take_while(|t| missing.contains(t))
            .count() as i64;
        assert!(
            run < *standing_for,
            "tick {tick} stands for {standing_for} missed ticks but follows {run} missing ones"
        );
    }
    for tick in &missing {
        let mut next = tick + 2_000;
        while missing.contains(&next) {
            next += 2_000;
        }
        assert!(
            catch_ups.iter().any(|(t, _)| *t == next),
            "the run of missed ticks through {tick} is not followed by one task for the latest missed tick"
        );
    }
    // A gap whose lease outlasted the grace by more than a tick missed a tick for sure: the
    // next leader took over after the lease ended, and a tick fell between the kill and the
    // lease's end less the grace. Its task for missed ticks is there, once. A gap the load
    // made shorter may have missed none: at most one.
    let grace_ms =
        disbatch_model::schedule::grace(Duration::from_millis(LOOP_MS)).as_millis() as i64;
    let sure: Vec<bool> = left.iter().map(|l| l - grace_ms > TICK_MS).collect();
    println!("lease left at each kill (ms): {left:?}; tasks for missed ticks per gap: {per_gap:?}");
    for (gap, n) in per_gap.iter().enumerate() {
        let want = if sure[gap] { 1..=1 } else { 0..=1 };
        assert!(
            want.contains(n),
            "gap {gap} (lease left {} ms at the kill) has {n} tasks for missed ticks, not {want:?}",
            left[gap]
        );
    }
    assert!(
        sure.iter().filter(|s| **s).count() >= 3,
        "too few kills with their lease left to prove the policy: {left:?}"
    );
    drop(dens);
    db.drop().await;
}

/// A DEN's count of `queue`'s ticks with `outcome`.
async fn ticks(den: &Den, queue: &str, outcome: &str) -> f64 {
    den.metric(&format!(
        "disbatch_den_schedule_ticks_total{{outcome=\"{outcome}\",queue=\"{queue}\"}}"
    ))
    .await
}

#[tokio::test]
async fn a_pause_passes_ticks_over_and_a_resume_does_not_flood() {
    let db = TestDb::new("schedules_pause").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let (status, body) = dci
        .post(
            "/queues",
            json!({"name": "cron", "plugin": "echo", "threads": 2,
                   "schedule": "* * * * * *", "schedule_missed": "once"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let queue = queue_named(&db, "cron")
        .await
        .and_then(|q| q.get_object_id("_id").ok())
        .expect("queue");
    let den = Den::start(&config, "n1");
    wait_for("two ticks enqueued", Duration::from_secs(60), || async {
        scheduled(&db, queue).await.len() >= 2
    })
    .await;

    let (status, body) = dci.post("/queues/cron/pause", json!({})).await;
    assert_eq!(status, 200, "{body}");
    // Once the leader has passed ticks over, nothing more is enqueued while paused.
    wait_for("a tick passed over", Duration::from_secs(30), || async {
        ticks(&den, "cron", "paused").await >= 1.0
    })
    .await;
    let before = scheduled(&db, queue).await;
    let passed = ticks(&den, "cron", "paused").await;
    wait_for(
        "three more ticks passed over",
        Duration::from_secs(30),
        || {
            let den = &den;
            async move { ticks(den, "cron", "paused").await >= passed + 3.0 }
        },
    )
    .await;
    assert_eq!(
        scheduled(&db, queue).await,
        before,
        "no task while the queue is paused"
    );

    let last_paused = settled(&db, queue).await.expect("settled while paused");
    let (status, body) = dci.post("/queues/cron/resume", json!({})).await;
    assert_eq!(status, 200, "{body}");
    wait_for(
        "two ticks after the resume",
        Duration::from_secs(30),
        || async { scheduled(&db, queue).await.len() >= before.len() + 2 },
    )
    .await;
    let after = scheduled(&db, queue).await;
    let new: Vec<_> = after.iter().filter(|t| !before.contains(t)).collect();
    for (tick, missed) in &new {
        assert!(
            *tick > last_paused,
            "tick {tick}, passed over while paused (through {last_paused}), was enqueued: {new:?}"
        );
        assert_eq!(*missed, None, "a resume is no gap: {new:?}");
    }
    drop(den);
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn a_bad_schedule_written_by_hand_is_skipped_once_and_the_others_run() {
    let db = TestDb::new("schedules_bad").await;
    let config = write_config(&db, "node.json", json!({}));
    let bad = db.insert_queue("bad", "echo", 1).await;
    db.set_queue(bad, doc! {"schedule": "every minute please"})
        .await;
    let bad_zone = db.insert_queue("bad_zone", "echo", 1).await;
    db.set_queue(
        bad_zone,
        doc! {"schedule": "* * * * * *", "schedule_tz": "Mars/Base", "schedule_params": Bson::Int32(3)},
    )
    .await;
    let good = db.insert_queue("good", "echo", 1).await;
    db.set_queue(
        good,
        doc! {"schedule": "* * * * * *", "schedule_params": {"from": "cron"}},
    )
    .await;
    let den = Den::start(&config, "n1");
    wait_for(
        "three ticks of the good queue",
        Duration::from_secs(60),
        || async { scheduled(&db, good).await.len() >= 3 },
    )
    .await;
    let task = db
        .tasks()
        .find_one(doc! {"queue": good, "schedule_tick": {"$exists": true}})
        .await
        .expect("find")
        .expect("a task");
    assert_eq!(
        task.get_document("params").ok(),
        Some(&doc! {"from": "cron"})
    );
    // Many passes later, each bad schedule was logged once, and is counted.
    let passes = den.passes().await;
    wait_for("20 more passes", Duration::from_secs(60), || {
        let den = &den;
        async move { den.passes().await >= passes + 20.0 }
    })
    .await;
    assert_eq!(den.metric("disbatch_den_schedules_invalid").await, 2.0);
    let log = den.log_text();
    for (id, why) in [(bad, "every minute please"), (bad_zone, "schedule_params")] {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("schedule skipped") && l.contains(&id.to_hex()))
            .collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains(why), "{lines:?}");
        assert_eq!(
            db.count(doc! {"queue": id}).await,
            0,
            "no task for a bad schedule"
        );
    }
    assert!(!log.contains("panicked"), "{log}");
    // Mended by hand, it starts from then.
    db.set_queue(bad, doc! {"schedule": "* * * * * *"}).await;
    wait_for(
        "the mended schedule's first tick",
        Duration::from_secs(30),
        || async { !scheduled(&db, bad).await.is_empty() },
    )
    .await;
    drop(den);
    db.drop().await;
}
