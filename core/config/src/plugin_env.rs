//! Which environment variables of a node reach its plugins: a fixed base set plus the
//! config's `plugin_env` names (a trailing `*` allows a prefix).

/// Enough for ordinary programs to run and format text; nothing that carries credentials.
const BASE: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LC_*",
];

/// The allow-list; everything else in the node's environment is withheld.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginEnv {
    patterns: Vec<String>,
}

impl Default for PluginEnv {
    fn default() -> Self {
        PluginEnv {
            patterns: BASE.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl PluginEnv {
    /// The base set plus `extra` names; a name must be a plain variable name, optionally
    /// ending in `*`.
    pub fn with_extra(extra: &[String]) -> Result<PluginEnv, String> {
        let mut env = PluginEnv::default();
        for (i, name) in extra.iter().enumerate() {
            let stem = name.strip_suffix('*').unwrap_or(name);
            let valid = !stem.is_empty()
                && stem.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !stem.as_bytes()[0].is_ascii_digit();
            if !valid {
                return Err(format!(
                    "item {i} ({name:?}) must be an environment variable name, optionally ending in *"
                ));
            }
            env.patterns.push(name.clone());
        }
        Ok(env)
    }

    pub fn allows(&self, name: &str) -> bool {
        // The runner sets its own DISBATCH_* variables; inherited ones could mislead a plugin.
        if name.starts_with("DISBATCH_") {
            return false;
        }
        self.patterns.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == p,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_set_passes_and_secrets_do_not() {
        let env = PluginEnv::default();
        assert!(env.allows("PATH"));
        assert!(env.allows("LC_ALL"));
        assert!(!env.allows("AWS_SECRET_ACCESS_KEY"));
        assert!(!env.allows("MONGODB_URI"));
        assert!(!env.allows("DISBATCH_TOKEN"));
    }

    #[test]
    fn extra_names_and_prefixes_are_added() {
        let env = PluginEnv::with_extra(&["PYTHONPATH".into(), "APP_*".into()]).unwrap();
        assert!(env.allows("PYTHONPATH"));
        assert!(env.allows("APP_MODE"));
        assert!(!env.allows("APPX"));
        assert!(!env.allows("DISBATCH_X"), "DISBATCH_* is the runner's own");
    }

    #[test]
    fn bad_names_are_refused() {
        for bad in ["", "*", "A B", "1X", "X=Y", "PATH\0"] {
            let e = PluginEnv::with_extra(&[bad.to_string()]).unwrap_err();
            assert!(e.contains("item 0"), "{bad:?}: {e}");
        }
    }
}
