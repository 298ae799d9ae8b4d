//! Tests of `outcome.rs`.

use super::*;

#[test]
fn exit_codes_map_to_disbatch_statuses() {
    assert_eq!(
        decide(Exit::Code(0), None),
        Verdict {
            status: 1,
            note: None,
            retry: None,
            refuses_retry: false,
            result: None,
            record: None,
            spilled_output: None,
        }
    );
    let failed = decide(Exit::Code(3), None);
    assert_eq!(failed.status, 2);
    assert!(failed.note.as_deref().is_some_and(|n| n.contains("code 3")));
}

#[test]
fn death_by_signal_fails_and_names_the_signal() {
    let o = decide(Exit::Signal(9), None);
    assert_eq!(o.status, 2);
    assert!(
        o.note.as_deref().is_some_and(|n| n.contains("SIGKILL")),
        "{o:?}"
    );
}

#[test]
fn a_positive_status_in_the_result_file_wins() {
    assert_eq!(decide(Exit::Code(1), Some(br#"{"status": 1}"#)).status, 1);
    assert_eq!(
        decide(Exit::Code(0), Some(br#"{"status": 7, "output": {}}"#)).status,
        7
    );
    assert_eq!(decide(Exit::Code(0), Some(br#"{"status": 2.0}"#)).status, 2);
    assert_eq!(
        decide(Exit::Code(1), Some(br#"{"status": null}"#)).status,
        2
    );
    assert_eq!(decide(Exit::Code(0), Some(b"  \n")).status, 1);
}

#[test]
fn a_status_that_is_not_a_positive_whole_number_fails_the_task_with_the_reason() {
    let too_big = 1_i64 << 40;
    for status in [
        r#""2""#.to_string(),
        "0".into(),
        "-3".into(),
        "1.5".into(),
        too_big.to_string(),
        "true".into(),
        "{}".into(),
        format!("\"{}\"", "9".repeat(100)),
    ] {
        let file = format!(r#"{{"status": {status}, "output": {{"k": {{}}}}}}"#);
        let o = decide(Exit::Code(0), Some(file.as_bytes()));
        assert_eq!(
            (o.status, &o.result, &o.record),
            (2, &None, &None),
            "{status}"
        );
        let note = o.note.unwrap_or_default();
        assert!(
            note.contains("\"status\" must be a whole number from 1"),
            "{status}: {note}"
        );
        assert!(note.len() < 200, "the value is shown short: {note}");
    }
    let note = decide(Exit::Code(0), Some(br#"{"status": 1.5}"#)).note;
    assert!(note.is_some_and(|n| n.ends_with("not 1.5")));
}

#[test]
fn a_result_the_database_cannot_store_fails_the_task_with_the_reason() {
    let o = decide(
        Exit::Code(0),
        Some(br#"{"status": 1, "output": {"a\u0000": {}}}"#),
    );
    assert_eq!(
        (o.status, o.retry, &o.result, &o.record),
        (2, None, &None, &None)
    );
    let note = o.note.unwrap_or_default();
    assert!(
        note.contains("the database cannot store it")
            && note.contains("result.output")
            && note.contains("NUL"),
        "{note}"
    );
    // Kept as written: Extended-JSON-shaped values are the chaining's to judge, per unit.
    let o = decide(
        Exit::Code(0),
        Some(br#"{"n": {"$numberLong": "x"}, "output": {}}"#),
    );
    assert_eq!(o.status, 1);
    assert_eq!(
        o.record,
        Some(bson::doc! {"n": {"$numberLong": "x"}, "output": {}})
    );
}

#[test]
fn an_output_too_large_for_the_record_goes_to_gridfs_and_the_rest_stays() {
    // 1.4 million zeros: under 3 MB of JSON, over 16 MB as BSON (each element is keyed).
    let zeros = vec!["0"; 1_400_000].join(",");
    let file = format!(r#"{{"status": 1, "note": "kept", "output": [{zeros}]}}"#);
    let o = decide(Exit::Code(0), Some(file.as_bytes()));
    assert_eq!((o.status, &o.note), (1, &None));
    assert_eq!(
        o.record,
        Some(bson::doc! {"status": 1_i64, "note": "kept"}),
        "the record keeps all but the output"
    );
    let spilled = o.spilled_output.expect("the output, as JSON text");
    let back: Value = serde_json::from_slice(&spilled).expect("JSON");
    assert_eq!(back.as_array().map(Vec::len), Some(1_400_000));
    // Kept as text, it is read back only to chain, and only within bounds.
    assert!(o.result.as_ref().is_some_and(|m| !m.contains_key("output")));
    let problem = chained_output(o.result.as_ref(), Some(&spilled)).expect_err("too many");
    assert!(
        problem.contains("more than 1000000 JSON values"),
        "{problem}"
    );
    let chained = chained_output(None, Some(b"[{\"key\": \"a\"}]")).expect("small");
    assert_eq!(chained.as_deref(), Some(&serde_json::json!([{"key": "a"}])));
    // Too many values for the record, though short as text: kept as text too.
    let many = format!(r#"{{"output": [{}]}}"#, vec!["0"; 300_000].join(","));
    let o = decide(Exit::Code(0), Some(many.as_bytes()));
    assert_eq!((o.status, o.record), (1, Some(bson::doc! {})));
    assert_eq!(o.spilled_output.map(|s| s.len()), Some(600_001));
    // A small output stays inline.
    let o = decide(Exit::Code(0), Some(br#"{"output": [0, 0]}"#));
    assert_eq!(o.spilled_output, None);
    assert_eq!(o.record, Some(bson::doc! {"output": [0_i64, 0_i64]}));
    // What is left must fit the record; the reason says where the output went.
    let big = "x".repeat(16 * 1024 * 1024);
    let file = format!(r#"{{"other": "{big}", "output": [{zeros}]}}"#);
    let o = decide(Exit::Code(0), Some(file.as_bytes()));
    assert_eq!((o.status, &o.record, &o.spilled_output), (2, &None, &None));
    let note = o.note.unwrap_or_default();
    assert!(
        note.contains("besides its output, which goes to GridFS")
            && note.contains("an attempt record holds"),
        "{note}"
    );
}

#[test]
fn members_past_the_values_or_the_depth_bound_are_refused_before_being_built() {
    // The shape that took a runner to 1 GB: 16 MB of empty arrays.
    let arrays = vec!["[]"; 5_000_000].join(",");
    let file = format!(r#"{{"a": [{arrays}]}}"#);
    let o = decide(Exit::Code(0), Some(file.as_bytes()));
    assert_eq!((o.status, &o.record), (2, &None));
    let note = o.note.unwrap_or_default();
    assert!(
        note.contains("more than 200000 JSON values (by member \"a\")"),
        "{note}"
    );
    let deep = format!(r#"{{"d": {}1{}}}"#, "[".repeat(101), "]".repeat(101));
    let o = decide(Exit::Code(0), Some(deep.as_bytes()));
    let note = o.note.unwrap_or_default();
    assert!(
        note.contains("member \"d\" nests 101 levels deep"),
        "{note}"
    );
}

#[test]
fn a_malformed_result_file_fails_the_task_with_the_reason() {
    let o = decide(Exit::Code(0), Some(b"{not json"));
    assert_eq!(o.status, 2);
    assert!(o
        .note
        .as_deref()
        .is_some_and(|n| n.contains("not valid JSON")));
    let o = decide(Exit::Code(0), Some(b"[1]"));
    assert_eq!(o.status, 2);
    assert!(o.note.as_deref().is_some_and(|n| n.contains("JSON object")));
}

#[test]
fn a_refused_result_file_fails_the_task_and_asks_for_nothing() {
    let mut o = decide(
        Exit::Code(3),
        Some(br#"{"status": 1, "retry": true, "output": {"k": {}}}"#),
    );
    assert_eq!((o.status, o.retry.is_some()), (1, true));
    o.refuse_result("it is a symbolic link");
    assert_eq!((o.status, o.retry, o.result), (2, None, None));
    assert_eq!(
        o.note.as_deref(),
        Some("plugin exited with code 3; DISBATCH_RESULT file ignored: it is a symbolic link")
    );
}

#[test]
fn a_policy_retries_the_failures_it_names_until_attempts_run_out() {
    let p = RetryPolicy::new(
        3,
        disbatch_model::retry_policy::Backoff::Exponential,
        1.0,
        60.0,
        0.0,
        &[FailureKind::Failed, FailureKind::Timeout],
    )
    .unwrap();
    let now = DateTime::from_millis(1_000_000);
    let task = ObjectId::new();
    let follow = |end, kind, refuses, attempt| {
        follow_retry_policy(end, kind, refuses, Some(&p), attempt, task, now)
    };
    let failed = TaskEnd::Status(2);
    let (end, line) = follow(failed, Some(FailureKind::Failed), false, 1);
    assert_eq!(
        end,
        TaskEnd::Retry {
            not_before: Some(DateTime::from_millis(1_001_000)),
            keep_key_slot: false,
        }
    );
    assert!(line.unwrap().contains("attempt 1 of 3; retrying in 1.0 s"));
    let (end, _) = follow(failed, Some(FailureKind::Timeout), false, 2);
    assert_eq!(
        end,
        TaskEnd::Retry {
            not_before: Some(DateTime::from_millis(1_002_000)),
            keep_key_slot: false,
        }
    );
    let (end, line) = follow(failed, Some(FailureKind::Failed), false, 3);
    assert_eq!(end, TaskEnd::Discarded(2));
    assert!(line.unwrap().contains("out of attempts"));
    // Not named by `on`, refused by the plugin, cancelled, succeeded.
    assert_eq!(
        follow(failed, Some(FailureKind::Crashed), false, 1),
        (failed, None)
    );
    assert_eq!(
        follow(failed, Some(FailureKind::Failed), true, 1).0,
        TaskEnd::Discarded(2)
    );
    assert_eq!(
        follow(TaskEnd::Status(-5), None, false, 1),
        (TaskEnd::Status(-5), None)
    );
    assert_eq!(
        follow(TaskEnd::Status(1), Some(FailureKind::Failed), false, 1).0,
        TaskEnd::Status(1)
    );
    // A retry the plugin asks for counts against max_attempts.
    let asked = TaskEnd::Retry {
        not_before: None,
        keep_key_slot: false,
    };
    assert_eq!(follow(asked, None, false, 2).0, asked);
    assert_eq!(follow(asked, None, false, 3).0, TaskEnd::Discarded(2));
    // No policy: Disbatch's behaviour.
    assert_eq!(
        follow_retry_policy(failed, Some(FailureKind::Failed), false, None, 1, task, now),
        (failed, None)
    );
}

#[test]
fn a_result_may_ask_for_a_retry_with_a_delay() {
    let o = decide(Exit::Code(0), Some(br#"{"retry": true, "delay": 2.5}"#));
    assert_eq!(o.retry, Some(Duration::from_millis(2500)));
    assert!(o.result.is_some_and(|m| m.contains_key("delay")));
    assert_eq!(
        decide(Exit::Code(1), Some(br#"{"retry": true}"#)).retry,
        Some(Duration::ZERO)
    );
    assert!(decide(Exit::Code(3), Some(br#"{"retry": false}"#)).refuses_retry);
    assert!(!decide(Exit::Code(3), Some(br#"{"retry": true}"#)).refuses_retry);
    assert_eq!(
        decide(Exit::Code(0), Some(br#"{"retry": false}"#)).retry,
        None
    );
    let bad = decide(Exit::Code(0), Some(br#"{"retry": true, "delay": -1}"#));
    assert_eq!((bad.status, bad.retry), (2, None));
    assert!(bad.note.is_some_and(|n| n.contains("delay")));
}
