//! The benchmark in miniature against the real binaries: every figure present and sane, the
//! proxy saw both DENs' and runners' requests, and nothing is left behind. Not a timed test.

use std::time::Duration;

use bson::doc;
use disbatch_tests::bench::ceiling::ClaimPath;
use disbatch_tests::bench::fleet_run::RunReport;
use disbatch_tests::bench::report::BenchReport;
use disbatch_tests::bench::{run_bench, BenchOptions};
use disbatch_tests::{server_uri, TestDb};

fn finite_positive(what: &str, v: f64) {
    assert!(v.is_finite() && v > 0.0, "{what} should be > 0, got {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_bench_run_reports_every_figure() {
    let options = BenchOptions {
        uri: Some(server_uri()),
        dens: vec![1],
        tasks: 50,
        depths: vec![100],
        repeat: 1,
        idle: Duration::from_secs(2),
        latency_tasks: 20,
        ceiling_depths: vec![100, 300],
        ceiling_concurrency: vec![1, 4],
        ceiling_drain_limit: 100,
        ceiling_sample_claims: 50,
        runner_runs: 3,
        run_secs: Duration::from_secs(120),
        ..BenchOptions::quick()
    };
    let report = run_bench(&options, "bench_smoke".into())
        .await
        .expect("the bench runs");

    assert!(report.machine.cores > 0);
    assert!(!report.server.version.is_empty());
    finite_positive("direct ping p50", report.proxy_cost.direct.p50_ms);
    finite_positive("proxied ping p50", report.proxy_cost.proxied.p50_ms);

    check_the_ceiling_has_each_path_at_each_depth(&report);
    // The harness's server runs on this machine, so its CPU time is readable.
    let local = report.server.host.starts_with("127.0.0.1:");
    check_each_ceiling_point(&report, local);

    let r = &report.runner;
    assert_eq!((r.runs, r.spawn_to_exit.n), (3, 3));
    finite_positive("runner spawn→exit", r.spawn_to_exit.p50_ms);
    finite_positive("runner requests", r.requests_per_run);
    assert!(
        r.by_command.keys().any(|k| k.ends_with(" tasks")),
        "the runner writes its task: {:?}",
        r.by_command
    );
    if std::path::Path::new("/usr/bin/time").exists() {
        assert!(r.peak_rss_kib.is_some_and(|k| k > 1000), "{r:?}");
    }

    assert_eq!(report.fleets.len(), 1);
    let f = &report.fleets[0];
    assert_eq!((f.dens, f.threads), (1, 8));
    finite_positive("idle requests/s", f.idle.requests_per_sec);
    assert!(f
        .idle
        .by_command_per_sec
        .keys()
        .any(|k| k.starts_with("den ") && k.ends_with(" nodes")));
    assert_eq!(f.idle.den_cpu_percent.len(), 1);
    if local {
        assert!(f
            .idle
            .server_cpu_percent
            .is_some_and(|c| c.is_finite() && c >= 0.0));
    }
    assert!(f.idle.den_cpu_percent[0].is_finite() && f.idle.den_cpu_percent[0] >= 0.0);
    assert_eq!(f.idle_enqueue_to_start.n, 20);
    finite_positive("idle enqueue→start p50", f.idle_enqueue_to_start.p50_ms);

    assert_eq!(f.runs.len(), 1);
    let run = &f.runs[0];
    check_the_measured_run(run);

    check_the_verdicts_and_the_text(&report);

    check_the_bench_databases_are_gone().await;
}

fn check_the_ceiling_has_each_path_at_each_depth(report: &BenchReport) {
    assert_eq!(
        report.ceiling.len(),
        10,
        "2 depths × (2 raw concurrencies + the DEN's claim alone, batches of 1 and 8, + claim and result)"
    );
    for depth in [100, 300] {
        let paths: Vec<(ClaimPath, usize, usize)> = report
            .ceiling
            .iter()
            .filter(|p| p.depth == depth)
            .map(|p| (p.path, p.concurrency, p.batch))
            .collect();
        assert_eq!(
            paths,
            [
                (ClaimPath::Raw, 1, 1),
                (ClaimPath::Raw, 4, 1),
                (ClaimPath::Disbatch, 1, 1),
                (ClaimPath::Disbatch, 1, 8),
                (ClaimPath::Cycle, 1, 8)
            ]
        );
    }
}

fn check_each_ceiling_point(report: &BenchReport, local: bool) {
    for p in &report.ceiling {
        finite_positive("claims/s", p.claims_per_sec);
        finite_positive("claim p50", p.latency.p50_ms);
        if local {
            let cpu = p.server_cpu_ms_per_claim;
            assert!(cpu.is_some_and(|c| c.is_finite() && c >= 0.0), "{p:?}");
        }
        if p.depth == 100 {
            assert!(
                p.drained && p.claims == 100,
                "a shallow queue is drained: {p:?}"
            );
        } else {
            assert!(
                !p.drained && p.claims == 50,
                "a deep queue is sampled: {p:?}"
            );
        }
    }
}

fn check_the_measured_run(run: &RunReport) {
    assert_eq!((run.depth, run.queued_at_go), (100, 100));
    assert!(run.tasks >= 50 && run.tasks <= 100, "{}", run.tasks);
    assert_eq!(run.stopped_by, "tasks");
    finite_positive("tasks/s", run.tasks_per_sec);
    finite_positive("busy seconds", run.busy_secs);
    assert_eq!(run.queued_to_start.n, run.tasks);
    let rt = &run.round_trips;
    finite_positive("requests/task", rt.per_task);
    assert!(rt.raw_per_task >= rt.per_task, "{rt:?}");
    // Runners open no connection; the nodes' pools are already open.
    assert!(
        rt.connections_per_task.is_finite() && rt.connections_per_task < 0.1,
        "{rt:?}"
    );
    finite_positive(
        "den requests/task",
        rt.by_process.get("den").copied().unwrap_or(0.0),
    );
    // Runners hand their results to their node: in a fleet they never touch the database.
    assert_eq!(
        rt.by_process.get("dtr").copied().unwrap_or(0.0),
        0.0,
        "{:?}",
        rt.by_command
    );
    // One bulkWrite a batch (MongoDB 8.0+, SecantusDB), else an insert and an update.
    let sent = |c: &str| rt.by_command.get(c).is_some_and(|n| *n > 0.0);
    assert!(
        sent("den bulkWrite") || (sent("den insert attempts") && sent("den update tasks")),
        "the node stores results: {:?}",
        rt.by_command
    );
    assert!(
        rt.by_command
            .keys()
            .any(|k| k.starts_with("den ") && k.ends_with(" tasks")),
        "the DEN's claims were counted: {:?}",
        rt.by_command
    );
    let den_replies: Vec<_> = run
        .reply_ms
        .iter()
        .filter(|(k, l)| k.starts_with("den ") && l.n > 0)
        .collect();
    assert!(!den_replies.is_empty(), "{:?}", run.reply_ms);
    for (k, l) in den_replies {
        assert!(l.p50_ms.is_finite() && l.p50_ms >= 0.0, "{k}: {l:?}");
    }
    // The DENs' own counts: every task run was claimed once; misses are counted, not guessed.
    let c = &run.contention;
    assert!(
        (0.99..=1.2).contains(&c.claimed_per_task),
        "claims per task from the DEN metrics: {c:?}"
    );
    assert!(
        [
            c.lost_per_task,
            c.slot_taken_per_task,
            c.empty_reads_per_task
        ]
        .iter()
        .all(|v| v.is_finite() && *v >= 0.0),
        "{c:?}"
    );
    finite_positive("DEN CPU/task", run.den_cpu_ms_per_task);
    finite_positive("runner CPU/task", run.runner_cpu_ms_per_task);
    assert!(run.den_peak_rss_kib > 1000);
}

fn check_the_verdicts_and_the_text(report: &BenchReport) {
    assert_eq!(report.verdicts.len(), 4, "{:?}", report.verdicts);
    assert!(report.verdicts.iter().all(|v| v.measured.is_finite()));
    let text = report.to_string();
    assert_eq!(
        text.matches("PASS ").count() + text.matches("FAIL ").count(),
        4,
        "{text}"
    );
    let json = serde_json::to_value(report).expect("json");
    assert!(json["fleets"][0]["runs"][0]["round_trips"]["per_task"].is_number());
}

async fn check_the_bench_databases_are_gone() {
    // The bench's databases are gone.
    let db = TestDb::new("bench_smoke_check").await;
    let pid = std::process::id().to_string();
    let left: Vec<String> = db
        .client
        .list_database_names()
        .await
        .expect("list databases")
        .into_iter()
        // The fleet test below runs beside this one and checks its own.
        .filter(|n| n.contains("bench") && n.contains(&pid) && !n.contains("bench_fleet"))
        .filter(|n| !n.contains("smoke_check"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    db.db
        .collection::<bson::Document>("x")
        .insert_one(doc! {})
        .await
        .expect("server still fine");
    db.drop().await;
}

/// Fleet mode at its smallest (`--fleet 2`, short windows, a 3 s lease): every figure of the
/// size is there, the follower's tasks were recovered by the other node, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_fleet_run_reports_every_figure() {
    let args: Vec<String> =
        "--fleet 2 --quick --idle-secs 2 --latency-tasks 5 --tasks 40 --lease-secs 3 --paused-tasks 500"
            .split_whitespace()
            .map(str::to_string)
            .collect();
    let mut options = disbatch_tests::bench::parse_args(&args).expect("fleet options");
    options.uri = Some(server_uri());
    // Its own node names: the leftover check below must not see another run's fleet.
    options.node_prefix = format!("fleet{}", std::process::id());
    let report = match disbatch_tests::bench::run(&options, "bench_smoke --fleet 2".into())
        .await
        .expect("the fleet bench runs")
    {
        disbatch_tests::bench::Report::Fleet(r) => *r,
        other => panic!("--fleet gave another report: {other}"),
    };
    assert_eq!(report.stopped, None, "{report}");
    assert_eq!(report.sizes.len(), 1);
    let s = &report.sizes[0];
    assert_eq!((s.dens, s.threads), (2, 8));
    finite_positive("start secs", s.start_secs);
    let i = &s.idle;
    finite_positive("idle requests/s", i.requests_per_sec);
    assert!((i.requests_per_sec_per_den * 2.0 - i.requests_per_sec).abs() < 1e-9);
    assert!(
        i.by_command_per_sec
            .keys()
            .any(|k| k.starts_with("den ") && k.ends_with(" nodes")),
        "{i:?}"
    );
    // A node's change stream holds a connection of its own beside its pool's and its
    // monitoring's.
    assert!(i.open_connections >= 4, "{i:?}");
    assert!(i.den_cpu_percent_total.is_finite() && i.den_cpu_percent_total >= 0.0);
    finite_positive("DEN RSS", i.den_rss_mib_total);
    if report.server.host.starts_with("127.0.0.1:") {
        assert!(i
            .server_cpu_percent
            .is_some_and(|c| c.is_finite() && c >= 0.0));
        assert!(i.server_fds.is_some_and(|n| n > 0));
    }
    assert_eq!(s.enqueue_to_start.n, 5);
    finite_positive("enqueue→start p50", s.enqueue_to_start.p50_ms);
    assert!(s.requests_per_probe.is_finite());
    assert_eq!(s.enqueue_to_start_direct.n, 5);
    finite_positive(
        "enqueue→start p50, inserted directly",
        s.enqueue_to_start_direct.p50_ms,
    );
    let hows: Vec<&str> = s.paused_inserts.iter().map(|p| p.how).collect();
    assert_eq!(hows, ["store", "direct"]);
    for p in &s.paused_inserts {
        assert_eq!(p.tasks, 500);
        finite_positive("paused insert time", p.insert_secs);
        assert!(!p.requests_after.is_empty(), "{p:?}");
    }
    let b = &s.backlog;
    assert_eq!((b.depth, b.tasks, b.stopped_by), (40, 40, "tasks"));
    finite_positive("backlog tasks/s", b.tasks_per_sec);
    assert!(
        b.share.max >= b.share.min && b.share.min + b.share.max <= 40,
        "{b:?}"
    );
    assert!((b.share.even_percent - 50.0).abs() < 1e-9);
    assert_eq!(s.recovery.len(), 1, "two nodes: only a follower dies");
    let r = &s.recovery[0];
    assert_eq!((r.victim, r.taken_by), ("follower", 1));
    assert!(r.tasks >= 1, "{r:?}");
    // Recovered by lease: not before the lease ran out. How soon after is the bench's figure
    // (printed in its report), not a bound for a machine under load; that it happened at all
    // is the bench's own wait for the tasks.
    assert!(r.retaken_ms.0 >= r.lease_left_ms.0, "{r:?}");
    assert!(r.retaken_ms.1.is_finite(), "{r:?}");
    assert!(r.done_ms.1 >= r.retaken_ms.1, "{r:?}");

    let text = report.to_string();
    assert!(
        text.contains("| 2 |") && text.contains(&format!("follower {}-", options.node_prefix)),
        "{text}"
    );
    let json =
        serde_json::to_value(disbatch_tests::bench::Report::Fleet(Box::new(report))).expect("json");
    assert!(json["sizes"][0]["backlog"]["share"]["max_percent"].is_number());
    assert!(json["sizes"][0]["recovery"][0]["retaken_ms"][1].is_number());

    let db = TestDb::new("smoke_check_fleet").await;
    let pid = std::process::id().to_string();
    let left: Vec<String> = db
        .client
        .list_database_names()
        .await
        .expect("list databases")
        .into_iter()
        .filter(|n| n.contains("bench_fleet") && n.contains(&pid))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    db.drop().await;
    // Every DEN and runner of the fleet is gone (both carry `--node NAME`).
    for i in 0..2 {
        let node = format!("{}-{i:03}", options.node_prefix);
        let left = disbatch_tests::bench::procfs::processes_naming(&node);
        assert!(left.is_empty(), "{node}: processes left running: {left:?}");
    }
}
