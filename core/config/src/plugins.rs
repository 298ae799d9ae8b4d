//! Which plugins a node may run and where their executables are (`plugins`, `plugin_dirs`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Why a queue's plugin cannot be run on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    #[error("plugin name {0:?} is not valid: use letters, digits, '_', ':', '.' or '-', without '..', at most 200 characters")]
    BadName(String),
    #[error("plugin {0:?} is not listed in this node's `plugins` config")]
    NotListed(String),
    #[error("plugin {name:?} was not found in plugin_dirs ({})", dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "))]
    NotFound { name: String, dirs: Vec<PathBuf> },
    #[error("plugin {name:?}: {} is not an executable file", path.display())]
    NotExecutable { name: String, path: PathBuf },
}

/// The plugins allowed on this node: each listed name with its executable, if configured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginTable {
    /// Name → explicit path; `None` means "look for a file of that name in `dirs`".
    entries: BTreeMap<String, Option<PathBuf>>,
    dirs: Vec<PathBuf>,
}

impl PluginTable {
    /// Builds the table from `plugins`: a Disbatch array of names, or an object name → path.
    pub fn from_config(
        value: Option<&Value>,
        dirs: Vec<PathBuf>,
        base: &Path,
    ) -> Result<Self, String> {
        let mut entries = BTreeMap::new();
        match value {
            None | Some(Value::Null) => {}
            Some(Value::Array(names)) => {
                for (i, name) in names.iter().enumerate() {
                    let name = name
                        .as_str()
                        .ok_or_else(|| format!("item {i} must be a plugin name string"))?;
                    validate_plugin_name(name).map_err(|e| e.to_string())?;
                    entries.insert(name.to_string(), None);
                }
            }
            Some(Value::Object(map)) => {
                for (name, path) in map {
                    validate_plugin_name(name).map_err(|e| e.to_string())?;
                    let path = match path {
                        Value::Null => None,
                        Value::String(p) if !p.is_empty() => Some(super::resolve_path(base, p)),
                        _ => {
                            return Err(format!(
                                "{name:?} must map to an executable path (a string) or null"
                            ))
                        }
                    };
                    entries.insert(name.clone(), path);
                }
            }
            Some(_) => return Err(
                "must be an array of plugin names or an object mapping names to executable paths"
                    .into(),
            ),
        }
        Ok(PluginTable { entries, dirs })
    }

    /// Allowed plugin names, sorted (what `GET /plugins` reports).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn is_listed(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Finds the executable for a plugin, checking every rule a task runner relies on.
    pub fn resolve(&self, name: &str) -> Result<PathBuf, PluginError> {
        validate_plugin_name(name)?;
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| PluginError::NotListed(name.to_string()))?;
        let path = match entry {
            Some(path) => path.clone(),
            None => self
                .dirs
                .iter()
                .map(|d| d.join(name))
                .find(|p| p.exists())
                .ok_or_else(|| PluginError::NotFound {
                    name: name.to_string(),
                    dirs: self.dirs.clone(),
                })?,
        };
        if is_executable_file(&path) {
            Ok(path)
        } else {
            Err(PluginError::NotExecutable {
                name: name.to_string(),
                path,
            })
        }
    }
}

/// Plugin names reach the file system, so separators, `..` and control bytes are refused.
pub fn validate_plugin_name(name: &str) -> Result<(), PluginError> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && !name.contains("..")
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(PluginError::BadName(name.to_string()))
    }
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_with_separators_dots_or_nul_are_refused() {
        for bad in [
            "", "a/b", "../x", "a..b", ".hidden", "-x", "a\0b", "a b", "é",
        ] {
            assert!(
                validate_plugin_name(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
        for good in ["Disbatch::Plugin::Demo", "demo", "my-plugin.v2", "x_1"] {
            assert!(
                validate_plugin_name(good).is_ok(),
                "{good:?} should be accepted"
            );
        }
    }

    #[test]
    fn resolves_listed_plugins_from_dirs_and_explicit_paths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let exe = dir.path().join("demo");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "data").expect("write");

        let table = PluginTable::from_config(
            Some(&json!(["demo", "missing", "plain"])),
            vec![dir.path().to_path_buf()],
            dir.path(),
        )
        .expect("table");
        assert_eq!(table.resolve("demo"), Ok(exe.clone()));
        assert!(matches!(
            table.resolve("missing"),
            Err(PluginError::NotFound { .. })
        ));
        assert!(matches!(
            table.resolve("plain"),
            Err(PluginError::NotExecutable { .. })
        ));
        assert!(matches!(
            table.resolve("other"),
            Err(PluginError::NotListed(_))
        ));

        let table = PluginTable::from_config(
            Some(&json!({"Disbatch::Plugin::Demo": "demo"})),
            vec![],
            dir.path(),
        )
        .expect("table");
        assert_eq!(table.resolve("Disbatch::Plugin::Demo"), Ok(exe));
        assert_eq!(
            table.names().collect::<Vec<_>>(),
            vec!["Disbatch::Plugin::Demo"]
        );
    }

    #[test]
    fn malformed_plugins_values_are_refused_with_the_reason() {
        let base = Path::new("/");
        assert!(PluginTable::from_config(Some(&json!("demo")), vec![], base).is_err());
        assert!(PluginTable::from_config(Some(&json!([1])), vec![], base).is_err());
        assert!(PluginTable::from_config(Some(&json!({"x": 5})), vec![], base).is_err());
        assert!(PluginTable::from_config(Some(&json!(["../evil"])), vec![], base).is_err());
    }
}
