//! Disbatch's `attributes` (Perl MongoClient options): TLS here, the rest in `driver_options`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::driver_options::DriverOptions;
use super::files::resolve;
use super::perl_bool::perl_bool;

/// The SSL options Disbatch's `ssl: {…}` form may hold, under `attributes.ssl` or `attributes.tls`.
const SSL_KEYS: [&str; 3] = ["SSL_ca_file", "SSL_cert_file", "SSL_verify_mode"];

/// Every key `attributes` takes, as `attributes.<key>` (and `attributes.ssl.SSL_ca_file`…).
pub(super) fn accepted_keys() -> Vec<String> {
    let mut keys: Vec<String> = TlsSettings::KEYS
        .iter()
        .chain(DriverOptions::KEYS)
        .map(|k| format!("attributes.{k}"))
        .collect();
    for parent in ["ssl", "tls"] {
        keys.extend(SSL_KEYS.iter().map(|k| format!("attributes.{parent}.{k}")));
    }
    keys
}

/// Reads `attributes`: TLS settings and the other driver options, warning once about the
/// keys that cannot be applied.
pub(super) fn read(
    attrs: &Value,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<(TlsSettings, DriverOptions), String> {
    let Value::Object(map) = attrs else {
        return Err("key `attributes` must be an object".into());
    };
    let tls = TlsSettings::from_attributes(map, base, warnings)?;
    let others = map
        .iter()
        .filter(|(k, _)| !TlsSettings::KEYS.contains(&k.as_str()));
    let (driver, ignored) = DriverOptions::from_attributes(others)?;
    if !ignored.is_empty() {
        warnings.push(format!(
            "`attributes` not applied, as this implementation cannot: {}",
            ignored.join(", ")
        ));
    }
    Ok((tls, driver))
}

/// TLS settings for the MongoDB connection, from `attributes` (options in the URI also apply).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub enabled: bool,
    pub ca_file: Option<PathBuf>,
    pub cert_key_file: Option<PathBuf>,
    pub allow_invalid_certificates: bool,
}

impl TlsSettings {
    const KEYS: [&'static str; 5] = [
        "ssl",
        "tls",
        "tls_ca_file",
        "tls_certificate_key_file",
        "tls_allow_invalid_certificates",
    ];

    /// Accepts Disbatch's forms (`ssl: 1`, `ssl: {SSL_ca_file}`, `ssl: {SSL_verify_mode: 0}`)
    /// and plain keys (`tls`, `tls_ca_file`, `tls_certificate_key_file`,
    /// `tls_allow_invalid_certificates`).
    fn from_attributes(
        map: &serde_json::Map<String, Value>,
        base: &Path,
        warnings: &mut Vec<String>,
    ) -> Result<Self, String> {
        let mut tls = TlsSettings::default();
        for (key, value) in map {
            let at = |what: &str| format!("key `attributes.{key}`: {what}");
            match key.as_str() {
                "ssl" | "tls" => {
                    match value {
                        Value::Object(ssl) => {
                            tls.enabled = true;
                            tls.apply_perl_ssl_options(ssl, base, key, warnings)?;
                        }
                        // Perl's truth for a number, as before: `ssl: 2` is on.
                        Value::Number(n) => tls.enabled = n.as_f64().unwrap_or(0.0) != 0.0,
                        other => tls.enabled = perl_bool(other).ok_or_else(|| {
                            at("must be true/false, 1/0, \"1\"/\"0\" or an object of SSL options")
                        })?,
                    }
                }
                "tls_ca_file" => tls.ca_file = Some(resolve(base, string(value, &at)?)),
                "tls_certificate_key_file" => {
                    tls.cert_key_file = Some(resolve(base, string(value, &at)?))
                }
                "tls_allow_invalid_certificates" => {
                    tls.allow_invalid_certificates =
                        perl_bool(value).ok_or_else(|| at(super::perl_bool::EXPECTED))?
                }
                _ => {}
            }
        }
        if tls.ca_file.is_some() || tls.cert_key_file.is_some() || tls.allow_invalid_certificates {
            tls.enabled = true;
        }
        Ok(tls)
    }

    fn apply_perl_ssl_options(
        &mut self,
        ssl: &serde_json::Map<String, Value>,
        base: &Path,
        parent: &str,
        warnings: &mut Vec<String>,
    ) -> Result<(), String> {
        for (key, value) in ssl {
            let at = |what: &str| format!("key `attributes.{parent}.{key}`: {what}");
            if !SSL_KEYS.contains(&key.as_str()) {
                warnings.push(format!(
                    "SSL option `attributes.{parent}.{key}` is not supported and is ignored"
                ));
                continue;
            }
            match key.as_str() {
                "SSL_ca_file" => self.ca_file = Some(resolve(base, string(value, &at)?)),
                "SSL_cert_file" => self.cert_key_file = Some(resolve(base, string(value, &at)?)),
                "SSL_verify_mode" => {
                    let mode = value
                        .as_i64()
                        .ok_or_else(|| at("must be an integer (0 turns verification off)"))?;
                    self.allow_invalid_certificates = mode == 0;
                }
                // Not in SSL_KEYS: warned about above.
                _ => {}
            }
        }
        Ok(())
    }
}

fn string<'a>(value: &'a Value, at: &dyn Fn(&str) -> String) -> Result<&'a str, String> {
    value.as_str().ok_or_else(|| at("must be a string"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each SSL option the reader lists has an arm that reads it: a null is refused.
    #[test]
    fn every_listed_ssl_option_is_read_by_an_arm_of_its_own() {
        for key in SSL_KEYS {
            let ssl = serde_json::json!({ key: null })
                .as_object()
                .cloned()
                .unwrap_or_default();
            let mut warnings = Vec::new();
            let read = TlsSettings::default().apply_perl_ssl_options(
                &ssl,
                Path::new("/"),
                "ssl",
                &mut warnings,
            );
            assert!(read.is_err(), "attributes.ssl.{key}: null was taken");
            assert!(warnings.is_empty(), "{warnings:?}");
        }
    }
}
