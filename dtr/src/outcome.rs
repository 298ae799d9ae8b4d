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

/// The plugin's exit and result judged: the final status, any note the runner adds to
/// stderr, and a requested retry.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
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

impl Verdict {
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
pub fn decide(exit: Exit, result_file: Option<&[u8]>) -> Verdict {
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
    Verdict {
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
#[path = "outcome_tests.rs"]
mod tests;
