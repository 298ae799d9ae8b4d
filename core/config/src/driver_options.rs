//! Disbatch's `attributes` (Perl MongoDB::MongoClient options) the Rust driver also has, read
//! and checked here into plain values; the store lays them onto the driver's `ClientOptions`
//! where the connection is made (`store/conn/driver_options.rs`). TLS is in `attributes.rs`;
//! what the driver lacks is named in one warning.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use super::perl_bool::{perl_bool, EXPECTED};

/// The driver's floor for `heartbeat_frequency_ms`; below it the client cannot be created.
const MIN_HEARTBEAT_MS: u64 = 500;
/// The server's floor for `max_staleness_seconds`; below it every read would fail.
const MIN_STALENESS_SECS: u64 = 90;

/// The `attributes` this implementation applies; any other is warned about, never read.
const KNOWN: &[&str] = &[
    "app_name",
    "connect_timeout_ms",
    "server_selection_timeout_ms",
    "heartbeat_frequency_ms",
    "local_threshold_ms",
    "w",
    "j",
    "wtimeout",
    "read_pref_mode",
    "read_preference",
    "read_pref_tag_sets",
    "max_staleness_seconds",
    "read_concern_level",
    "replica_set_name",
    "retry_reads",
    "retry_writes",
    "username",
    "password",
    "db_name",
    "auth_mechanism",
    "auth_mechanism_properties",
];

/// Perl options the Rust driver has no counterpart for, and why, for the warning.
const UNMAPPED: &[(&str, &str)] = &[
    ("socket_timeout_ms", "the Rust driver has no socket timeout; connect_timeout_ms and server_selection_timeout_ms bound waits"),
    ("max_time_ms", "the Rust driver has no client-wide maxTimeMS"),
    ("compressors", "this build has no wire compression"),
    ("zlib_compression_level", "this build has no wire compression"),
    ("server_selection_try_once", "the driver always retries selection within server_selection_timeout_ms"),
    ("socket_check_interval_ms", "the driver checks connections itself"),
    ("host", "give hosts in `mongohost`"),
    ("port", "give ports in `mongohost`"),
    ("bson_codec", "a Perl object"),
    ("monitoring_callback", "a Perl code reference"),
];

/// The mechanisms this build's driver has, by the names it takes (GSSAPI and MONGODB-AWS need
/// driver features this build leaves out).
const MECHANISMS: [&str; 6] = [
    "SCRAM-SHA-1",
    "SCRAM-SHA-256",
    "MONGODB-CR",
    "MONGODB-X509",
    "PLAIN",
    "MONGODB-OIDC",
];

/// `w`: how many members acknowledge a write, as MongoDB takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteAck {
    Nodes(u32),
    /// `"majority"` or a tag set name.
    Named(String),
}

/// A read preference's mode (Perl's `read_pref_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    Primary,
    PrimaryPreferred,
    Secondary,
    SecondaryPreferred,
    Nearest,
}

/// A read preference: its mode and, except for `Primary`, the tag sets and staleness bound
/// given with it (`options` is None when neither was).
#[derive(Debug, Clone, PartialEq)]
pub struct ReadPreference {
    pub mode: ReadMode,
    pub options: Option<ReadOptions>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReadOptions {
    pub tag_sets: Option<Vec<HashMap<String, String>>>,
    pub max_staleness: Option<Duration>,
}

/// Driver settings from `attributes`; every field unset unless the file gave it.
#[derive(Clone, Default, PartialEq)]
pub struct DriverOptions {
    pub app_name: Option<String>,
    pub connect_timeout: Option<Duration>,
    pub server_selection_timeout: Option<Duration>,
    pub heartbeat_freq: Option<Duration>,
    pub local_threshold: Option<Duration>,
    pub w: Option<WriteAck>,
    pub journal: Option<bool>,
    pub w_timeout: Option<Duration>,
    pub read_preference: Option<ReadPreference>,
    /// The read concern level, one of MongoDB's.
    pub read_concern: Option<String>,
    pub repl_set_name: Option<String>,
    pub retry_reads: Option<bool>,
    pub retry_writes: Option<bool>,
    pub username: Option<String>,
    password: Option<String>,
    /// Where `username` is defined (Perl's `db_name`).
    pub auth_source: Option<String>,
    /// One of `MECHANISMS`, as the driver names it.
    pub auth_mechanism: Option<String>,
    pub auth_mechanism_properties: Option<bson::Document>,
}

/// Read preference parts, combined once all attributes are read.
#[derive(Default)]
struct ReadPref {
    mode: Option<String>,
    tag_sets: Option<Vec<HashMap<String, String>>>,
    max_staleness: Option<Duration>,
}

impl DriverOptions {
    pub(super) const KEYS: &'static [&'static str] = KNOWN;

    /// Reads the driver options among `attributes` (TLS keys excluded by the caller). Keys it
    /// cannot apply are returned with the reason, for one warning.
    pub(super) fn from_attributes<'a>(
        attrs: impl Iterator<Item = (&'a String, &'a Value)>,
    ) -> Result<(Self, Vec<String>), String> {
        let mut o = DriverOptions::default();
        let mut pref = ReadPref::default();
        let mut ignored = Vec::new();
        for (key, value) in attrs {
            if !KNOWN.contains(&key.as_str()) {
                let why = UNMAPPED.iter().find(|(k, _)| k == key).map_or(
                    "not a MongoDB client option this implementation knows",
                    |(_, w)| w,
                );
                ignored.push(format!("`{key}` ({why})"));
                continue;
            }
            let at = |what: &str| format!("key `attributes.{key}`: {what}");
            match key.as_str() {
                "app_name" => o.app_name = Some(text(value, &at)?),
                "connect_timeout_ms" => o.connect_timeout = Some(millis(value, &at)?),
                "server_selection_timeout_ms" => {
                    o.server_selection_timeout = Some(millis(value, &at)?)
                }
                "heartbeat_frequency_ms" => {
                    let freq = millis(value, &at)?;
                    if freq < Duration::from_millis(MIN_HEARTBEAT_MS) {
                        return Err(at(&format!("must be at least {MIN_HEARTBEAT_MS}")));
                    }
                    o.heartbeat_freq = Some(freq);
                }
                "local_threshold_ms" => o.local_threshold = Some(millis(value, &at)?),
                "w" => o.w = Some(acknowledgment(value, &at)?),
                "j" => o.journal = Some(boolean(value, &at)?),
                "wtimeout" => o.w_timeout = Some(millis(value, &at)?),
                "read_pref_mode" | "read_preference" => pref.mode = Some(text(value, &at)?),
                "read_pref_tag_sets" => pref.tag_sets = Some(tag_sets(value, &at)?),
                "max_staleness_seconds" => {
                    let secs = whole(value, &at, "a whole number of seconds")?;
                    // -1 is the Perl driver's "no maximum".
                    if secs != -1 {
                        let secs = u64::try_from(secs)
                            .ok()
                            .filter(|s| *s >= MIN_STALENESS_SECS)
                            .ok_or_else(|| at("must be -1 or at least 90 seconds"))?;
                        pref.max_staleness = Some(Duration::from_secs(secs));
                    }
                }
                "read_concern_level" => o.read_concern = Some(read_concern(value, &at)?),
                "replica_set_name" => o.repl_set_name = Some(text(value, &at)?),
                "retry_reads" => o.retry_reads = Some(boolean(value, &at)?),
                "retry_writes" => o.retry_writes = Some(boolean(value, &at)?),
                "username" => o.username = Some(text(value, &at)?),
                "password" => o.password = Some(text(value, &at)?),
                "db_name" => o.auth_source = Some(text(value, &at)?),
                "auth_mechanism" => {
                    let name = text(value, &at)?;
                    if !MECHANISMS.contains(&name.as_str()) {
                        return Err(at(&format!(
                            "{name:?} is not a mechanism the driver has (one of {})",
                            MECHANISMS.join(", ")
                        )));
                    }
                    o.auth_mechanism = Some(name);
                }
                "auth_mechanism_properties" => {
                    o.auth_mechanism_properties = Some(
                        string_map(value, &at)?
                            .into_iter()
                            .map(|(k, v)| (k, bson::Bson::String(v)))
                            .collect(),
                    )
                }
                // Not in KNOWN: ignored above, so an arm missing from KNOWN is never reached.
                _ => {}
            }
        }
        o.read_preference = pref.build()?;
        Ok((o, ignored))
    }

    /// The password `attributes` gave, for the credential the store builds.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// True when `w`, `j` or `wtimeout` was given.
    pub fn has_write_concern(&self) -> bool {
        self.w.is_some() || self.journal.is_some() || self.w_timeout.is_some()
    }
}

impl std::fmt::Debug for DriverOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverOptions")
            .field("app_name", &self.app_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("server_selection_timeout", &self.server_selection_timeout)
            .field("heartbeat_freq", &self.heartbeat_freq)
            .field("local_threshold", &self.local_threshold)
            .field("w", &self.w)
            .field("journal", &self.journal)
            .field("w_timeout", &self.w_timeout)
            .field("read_preference", &self.read_preference)
            .field("read_concern", &self.read_concern)
            .field("repl_set_name", &self.repl_set_name)
            .field("retry_reads", &self.retry_reads)
            .field("retry_writes", &self.retry_writes)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("auth_source", &self.auth_source)
            .field("auth_mechanism", &self.auth_mechanism)
            .finish_non_exhaustive()
    }
}

impl ReadPref {
    fn build(self) -> Result<Option<ReadPreference>, String> {
        let has_options = self.tag_sets.is_some() || self.max_staleness.is_some();
        let Some(mode) = self.mode else {
            return if has_options {
                Err("key `attributes.read_pref_mode`: required with `read_pref_tag_sets` or `max_staleness_seconds`".into())
            } else {
                Ok(None)
            };
        };
        let options = has_options.then_some(ReadOptions {
            tag_sets: self.tag_sets,
            max_staleness: self.max_staleness,
        });
        // Perl's names are camelCase (`secondaryPreferred`); snake_case is forgiven.
        let pref = match mode.to_ascii_lowercase().replace('_', "").as_str() {
            "primary" if has_options => {
                return Err("key `attributes.read_pref_mode`: `primary` takes no tag sets or staleness".into())
            }
            "primary" => ReadMode::Primary,
            "primarypreferred" => ReadMode::PrimaryPreferred,
            "secondary" => ReadMode::Secondary,
            "secondarypreferred" => ReadMode::SecondaryPreferred,
            "nearest" => ReadMode::Nearest,
            _ => {
                return Err(format!(
                    "key `attributes.read_pref_mode`: {mode:?} is not one of primary, primaryPreferred, secondary, secondaryPreferred or nearest"
                ))
            }
        };
        Ok(Some(ReadPreference {
            mode: pref,
            options,
        }))
    }
}

fn text(value: &Value, at: &dyn Fn(&str) -> String) -> Result<String, String> {
    match value {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        Value::String(_) => Err(at("must not be empty")),
        _ => Err(at("must be a string")),
    }
}

fn boolean(value: &Value, at: &dyn Fn(&str) -> String) -> Result<bool, String> {
    perl_bool(value).ok_or_else(|| at(EXPECTED))
}

/// A whole number, as a JSON number or the digits Perl configs sometimes quote.
fn whole(value: &Value, at: &dyn Fn(&str) -> String, what: &str) -> Result<i64, String> {
    let n = match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    n.ok_or_else(|| at(&format!("must be {what}")))
}

fn millis(value: &Value, at: &dyn Fn(&str) -> String) -> Result<Duration, String> {
    let what = "a whole number of milliseconds";
    let ms = whole(value, at, what)?;
    u64::try_from(ms)
        .map(Duration::from_millis)
        .map_err(|_| at(&format!("must be {what}, not negative")))
}

/// `w`: a number of nodes, `"majority"` or a tag set name, as MongoDB takes it.
fn acknowledgment(value: &Value, at: &dyn Fn(&str) -> String) -> Result<WriteAck, String> {
    match value {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(WriteAck::Nodes)
            .ok_or_else(|| at("must be a number of nodes, \"majority\" or a tag set name")),
        Value::String(s) if s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() => s
            .parse::<u32>()
            .map(WriteAck::Nodes)
            .map_err(|_| at("is too many nodes")),
        Value::String(s) if !s.is_empty() => Ok(WriteAck::Named(s.clone())),
        _ => Err(at(
            "must be a number of nodes, \"majority\" or a tag set name",
        )),
    }
}

fn read_concern(value: &Value, at: &dyn Fn(&str) -> String) -> Result<String, String> {
    const LEVELS: [&str; 5] = ["local", "majority", "linearizable", "available", "snapshot"];
    let level = text(value, at)?;
    if !LEVELS.contains(&level.as_str()) {
        return Err(at(&format!(
            "{level:?} is not one of {}",
            LEVELS.join(", ")
        )));
    }
    Ok(level)
}

fn string_map(
    value: &Value,
    at: &dyn Fn(&str) -> String,
) -> Result<HashMap<String, String>, String> {
    let Value::Object(map) = value else {
        return Err(at("must be an object of strings"));
    };
    map.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(at("must be an object of strings")),
        })
        .collect()
}

fn tag_sets(
    value: &Value,
    at: &dyn Fn(&str) -> String,
) -> Result<Vec<HashMap<String, String>>, String> {
    let Value::Array(sets) = value else {
        return Err(at("must be an array of objects of strings"));
    };
    sets.iter().map(|set| string_map(set, at)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key in `KNOWN` without an arm would be taken and silently do nothing: every known
    /// key's arm reads its value, so a null is refused naming the key.
    #[test]
    fn every_known_attribute_is_read_by_an_arm_of_its_own() {
        for key in KNOWN {
            let attrs = [(key.to_string(), Value::Null)];
            let read = DriverOptions::from_attributes(attrs.iter().map(|(k, v)| (k, v)));
            match read {
                Err(e) => assert!(e.contains(&format!("`attributes.{key}`")), "{key}: {e}"),
                Ok(_) => panic!("attributes.{key}: null was taken, so no arm reads it"),
            }
        }
        let unknown = [("colour".to_string(), Value::Null)];
        let (_, ignored) = DriverOptions::from_attributes(unknown.iter().map(|(k, v)| (k, v)))
            .expect("an unknown key is ignored, not refused");
        assert_eq!(ignored.len(), 1);
    }
}
