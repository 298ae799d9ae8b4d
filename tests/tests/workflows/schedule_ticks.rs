//! Scheduled ticks: the maintenance leader enqueues each tick once, across leader kills, pauses and
//! bad schedules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson};
use disbatch_tests::{wait_for, write_config, Dci, Den, TestDb};
use serde_json::json;

use super::schedules::{now_ms, queue_named, scheduled, settled};
use disbatch_tests::{leader_lease, wait_leader};

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
    wait_leader(&db, None, Duration::from_secs(60)).await;
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
    let (gaps, left) =
        kill_the_leader_each_round(&db, &config, &mut dens, queue, first, began).await;
    tokio::time::sleep_until((began + RUN).into()).await;
    let end = now_ms();
    wait_for(
        "the leader to settle the last tick",
        Duration::from_secs(30),
        || async { settled(&db, queue).await.is_some_and(|s| s >= end - 2_000) },
    )
    .await;
    let end = settled(&db, queue).await.expect("settled");

    let (missing, catch_ups) =
        check_no_tick_twice_or_off_the_schedule(&db, queue, first, end, &gaps).await;
    check_missed_ticks_fall_in_gaps_and_each_gap_is_caught_up_once(
        &gaps, &left, &missing, &catch_ups,
    );
    drop(dens);
    db.drop().await;
}

async fn kill_the_leader_each_round(
    db: &TestDb,
    config: &Path,
    dens: &mut Vec<Den>,
    queue: ObjectId,
    first: i64,
    began: Instant,
) -> (Vec<(i64, i64)>, Vec<i64>) {
    // Per kill: when it happened and when the test first saw the next leader (ms).
    let mut gaps: Vec<(i64, i64)> = Vec::new();
    // Per kill: how much of the killed leader's lease was left (ms).
    let mut left: Vec<i64> = Vec::new();
    for round in 1..=(RUN.as_secs() / KILL_EVERY.as_secs()) - 1 {
        tokio::time::sleep_until((began + KILL_EVERY * round as u32).into()).await;
        let leading = wait_leader(db, None, Duration::from_secs(60)).await;
        // Killed only once it has led: a tick enqueued since it was seen leading.
        let since = gaps.last().map_or(first, |g| g.1);
        wait_for(
            "the leader's first tick",
            Duration::from_secs(30),
            || async {
                scheduled(db, queue)
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
                let lease = leader_lease(db).await;
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
        dens.push(Den::start(config, &format!("r{round}")));
        let next = wait_leader(db, Some(&leading), Duration::from_secs(60)).await;
        let seen = now_ms();
        println!(
            "round {round}: killed leader {leading} with {} ms of its lease left; {next} leads {} ms later",
            until.get() - killed,
            seen - killed
        );
        gaps.push((killed, seen));
    }
    (gaps, left)
}

async fn check_no_tick_twice_or_off_the_schedule(
    db: &TestDb,
    queue: ObjectId,
    first: i64,
    end: i64,
    gaps: &[(i64, i64)],
) -> (Vec<i64>, Vec<(i64, i64)>) {
    let tasks = scheduled(db, queue).await;
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
    (missing, catch_ups)
}

fn check_missed_ticks_fall_in_gaps_and_each_gap_is_caught_up_once(
    gaps: &[(i64, i64)],
    left: &[i64],
    missing: &[i64],
    catch_ups: &[(i64, i64)],
) {
    let gap_of = |tick: i64| {
        gaps.iter()
            .position(|(killed, seen)| (killed - BEFORE_KILL_MS..=*seen).contains(&tick))
    };
    for tick in missing {
        assert!(
            gap_of(*tick).is_some(),
            "tick {tick} was missed outside every leader gap {gaps:?}"
        );
    }
    // "once": after each gap one task, for its latest missed tick, standing for the run of
    // missed ticks right before it; no other missed tick of the gap is enqueued. It may stand
    // for more: a tick the dead leader enqueued but had not recorded as settled counts too.
    let mut per_gap = vec![0; gaps.len()];
    for (tick, standing_for) in catch_ups {
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
    for tick in missing {
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
