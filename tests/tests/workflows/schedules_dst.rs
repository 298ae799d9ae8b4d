//! Clock changes through the real binaries: a database server whose clock is set (libfaketime)
//! to the minutes around New York's spring and fall changes of 2027, a node leading the
//! schedules on that clock, and the tasks it makes. One rule on both days, Vixie cron's
//! (docs/src/workflows.md, "DST"): a pattern with `*` in its minute or hour follows real time,
//! one of fixed times ticks once for each wall time.

use std::time::Duration;

use bson::{doc, DateTime, Document};
use disbatch_tests::restartable::RestartableServer;
use disbatch_tests::{wait_for, write_config, Dci, Den, TestDb};
use futures::TryStreamExt;
use serde_json::json;

const ZONE: &str = "America/New_York";

fn at(rfc3339: &str) -> DateTime {
    DateTime::parse_rfc3339_str(rfc3339).expect("an RFC 3339 date")
}

fn plus_s(t: DateTime, s: i64) -> DateTime {
    DateTime::from_millis(t.timestamp_millis() + s * 1000)
}

/// The server's own time, as the nodes read it (`hello`'s `localTime`).
async fn server_time(db: &TestDb) -> DateTime {
    let reply = db.db.run_command(doc! {"hello": 1}).await.expect("hello");
    *reply
        .get_datetime("localTime")
        .expect("the server says its time")
}

/// Whether `node` holds the maintenance lease on the server's clock as it reads now. A lease
/// taken before the node saw a step of the server's clock forward has ended on it.
async fn leads_now(db: &TestDb, node: &str) -> bool {
    let lease = db
        .db
        .collection::<Document>("leases")
        .find_one(doc! {"_id": "maintenance"})
        .await
        .expect("read the lease");
    let Some(lease) = lease else { return false };
    let until = lease.get_datetime("until").map(|d| d.timestamp_millis());
    let now = server_time(db).await.timestamp_millis();
    lease.get_str("owner") == Ok(node) && until.is_ok_and(|u| u > now)
}

async fn queue(db: &TestDb, name: &str) -> Document {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("read the queue")
        .unwrap_or_else(|| panic!("queue {name}"))
}

/// The ticks of a queue's scheduled tasks, oldest first, as RFC 3339 in UTC.
async fn ticks(db: &TestDb, name: &str) -> Vec<String> {
    let id = queue(db, name).await.get_object_id("_id").expect("an id");
    let mut out: Vec<String> = db
        .tasks()
        .find(doc! {"queue": id, "schedule_tick": {"$exists": true}})
        .await
        .expect("find tasks")
        .try_collect::<Vec<Document>>()
        .await
        .expect("read tasks")
        .iter()
        .filter_map(|t| t.get_datetime("schedule_tick").ok())
        .map(|d| d.try_to_rfc3339_string().expect("a date"))
        .collect();
    out.sort();
    out
}

/// The tick a queue's schedule has settled through (`schedule_last`), in ms.
async fn settled_ms(db: &TestDb, name: &str) -> Option<i64> {
    queue(db, name)
        .await
        .get_datetime("schedule_last")
        .ok()
        .map(|d| d.timestamp_millis())
}

/// A server on a set clock, one node leading its schedules, and the API.
struct Fleet {
    server: RestartableServer,
    db: TestDb,
    den: Den,
    dci: Dci,
}

/// The marker: a paused queue whose schedule ticks every 5 s. Its ticks are settled without
/// tasks, so its `schedule_last` says how far the leader's passes have come on the server's
/// clock.
const MARKER: &str = "marker";

impl Fleet {
    /// Starts on a server reading `park`, makes the queues (name, pattern; each makes tasks),
    /// and waits until the leader has started every schedule: from then on each owes its ticks.
    async fn start(test: &str, park: DateTime, queues: &[(&str, &str)]) -> Fleet {
        let server = RestartableServer::start_at(park);
        let db = TestDb::on(server.uri(), test).await;
        let config = write_config(&db, "node.json", json!({}));
        let den = Den::start(&config, "dst");
        let dci = Dci::start(&config);
        let mut all = vec![json!({"name": MARKER, "plugin": "echo", "threads": 0,
                                  "schedule": "*/5 * * * * *"})];
        all.extend(queues.iter().map(|(name, pattern)| {
            json!({"name": name, "plugin": "echo", "threads": 1,
                   "schedule": pattern, "schedule_tz": ZONE})
        }));
        for q in all {
            let (status, body) = dci.post("/queues", q.clone()).await;
            assert_eq!(status, 200, "{q}: {body}");
        }
        for (name, _) in queues.iter().chain(&[(MARKER, "")]) {
            wait_for(
                &format!("the leader to start {name}'s schedule"),
                Duration::from_secs(60),
                || async { queue(&db, name).await.contains_key("schedule_basis") },
            )
            .await;
        }
        Fleet {
            server,
            db,
            den,
            dci,
        }
    }

    /// Steps the server's clock to `lead` seconds before `tick`, and waits until the node has
    /// read it and leads on it. A machine so slow that the server's time came within 5 s of the
    /// tick meanwhile gets the step again (back), so the tick always finds a leader in its term.
    async fn step_to_before(&self, tick: DateTime, lead: i64) {
        loop {
            let target = plus_s(tick, -lead);
            self.server.set_clock(target);
            let shift_s = (target.timestamp_millis() - DateTime::now().timestamp_millis()) / 1000;
            wait_for(
                "the node to read the stepped clock and lead on it",
                Duration::from_secs(120),
                || async {
                    let offset = self.den.metric("disbatch_clock_offset_seconds").await;
                    // The node's host is behind the server by the shift.
                    (offset + shift_s as f64).abs() <= 2.0
                        && leads_now(&self.db, &self.den.node).await
                },
            )
            .await;
            let left = tick.timestamp_millis() - server_time(&self.db).await.timestamp_millis();
            if left >= 5_000 {
                return;
            }
        }
    }

    /// Waits until two passes of the leader have begun at or after `t` on the server's clock:
    /// the marker settled past `t + 5 s`, then 5 s further. Passes run one after another, so
    /// every schedule has been kept at least once on a clock past `t`.
    async fn passes_beyond(&self, t: DateTime) {
        let mut past = t.timestamp_millis() + 5_000;
        for _ in 0..2 {
            let seen = std::cell::Cell::new(None);
            wait_for(
                &format!("the marker settled through {past} ms"),
                Duration::from_secs(120),
                || async {
                    seen.set(settled_ms(&self.db, MARKER).await);
                    seen.get().is_some_and(|s| s >= past)
                },
            )
            .await;
            past = seen.get().unwrap_or(past) + 5_000;
        }
    }

    /// The queue's next tick as the API shows it, in UTC.
    async fn next_tick(&self, name: &str) -> String {
        let (status, body) = self.dci.get(&format!("/queues/{name}")).await;
        assert_eq!(status, 200, "{body}");
        body["schedule_next"]["utc"]
            .as_str()
            .unwrap_or_else(|| panic!("no schedule_next on {body}"))
            .to_string()
    }
}

/// New York, 2027-03-14: at 02:00 EST (07:00Z) the clock is set forward to 03:00 EDT. Fixed
/// times the change skips (02:00, 02:30) tick once, at 03:00 EDT; a pattern that follows real
/// time has no tick in the hour that does not happen.
#[tokio::test]
async fn spring_forward_fixed_times_tick_at_the_change_and_wildcards_skip_the_hour() {
    let change = at("2027-03-14T07:00:00Z");
    let fleet = Fleet::start(
        "dst_spring",
        at("2027-03-14T06:30:00Z"),
        &[
            ("two_oclock", "0 2 * * *"),
            ("half_past_two", "30 2 * * *"),
            ("each_minute_of_two", "* 2 * * *"),
            ("hourly", "@hourly"),
        ],
    )
    .await;
    fleet.step_to_before(change, 20).await;
    fleet.passes_beyond(change).await;
    let db = &fleet.db;
    let at_change = vec!["2027-03-14T07:00:00Z".to_string()];
    assert_eq!(ticks(db, "two_oclock").await, at_change);
    assert_eq!(ticks(db, "half_past_two").await, at_change);
    assert_eq!(ticks(db, "hourly").await, at_change, "03:00 EDT");
    assert_eq!(ticks(db, "each_minute_of_two").await, Vec::<String>::new());
    // Its next tick is 02:00 EDT the next day, not a minute of the hour that was skipped.
    assert_eq!(
        fleet.next_tick("each_minute_of_two").await,
        "2027-03-15T06:00:00Z"
    );
    assert_eq!(fleet.next_tick("two_oclock").await, "2027-03-15T06:00:00Z");
    drop(fleet.den);
    drop(fleet.dci);
    fleet.db.drop().await;
}

/// New York, 2027-11-07: at 02:00 EDT (06:00Z) the clock is set back to 01:00 EST, so 01:00
/// happens twice (05:00Z and 06:00Z). Fixed times tick once, at the first; a pattern that
/// follows real time ticks in both.
#[tokio::test]
async fn fall_back_fixed_times_tick_once_and_wildcards_tick_in_both_hours() {
    let first = at("2027-11-07T05:00:00Z");
    let second = at("2027-11-07T06:00:00Z");
    let fleet = Fleet::start(
        "dst_fall",
        at("2027-11-07T04:30:00Z"),
        &[
            ("one_oclock", "0 1 * * *"),
            ("midnight_and_one", "0 0,1 * * *"),
            ("half_hours_of_one", "*/30 1 * * *"),
            ("hourly", "@hourly"),
        ],
    )
    .await;
    let db = &fleet.db;
    fleet.step_to_before(first, 20).await;
    fleet.passes_beyond(first).await;
    let first_only = vec!["2027-11-07T05:00:00Z".to_string()];
    assert_eq!(ticks(db, "one_oclock").await, first_only);
    assert_eq!(ticks(db, "midnight_and_one").await, first_only);
    assert_eq!(ticks(db, "hourly").await, first_only);
    assert_eq!(ticks(db, "half_hours_of_one").await, first_only);
    // Fixed times do not tick again in the repeated hour: next is 01:00 EST the next day.
    assert_eq!(fleet.next_tick("one_oclock").await, "2027-11-08T06:00:00Z");
    assert_eq!(
        fleet.next_tick("midnight_and_one").await,
        "2027-11-08T05:00:00Z"
    );

    // The repeated hour. The step passes 01:30 EDT, whose tick of half_hours_of_one a new
    // term may or may not owe; the assertions do not depend on it.
    fleet.step_to_before(second, 20).await;
    fleet.passes_beyond(second).await;
    assert_eq!(ticks(db, "one_oclock").await, first_only);
    assert_eq!(ticks(db, "midnight_and_one").await, first_only);
    assert_eq!(
        ticks(db, "hourly").await,
        vec!["2027-11-07T05:00:00Z", "2027-11-07T06:00:00Z"]
    );
    let half_hours = ticks(db, "half_hours_of_one").await;
    assert_eq!(
        half_hours.first().map(String::as_str),
        Some("2027-11-07T05:00:00Z")
    );
    assert_eq!(
        half_hours.last().map(String::as_str),
        Some("2027-11-07T06:00:00Z"),
        "{half_hours:?}"
    );
    drop(fleet.den);
    drop(fleet.dci);
    fleet.db.drop().await;
}
