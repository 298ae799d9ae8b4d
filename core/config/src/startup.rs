//! A binary's start from its config file: the config is read before logging starts, so that
//! its `log_format` and `log_level` apply from the first line.

use crate::process::logging::{init, LogFormat, Logging};

/// A binary's config, read before logging starts so that its `log_format` and `log_level`
/// apply from the first line.
pub struct Started {
    /// The config as read, unvalidated: what a reload compares with.
    pub value: serde_json::Value,
    pub loaded: super::Loaded,
    pub logging: Logging,
    /// The format in force: `--log-format`, else the config's `log_format`, else text.
    pub format: LogFormat,
}

/// Reads and validates the config at `path`, then installs logging in the format `flag`
/// names (else the config's) at the config's level. A config that cannot be loaded still
/// gets logging installed (in `flag`'s format), so its error is written like other lines.
pub fn start_with_config(
    path: &std::path::Path,
    flag: Option<LogFormat>,
) -> crate::error::Result<Started> {
    let loaded = super::Config::read_value(path).and_then(|value| {
        super::Config::from_value(path, value.clone()).map(|loaded| (value, loaded))
    });
    let (value, loaded) = match loaded {
        Ok(found) => found,
        Err(e) => {
            init(flag.unwrap_or_default(), "info");
            return Err(e);
        }
    };
    let format = flag.or(loaded.config.log_format).unwrap_or_default();
    let logging = init(format, loaded.config.log_level.as_deref().unwrap_or("info"));
    Ok(Started {
        value,
        loaded,
        logging,
        format,
    })
}
