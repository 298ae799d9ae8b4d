//! Retention: how long ended tasks are kept, per state, from a queue's `retain` field over the
//! leader's config default. Unset means kept for ever, as Disbatch keeps them.

use std::time::Duration;

use bson::{Bson, Document};

/// The longest retention that can be set: a hundred years, in seconds.
pub const MOST_SECONDS: u64 = 100 * 366 * 24 * 3600;

/// The states retention applies to, each with its key in `retain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ended {
    /// Status 1.
    Succeeded,
    /// Status 2 and the plugins' codes above it, discarded tasks among them.
    Failed,
    /// Cancelled (-5) and terminated (-3).
    Cancelled,
}

impl Ended {
    pub const ALL: [Ended; 3] = [Ended::Succeeded, Ended::Failed, Ended::Cancelled];

    /// Its key in a `retain` document.
    pub fn key(self) -> &'static str {
        match self {
            Ended::Succeeded => "succeeded_s",
            Ended::Failed => "failed_s",
            Ended::Cancelled => "cancelled_s",
        }
    }

    /// Its label in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Succeeded => "succeeded",
            Ended::Failed => "failed",
            Ended::Cancelled => "cancelled",
        }
    }
}

/// How long each ended state is kept; None keeps it for ever.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    pub succeeded: Option<Duration>,
    pub failed: Option<Duration>,
    pub cancelled: Option<Duration>,
}

/// One state's setting in a `retain` document: absent (the default applies), kept for ever
/// (`null`), or a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    Default,
    Forever,
    Keep(Duration),
}

impl Retention {
    pub fn get(&self, state: Ended) -> Option<Duration> {
        match state {
            Ended::Succeeded => self.succeeded,
            Ended::Failed => self.failed,
            Ended::Cancelled => self.cancelled,
        }
    }

    fn set(&mut self, state: Ended, keep: Option<Duration>) {
        match state {
            Ended::Succeeded => self.succeeded = keep,
            Ended::Failed => self.failed = keep,
            Ended::Cancelled => self.cancelled = keep,
        }
    }

    /// Whether any state is pruned at all.
    pub fn prunes(&self) -> bool {
        Ended::ALL.iter().any(|s| self.get(*s).is_some())
    }

    /// A `retain` value (`{"succeeded_s": 86400, "failed_s": null}`) read alone: keys absent or
    /// null keep their state for ever. For a node's config default.
    pub fn parse(value: &Bson, field: &str) -> Result<Retention, String> {
        let mut out = Retention::default();
        for (state, setting) in settings(value, field)? {
            if let Setting::Keep(d) = setting {
                out.set(state, Some(d));
            }
        }
        Ok(out)
    }

    /// A queue's `retain` over `default`: a key the queue sets wins (null keeps for ever), an
    /// absent one takes the default's.
    pub fn for_queue(
        queue: &Document,
        field: &str,
        default: &Retention,
    ) -> Result<Retention, String> {
        let Some(value) = queue.get(field).filter(|v| !matches!(v, Bson::Null)) else {
            return Ok(*default);
        };
        let mut out = *default;
        for (state, setting) in settings(value, field)? {
            match setting {
                Setting::Default => {}
                Setting::Forever => out.set(state, None),
                Setting::Keep(d) => out.set(state, Some(d)),
            }
        }
        Ok(out)
    }
}

fn settings(value: &Bson, field: &str) -> Result<Vec<(Ended, Setting)>, String> {
    let Bson::Document(d) = value else {
        return Err(format!(
            "{field} must be an object such as {{\"succeeded_s\": 86400}}, found {value}"
        ));
    };
    if let Some(k) = d
        .keys()
        .find(|k| !Ended::ALL.iter().any(|s| s.key() == k.as_str()))
    {
        return Err(format!(
            "{field}.{k} is unknown: the keys are succeeded_s, failed_s and cancelled_s"
        ));
    }
    Ended::ALL
        .iter()
        .map(|state| {
            let key = state.key();
            let setting = match d.get(key) {
                None => Setting::Default,
                Some(Bson::Null) => Setting::Forever,
                Some(v) => Setting::Keep(seconds(v).ok_or_else(|| {
                    format!(
                        "{field}.{key} must be a whole number of seconds from 0 to {MOST_SECONDS}, or null to keep for ever; found {v}"
                    )
                })?),
            };
            Ok((*state, setting))
        })
        .collect()
}

fn seconds(v: &Bson) -> Option<Duration> {
    let n = match v {
        Bson::Int32(n) => u64::try_from(*n).ok()?,
        Bson::Int64(n) => u64::try_from(*n).ok()?,
        Bson::Double(f) if f.is_finite() && f.fract() == 0.0 && *f >= 0.0 => *f as u64,
        _ => return None,
    };
    (n <= MOST_SECONDS).then(|| Duration::from_secs(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{bson, doc};

    #[test]
    fn a_queue_sets_states_over_the_default_and_null_keeps_for_ever() {
        let default =
            Retention::parse(&bson!({"succeeded_s": 86400, "failed_s": 604800}), "retain")
                .expect("default");
        assert_eq!(default.succeeded, Some(Duration::from_secs(86400)));
        assert_eq!(default.cancelled, None);
        assert!(default.prunes());
        let q = doc! {"retain": {"succeeded_s": 60, "failed_s": null, "cancelled_s": 5.0}};
        let r = Retention::for_queue(&q, "retain", &default).expect("queue");
        assert_eq!(
            r,
            Retention {
                succeeded: Some(Duration::from_secs(60)),
                failed: None,
                cancelled: Some(Duration::from_secs(5)),
            }
        );
        assert_eq!(
            Retention::for_queue(&doc! {}, "retain", &default),
            Ok(default)
        );
        assert_eq!(
            Retention::for_queue(&doc! {"retain": null}, "retain", &default),
            Ok(default)
        );
        assert!(!Retention::default().prunes());
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        for (value, says) in [
            (bson!("1d"), "must be an object"),
            (bson!({"succeeded": 5}), "retain.succeeded is unknown"),
            (
                bson!({"succeeded_s": -1}),
                "retain.succeeded_s must be a whole number",
            ),
            (bson!({"failed_s": 1.5}), "retain.failed_s"),
            (bson!({"failed_s": "60"}), "retain.failed_s"),
            (bson!({"cancelled_s": 1e300}), "retain.cancelled_s"),
        ] {
            let e = Retention::parse(&value, "retain").expect_err("refused");
            assert!(e.contains(says), "{value}: {e}");
        }
    }
}
