//! `GET /tasks`' additive filters: status words, time ranges, `limit`, and the bounded scan.

use bson::DateTime;
use disbatch_store::failures::{StatusWord, MAX_SCAN_LIMIT};
use disbatch_store::SearchTerms;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// The filter terms a search takes beside Disbatch's field equality.
#[derive(Debug, Default)]
pub struct Extras {
    /// A time range among them bounds a search no index serves.
    pub terms: SearchTerms,
    /// `limit` (no dot): the new syntax's bound, at most `MAX_SCAN_LIMIT`. Disbatch's `.limit`
    /// bounds nothing: its Perl CLI always sends one, and Disbatch refused such searches.
    pub limit: Option<i64>,
}

/// Takes `status` (when a word), `since`, `until`, `created_since`, `created_until` and
/// `limit` out of `fields`. A numeric status stays
/// a field, as Disbatch searched it; a word that names one code becomes that code.
pub fn take_extras(fields: &mut Map<String, Value>) -> Result<Extras, ApiError> {
    let mut extras = Extras::default();
    if let Some(Value::String(s)) = fields.get("status") {
        let word = s.trim().to_ascii_lowercase();
        let numeric = word
            .trim_start_matches('-')
            .chars()
            .all(|c| c.is_ascii_digit());
        if !word.is_empty() && !numeric {
            match StatusWord::parse(&word) {
                Some(StatusWord::Code(c)) => {
                    fields.insert("status".into(), Value::from(c));
                }
                Some(w) => {
                    fields.remove("status");
                    extras.terms.status = Some(w);
                }
                None => {
                    return Err(ApiError::bad_request(format!(
                        "status {s:?} is not a status word: use a code or one of {}",
                        StatusWord::WORDS.join(", ")
                    )))
                }
            }
        }
    }
    extras.limit = match fields.remove("limit") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                .filter(|n| (1..=MAX_SCAN_LIMIT).contains(n))
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "limit must be an integer from 1 to {MAX_SCAN_LIMIT}, not {v}"
                    ))
                })?,
        ),
    };
    extras.terms.since = date(fields.remove("since"), "since")?;
    extras.terms.until = date(fields.remove("until"), "until")?;
    extras.terms.created_since = date(fields.remove("created_since"), "created_since")?;
    extras.terms.created_until = date(fields.remove("created_until"), "created_until")?;
    Ok(extras)
}

/// Whether a search filters on nothing but creation time (`_id` ranges): the searches the
/// `_id` index serves newest first, whatever the size of the history.
pub fn creation_range_only(fields: &Map<String, Value>, extras: &Extras) -> bool {
    fields.is_empty() && extras.terms.creation_range_only()
}

/// A search some index does not serve runs only when bounded: a time range, or a `limit`
/// (a count has no limit, so it needs the range).
pub fn check_bounded(invalid: &[String], extras: &Extras, count: bool) -> Result<(), String> {
    if invalid.is_empty() || extras.terms.ranged() || (!count && extras.limit.is_some()) {
        return Ok(());
    }
    let fields = invalid.join(", ");
    let verb = if invalid.len() == 1 { "is" } else { "are" };
    Err(if count {
        format!(
            "{fields} {verb} not indexed: add a time range (since/until) so the count is bounded"
        )
    } else {
        format!(
            "{fields} {verb} not indexed: add a time range (since/until) or a limit of at most {MAX_SCAN_LIMIT} so the scan is bounded"
        )
    })
}

const DATE_FORMS: &str = "an ISO-8601 UTC time (\"2030-01-01T00:00:00Z\"), epoch seconds, or a span back from now (\"90s\", \"30m\", \"2h\", \"7d\")";

fn date(v: Option<Value>, name: &str) -> Result<Option<DateTime>, ApiError> {
    let bad = |v: &Value| ApiError::bad_request(format!("{name} must be {DATE_FORMS}, not {v}"));
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => {
            // Back from now on the fleet's clock (the database server's), as every DEN reads
            // time: "the last hour" is the same hour whichever host asks.
            if let Some(back) = span_back(s.trim()) {
                let now = disbatch_model::fleet_time::now().timestamp_millis();
                let ms = i64::try_from(back.as_millis()).unwrap_or(i64::MAX);
                return Ok(Some(DateTime::from_millis(now.saturating_sub(ms))));
            }
            if let Ok(secs) = s.trim().parse::<f64>() {
                return seconds(secs)
                    .map(Some)
                    .ok_or_else(|| bad(&Value::String(s)));
            }
            DateTime::parse_rfc3339_str(&s)
                .or_else(|_| DateTime::parse_rfc3339_str(format!("{s}Z")))
                .map(Some)
                .map_err(|_| bad(&Value::String(s)))
        }
        Some(Value::Number(n)) => n
            .as_f64()
            .and_then(seconds)
            .map(Some)
            .ok_or_else(|| bad(&Value::Number(n))),
        Some(other) => Err(bad(&other)),
    }
}

/// "90s", "30m", "2h", "7d", "1w": a span of at most 100 years, or None.
fn span_back(s: &str) -> Option<std::time::Duration> {
    let unit = s.chars().last()?;
    let per = match unit {
        's' => 1.0,
        'm' => 60.0,
        'h' => 3600.0,
        'd' => 86_400.0,
        'w' => 604_800.0,
        _ => return None,
    };
    let n: f64 = s[..s.len() - unit.len_utf8()].trim().parse().ok()?;
    let secs = n * per;
    (secs.is_finite() && (0.0..=100.0 * 365.25 * 86_400.0).contains(&secs))
        .then(|| std::time::Duration::from_secs_f64(secs))
}

fn seconds(s: f64) -> Option<DateTime> {
    // Beyond about ±292 million years milliseconds overflow an i64.
    (s.is_finite() && s.abs() < 9.0e12).then(|| DateTime::from_millis((s * 1000.0) as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spans_back_from_now_are_read_in_their_units() {
        use std::time::Duration;
        assert_eq!(span_back("90s"), Some(Duration::from_secs(90)));
        assert_eq!(span_back("30m"), Some(Duration::from_secs(1800)));
        assert_eq!(span_back("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(span_back("7d"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(span_back("1w"), Some(Duration::from_secs(604_800)));
        for bad in ["", "h", "-1h", "1y", "NaNh", "infd", "1e12d", "12"] {
            assert_eq!(span_back(bad), None, "{bad:?}");
        }
        let before = disbatch_model::fleet_time::now().timestamp_millis();
        let back = date(Some(Value::from("1h")), "since")
            .expect("a span")
            .expect("a date")
            .timestamp_millis();
        let after = disbatch_model::fleet_time::now().timestamp_millis();
        assert!(
            (before - 3_600_000..=after - 3_600_000).contains(&back),
            "{before} {back} {after}"
        );
        let err = date(Some(Value::from("yesterday")), "since").unwrap_err();
        assert!(
            format!("{err:?}").contains("a span back from now"),
            "{err:?}"
        );
    }

    #[test]
    fn words_become_terms_and_codes() {
        let mut f = json!({"status": "failed", "since": "2026-01-01T00:00:00Z"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        let e = take_extras(&mut f).expect("extras");
        assert!(f.is_empty());
        assert!(e.terms.ranged());
        assert_eq!(e.terms.status, Some(StatusWord::Failed));
        assert!(e.terms.since.is_some());
        let mut f = json!({"status": "queued"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        take_extras(&mut f).expect("extras");
        assert_eq!(f["status"], json!(-2));
        let mut f = json!({"status": "2"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        take_extras(&mut f).expect("extras");
        assert_eq!(f["status"], json!("2"));
        let mut f = json!({"status": "bogus"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(take_extras(&mut f).is_err());
        let mut f = json!({"since": "yesterday"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(take_extras(&mut f).is_err());
    }

    #[test]
    fn unindexed_needs_a_bound() {
        let none = Extras::default();
        let invalid = vec!["params.text".to_string()];
        let msg = check_bounded(&invalid, &none, false).expect_err("unbounded");
        assert!(
            msg.starts_with("params.text is not indexed: add a time range"),
            "{msg}"
        );
        let limited = Extras {
            limit: Some(10),
            ..Extras::default()
        };
        assert!(check_bounded(&invalid, &limited, false).is_ok());
        assert!(check_bounded(&invalid, &limited, true).is_err());
        let ranged = Extras {
            terms: SearchTerms {
                until: Some(DateTime::now()),
                ..SearchTerms::default()
            },
            ..Extras::default()
        };
        assert!(check_bounded(&invalid, &ranged, true).is_ok());
        let mut f = json!({"limit": 1001})
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(take_extras(&mut f).is_err());
        let mut f = json!({"limit": "5"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert_eq!(take_extras(&mut f).expect("limit").limit, Some(5));
    }
}
