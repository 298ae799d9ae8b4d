//! Tests of `metrics/mod.rs`.

use super::*;

fn has(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[test]
fn a_new_node_renders_its_unlabelled_and_known_label_families() {
    let text = DenMetrics::new().render();
    exposition::check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for line in [
        "# TYPE disbatch_den_passes_total counter",
        "disbatch_den_passes_total 0",
        "disbatch_den_claim_latency_seconds_count 0",
        "disbatch_den_pass_duration_seconds_bucket{le=\"+Inf\"} 0",
        "disbatch_den_wakeups_total{source=\"change_stream\"} 0",
        "disbatch_den_recoveries_total{how=\"orphan\"} 0",
        "disbatch_den_attempt_records_repaired_total 0",
        "disbatch_den_stale_runners_killed_total 0",
        "disbatch_den_outside_inserts_signalled_total 0",
        "disbatch_den_nodes_signalled_total 0",
        "disbatch_build_info{git_sha=\"GIT\",version=\"VERSION\"} 1",
    ] {
        let line = line
            .replace("GIT", disbatch_model::GIT_SHA)
            .replace("VERSION", disbatch_model::VERSION);
        let line = line.as_str();
        assert!(has(&text, line), "{line} missing from\n{text}");
    }
}

#[test]
fn every_call_shows_in_its_family() {
    let m = DenMetrics::new();
    let clone = m.clone();
    m.claimed("q1", Duration::from_millis(3));
    clone.claimed("q1", Duration::from_millis(30));
    m.claim_missed("q\"2\\\nx", "lost");
    m.claimed_in_pass("q1", 2);
    m.pass(Duration::from_millis(20));
    m.wakeup("timer");
    m.wakeup("timer");
    m.runner_started("q1");
    m.runner_started("q1");
    m.runner_exited("q1", Duration::from_secs(2), true);
    m.task_finished("q1", Some(disbatch_model::task::Outcome::Failed));
    m.db_error("claim");
    m.recovered("requeue");
    m.schedule_ticks("q1", "enqueued", 2);
    m.schedules_invalid(1);
    let text = m.render();
    exposition::check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for line in [
        "disbatch_den_claims_total{queue=\"q1\"} 2",
        "disbatch_den_claim_latency_seconds_count 2",
        "disbatch_den_claim_latency_seconds_bucket{le=\"0.005\"} 1",
        "disbatch_den_claim_latency_seconds_bucket{le=\"0.05\"} 2",
        "disbatch_den_claims_per_pass_bucket{queue=\"q1\",le=\"1\"} 0",
        "disbatch_den_claims_per_pass_bucket{queue=\"q1\",le=\"2\"} 1",
        "disbatch_den_claim_misses_total{queue=\"q\\\"2\\\\\\nx\",reason=\"lost\"} 1",
        "disbatch_den_passes_total 1",
        "disbatch_den_pass_duration_seconds_count 1",
        "disbatch_den_wakeups_total{source=\"timer\"} 2",
        "disbatch_den_runners_started_total{queue=\"q1\"} 2",
        "disbatch_den_runners{queue=\"q1\"} 1",
        "disbatch_den_runner_exits_total{queue=\"q1\",result=\"success\"} 1",
        "disbatch_den_task_duration_seconds_bucket{queue=\"q1\",le=\"1\"} 0",
        "disbatch_den_task_duration_seconds_bucket{queue=\"q1\",le=\"5\"} 1",
        "disbatch_den_task_duration_seconds_sum{queue=\"q1\"} 2",
        "disbatch_den_db_errors_total{operation=\"claim\"} 1",
        "disbatch_den_recoveries_total{how=\"requeue\"} 1",
        "disbatch_den_schedule_ticks_total{outcome=\"enqueued\",queue=\"q1\"} 2",
        "disbatch_den_schedules_invalid 1",
        "disbatch_den_tasks_finished_total{outcome=\"failed\",queue=\"q1\"} 1",
        "disbatch_den_tasks_finished_total{outcome=\"succeeded\",queue=\"q1\"} 0",
        "disbatch_den_tasks_finished_total{outcome=\"lost\",queue=\"q1\"} 0",
    ] {
        assert!(has(&text, line), "{line} missing from\n{text}");
    }
}

#[test]
fn stored_queue_names_are_escaped_and_cut_in_labels() {
    let m = DenMetrics::new();
    let long = "q".repeat(100_000);
    let names = [
        "red\x1b[31m",
        "nul\0",
        "two\nlines",
        "rtl\u{202e}x",
        "trail ",
        &long,
    ];
    for name in names {
        m.claimed(name, Duration::from_millis(1));
        m.claim_missed(name, "empty");
        m.runner_started(name);
        m.runner_exited(name, Duration::from_secs(1), false);
    }
    let text = m.render();
    let e = exposition::check(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    assert!(
        !text
            .chars()
            .any(|c| c != '\n' && disbatch_model::text::printable::is_hidden(c)),
        "{text:?}"
    );
    assert!(text.lines().all(|l| l.chars().count() < 600), "{text}");
    for (label, claims) in [
        ("red\\u{1b}[31m", 1.0),
        ("nul\\u{0}", 1.0),
        ("two\nlines", 1.0),
        ("rtl\\u{202e}x", 1.0),
        ("trail\\u{20}", 1.0),
    ] {
        assert_eq!(
            e.value("disbatch_den_claims_total", &[("queue", label)]),
            Some(claims),
            "{label:?} in\n{text}"
        );
        assert_eq!(
            e.value("disbatch_den_runners", &[("queue", label)]),
            Some(0.0),
            "{label:?} in\n{text}"
        );
    }
    assert!(text.contains("…[+99744 chars #"), "{text}");
}
