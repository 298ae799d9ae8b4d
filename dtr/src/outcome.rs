//! Turns a plugin's exit and result file into the task's final status (pure decisions).

use std::process::ExitStatus;

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{DateTime, Document};
use disbatch_model::output::{MAX_DOCUMENT_SIZE, RESULT_INLINE_LIMIT};
use disbatch_model::retry_policy::{FailureKind, RetryDecision, RetryPolicy};
use disbatch_model::status;
use disbatch_store::TaskEnd;
use std::collections::BTreeMap;

use disbatch_model::text::client_json::{json_shape, MAX_DEPTH};
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Room the attempt record keeps for its own fields beside the result document.
const RECORD_FIELDS: u64 = 16 * 1024;
/// An `output` longer than this, as JSON text, is kept as that text (in GridFS) and never
/// built as values here: what bounds a runner's memory whatever the output.
pub const OUTPUT_KEPT_AS_TEXT: usize = 1024 * 1024;
/// Values a result may hold besides an output kept as text: a tree of them costs a runner
/// (and a worker host) some 100 bytes each, twice (as JSON values, then as BSON).
pub const MAX_RESULT_VALUES: usize = 200_000;
/// Values an output kept as text may hold to be chained from.
const MAX_CHAINED_VALUES: usize = 1_000_000;

/// How the plugin process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl From<ExitStatus> for Exit {
    fn from(s: ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        match (s.code(), s.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(sig)) => Exit::Signal(sig),
            (None, None) => Exit::Code(-1),
        }
    }
}

/// The final status, any note the runner adds to stderr, and a requested retry.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: i32,
    pub note: Option<String>,
    /// The plugin asked to run again after this delay (`{"retry": true, "delay": s}`).
    pub retry: Option<Duration>,
    /// The plugin said its failure is permanent (`{"retry": false}`): no automatic retry.
    pub refuses_retry: bool,
    /// The result file's object, read for chaining.
    pub result: Option<Map<String, Value>>,
    /// The same object as it is kept on the attempt record: checked to be storable. Without
    /// its `output` when that goes to GridFS (`spilled_output`).
    pub record: Option<Document>,
    /// The result's `output` as JSON text, when the record would pass `RESULT_INLINE_LIMIT`
    /// with it: the runner keeps it in GridFS and the record names the file.
    pub spilled_output: Option<Vec<u8>>,
}

impl Outcome {
    /// The result file could not be trusted (a link, not a regular file, too large): it is
    /// ignored and the task fails, saying why, as for a result file that is not JSON.
    pub fn refuse_result(&mut self, reason: &str) {
        let why = format!("DISBATCH_RESULT file ignored: {reason}");
        self.status = status::FAILED;
        self.retry = None;
        self.refuses_retry = false;
        self.result = None;
        self.record = None;
        self.spilled_output = None;
        self.note = Some(match self.note.take() {
            Some(n) => format!("{n}; {why}"),
            None => why,
        });
    }
}

/// Exit 0 → succeeded, non-zero or a signal → failed; a positive integer `status` in the
/// result file wins, and `"retry": true` asks for another attempt. A result file that is not
/// a JSON object, or one the database cannot store, or a bad `status` or `delay`, fails the
/// task, with the reason.
pub fn decide(exit: Exit, result_file: Option<&[u8]>) -> Outcome {
    let mut notes = Vec::new();
    let mut status = match exit {
        Exit::Code(0) => status::SUCCEEDED,
        Exit::Code(code) => {
            notes.push(format!("plugin exited with code {code}"));
            status::FAILED
        }
        Exit::Signal(sig) => {
            notes.push(format!(
                "plugin was killed by signal {sig} ({})",
                signal_name(sig)
            ));
            status::FAILED
        }
    };
    let mut retry = None;
    let mut refuses_retry = false;
    let mut result = None;
    let mut record = None;
    let mut spilled_output = None;
    match result_file.map(parse_result) {
        None | Some(Ok(None)) => {}
        Some(Ok(Some(r))) => {
            if let Some(s) = r.status {
                status = s;
            }
            retry = r.retry;
            refuses_retry = r.refuses_retry;
            result = Some(r.object);
            record = Some(r.record);
            spilled_output = r.spilled_output;
        }
        Some(Err(reason)) => {
            notes.push(format!("DISBATCH_RESULT file ignored: {reason}"));
            status = status::FAILED;
        }
    }
    // The exit code or signal is worth saying even when the result file decided the status.
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    Outcome {
        status,
        note,
        retry,
        refuses_retry,
        result,
        record,
        spilled_output,
    }
}

/// What a result file asked for.
#[derive(Debug, Clone, PartialEq)]
struct ResultFile {
    status: Option<i32>,
    retry: Option<Duration>,
    refuses_retry: bool,
    object: Map<String, Value>,
    record: Document,
    spilled_output: Option<Vec<u8>>,
}

/// Ok(None) for an empty file. A `status` that is not a positive integer is refused: taken
/// for none, it would let a plugin that meant to fail succeed.
///
/// Bounded before anything is built: the members are taken as JSON text, an `output` over
/// `OUTPUT_KEPT_AS_TEXT` (or too many values, or too deep) stays text (for GridFS), and the
/// rest must hold at most `MAX_RESULT_VALUES` values, `MAX_DEPTH` deep. A 16 MB `{"a": [[], …]}` took a runner to
/// 1 GB as a tree of values and then of BSON.
fn parse_result(bytes: &[u8]) -> Result<Option<ResultFile>, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let members: BTreeMap<String, Box<RawValue>> = match serde_json::from_slice(bytes) {
        Ok(members) => members,
        Err(e) => {
            return Err(match serde_json::from_slice::<IgnoredAny>(bytes) {
                Ok(_) => "it must hold a JSON object such as {\"status\": 1}".into(),
                Err(_) => format!("it is not valid JSON ({e})"),
            })
        }
    };
    // Kept as written (params that cannot be chained are said per unit, and the result still
    // stands), but it must encode: a field name with a NUL byte, which chained params refuse
    // too, would fail every write of the attempt record, for good.
    let unstorable = |e: String| format!("the database cannot store it: {e}");
    let mut object = Map::new();
    let mut spilled_output = None;
    let mut budget = MAX_RESULT_VALUES;
    for (name, raw) in members {
        let text = raw.get().as_bytes();
        let shape = json_shape(text, budget);
        let too_big = shape.values > budget || shape.depth > MAX_DEPTH;
        if name == "output" && (text.len() > OUTPUT_KEPT_AS_TEXT || too_big) {
            spilled_output = Some(text.to_vec());
            continue;
        }
        if shape.values > budget {
            return Err(format!(
                "it holds more than {MAX_RESULT_VALUES} JSON values (by member {name:?}); a result holds at most that many besides an output of more than {OUTPUT_KEPT_AS_TEXT} bytes, which is kept as JSON text"
            ));
        }
        if shape.depth > MAX_DEPTH {
            return Err(format!(
                "member {name:?} nests {} levels deep; the database stores at most {MAX_DEPTH}",
                shape.depth
            ));
        }
        budget -= shape.values;
        let value: Value =
            serde_json::from_str(raw.get()).map_err(|e| format!("it is not valid JSON ({e})"))?;
        disbatch_model::text::client_json::check_encodable_keys(&value, &format!("result.{name}"))
            .map_err(unstorable)?;
        object.insert(name, value);
    }
    let mut record = bson::to_document(&object).map_err(|e| unstorable(e.to_string()))?;
    let size = |d: &Document| {
        bson::to_vec(d)
            .map(|v| v.len() as u64)
            .map_err(|e| unstorable(e.to_string()))
    };
    // Past the bound the output goes to GridFS as JSON text, as stdout does past its own;
    // what is left must fit the record.
    if size(&record)? > RESULT_INLINE_LIMIT {
        if let Some(output) = object.get("output") {
            let json = serde_json::to_vec(output).map_err(|e| unstorable(e.to_string()))?;
            record.remove("output");
            spilled_output = Some(json);
        }
        let rest = size(&record)?;
        let room = RESULT_INLINE_LIMIT.min(MAX_DOCUMENT_SIZE - RECORD_FIELDS);
        if rest > room {
            let besides = if spilled_output.is_some() {
                " besides its output, which goes to GridFS"
            } else {
                ""
            };
            return Err(format!(
                "it is {rest} bytes as a document{besides}, beyond the {room} an attempt record holds"
            ));
        }
    }
    let status = match object.get("status") {
        None | Some(Value::Null) => None,
        Some(v) => Some(plugin_status(v)?),
    };
    let retry = match object.get("retry") {
        Some(Value::Bool(true)) => {
            let delay = match object.get("delay") {
                None | Some(Value::Null) => 0.0,
                Some(v) => v
                    .as_f64()
                    .filter(|d| d.is_finite() && *d >= 0.0 && *d <= 365.0 * 86_400.0)
                    .ok_or("\"delay\" must be a number of seconds between 0 and a year")?,
            };
            Some(Duration::from_secs_f64(delay))
        }
        _ => None,
    };
    let refuses_retry = matches!(object.get("retry"), Some(Value::Bool(false)));
    Ok(Some(ResultFile {
        status,
        retry,
        refuses_retry,
        object,
        record,
        spilled_output,
    }))
}

/// The output a success chains from: the result's, or one kept as JSON text, read now if it
/// holds at most `MAX_CHAINED_VALUES` values (units for a `then` queue: bounded as what a
/// client may create in one request).
pub fn chained_output<'a>(
    result: Option<&'a Map<String, Value>>,
    kept_as_text: Option<&[u8]>,
) -> Result<Option<std::borrow::Cow<'a, Value>>, String> {
    if let Some(output) = result.and_then(|m| m.get("output")) {
        return Ok(Some(std::borrow::Cow::Borrowed(output)));
    }
    let Some(text) = kept_as_text else {
        return Ok(None);
    };
    if json_shape(text, MAX_CHAINED_VALUES).values > MAX_CHAINED_VALUES {
        return Err(format!(
            "the output holds more than {MAX_CHAINED_VALUES} JSON values, more than a chain takes; nothing was chained"
        ));
    }
    serde_json::from_slice(text)
        .map(|v| Some(std::borrow::Cow::Owned(v)))
        .map_err(|e| format!("the output cannot be read back ({e}); nothing was chained"))
}

/// A result's `status`: a whole number from 1 (succeeded) up; 2.0 is 2, as a plugin in a
/// language without integers writes it.
fn plugin_status(v: &Value) -> Result<i32, String> {
    let whole = match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 1e18)
                .map(|f| f as i64)
        }),
        _ => None,
    };
    whole
        .filter(|s| (1..=i64::from(i32::MAX)).contains(s))
        .map(|s| s as i32)
        .ok_or_else(|| {
            let mut shown = v.to_string();
            if shown.len() > 40 {
                let cut = (0..=40)
                    .rev()
                    .find(|i| shown.is_char_boundary(*i))
                    .unwrap_or(0);
                shown.truncate(cut);
                shown.push('…');
            }
            format!(
                "\"status\" must be a whole number from 1 (succeeded) to {}, not {shown}",
                i32::MAX
            )
        })
}

/// Applies the queue's retry policy to an attempt's end: a failure it covers is queued again
/// after its wait, or discarded once attempts run out; a retry the plugin asked for counts
/// against `max_attempts` too. `failure` is None for an end no policy retries (a cancel).
/// Returns the end and the line that says what followed, for the task's stderr and the
/// attempt's reason.
pub fn follow_retry_policy(
    end: TaskEnd,
    failure: Option<FailureKind>,
    refuses_retry: bool,
    policy: Option<&RetryPolicy>,
    attempt: i64,
    task: ObjectId,
    now: DateTime,
) -> (TaskEnd, Option<String>) {
    let Some(p) = policy else {
        return (end, None);
    };
    let max = p.max_attempts;
    match (end, failure) {
        (TaskEnd::Status(s), Some(kind)) if s >= status::FAILED => {
            let kind_name = kind.as_str();
            if refuses_retry && p.retries(kind) {
                return (
                    TaskEnd::Discarded(s),
                    Some(format!(
                        "{kind_name} on attempt {attempt} of {max}; the plugin refused a retry (\"retry\": false): discarded"
                    )),
                );
            }
            match p.decide(kind, attempt, &task) {
                RetryDecision::Retry(wait) => (
                    TaskEnd::Retry {
                        not_before: Some(DateTime::from_millis(
                            now.timestamp_millis()
                                .saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)),
                        )),
                        keep_key_slot: false,
                    },
                    Some(format!(
                        "{kind_name} on attempt {attempt} of {max}; retrying in {:.1} s",
                        wait.as_secs_f64()
                    )),
                ),
                RetryDecision::Discard => (
                    TaskEnd::Discarded(s),
                    Some(format!(
                        "{kind_name} on attempt {attempt} of {max}: out of attempts, discarded"
                    )),
                ),
                RetryDecision::NotCovered => (end, None),
            }
        }
        (TaskEnd::Retry { .. }, _) if !p.allows_another(attempt) => (
            TaskEnd::Discarded(status::FAILED),
            Some(format!(
                "the plugin asked for a retry, but attempt {attempt} was the last of {max} (retry.max_attempts): discarded"
            )),
        ),
        _ => (end, None),
    }
}

fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_map_to_disbatch_statuses() {
        assert_eq!(
            decide(Exit::Code(0), None),
            Outcome {
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
}
