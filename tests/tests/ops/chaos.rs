//! The short form of the chaos run (scripts/chaos runs the full one): nodes, runners and the
//! server killed while a requeue queue is worked; every task ends terminal and consistent.

use std::time::Duration;

use disbatch_tests::faults::chaos::{run_chaos, ChaosOptions};

#[tokio::test]
async fn tasks_survive_killed_nodes_runners_and_a_server_restart() {
    let opts = ChaosOptions {
        tasks: 120,
        nodes: 3,
        chaos_for: Duration::from_secs(30),
        settle_within: Duration::from_secs(120),
        seed: 20261122,
    };
    let report = run_chaos(&opts).await;
    println!("{report}");
    assert!(report.problems.is_empty(), "{report}");
    assert_eq!(report.succeeded + report.orphaned, opts.tasks, "{report}");
    assert!(
        report.runner_kills > 0 && report.server_restarts == 1,
        "{report}"
    );
    assert!(
        report.recoveries > 0,
        "killed runners' tasks were recovered: {report}"
    );
}
