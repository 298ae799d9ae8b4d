//! `disbatch create-users`: Disbatch's `disbatch-create-users`, run against MongoDB directly.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use disbatch_config::Config;
use disbatch_store::{self as store, Perms, UserAdmin};

/// Disbatch's default `--plugin_perms`, read when it exists and no file is given.
const DEFAULT_PLUGIN_PERMS: &str = "/etc/disbatch/plugin-permissions.json";

/// The `create-users` options, as parsed.
#[derive(Debug, Clone)]
pub struct Options {
    pub config: PathBuf,
    pub root_user: String,
    pub plugin_perms: Option<PathBuf>,
    pub additional_perms: Option<PathBuf>,
    pub create_root: bool,
    pub drop_roles: bool,
}

/// Everything is checked (config, passwords, permission files) before the root password is
/// read and anything is changed, so a mistake leaves the server as it was.
pub async fn run(
    opts: &Options,
    read_password: impl FnOnce(&str) -> anyhow::Result<String>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let loaded = Config::load(&opts.config)?;
    for warning in &loaded.warnings {
        eprintln!("warning: {warning}");
    }
    let config = loaded.config;
    let passwords = store::passwords(&config)?;
    let plugin_perms = plugin_perms(opts.plugin_perms.as_deref(), out)?;
    let additional = match &opts.additional_perms {
        Some(path) => store::parse_additional(&read(path)?)
            .with_context(|| format!("additional permissions {}", path.display()))?,
        None => Default::default(),
    };
    let roles = store::roles(&plugin_perms, &additional)?;

    let root_password = read_password(&opts.root_user)?;
    if root_password.is_empty() {
        bail!(
            "empty password for root user {:?} (it is read from stdin)",
            opts.root_user
        );
    }
    if opts.create_root {
        UserAdmin::create_root(&config, &opts.root_user, &root_password).await?;
        writeln!(out, "created root user {} in admin", opts.root_user)?;
    }
    let admin = UserAdmin::connect(&config, &opts.root_user, &root_password).await?;
    let database = admin.database_name().to_string();
    if opts.drop_roles {
        for what in admin.drop_all().await? {
            writeln!(out, "dropped {what} in {database}")?;
        }
    }
    let existing = admin.existing().await?;
    if !existing.is_empty() {
        bail!(
            "already in database {database}: {}; nothing was created (--drop-roles replaces them)",
            existing.join(", ")
        );
    }
    for (role, (_, password)) in roles.iter().zip(&passwords) {
        admin.create(role, password).await?;
        writeln!(
            out,
            "created role and user {} in {database}: {}",
            role.name,
            role.describe()
        )?;
    }
    Ok(())
}

fn plugin_perms(path: Option<&Path>, out: &mut dyn Write) -> anyhow::Result<Perms> {
    let default = Path::new(DEFAULT_PLUGIN_PERMS);
    let path = match path {
        Some(p) => p,
        None if default.exists() => default,
        None => {
            writeln!(
                out,
                "no plugin permissions file ({DEFAULT_PLUGIN_PERMS} does not exist): the plugin role gets no privileges"
            )?;
            return Ok(Perms::new());
        }
    };
    store::parse_perms(&read(path)?)
        .with_context(|| format!("plugin permissions {}", path.display()))
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The root password: without echo from a terminal, else the first line of stdin.
pub fn read_root_password(user: &str) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return rpassword::prompt_password(format!("MongoDB password for {user}: "))
            .context("reading the root password from the terminal");
    }
    let mut line = String::new();
    stdin
        .lock()
        .read_line(&mut line)
        .context("reading the root password from stdin")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(dir: &Path, config: &str) -> Options {
        let path = dir.join("config.json");
        std::fs::write(&path, config).expect("write config");
        Options {
            config: path,
            root_user: "root".into(),
            plugin_perms: None,
            additional_perms: None,
            create_root: false,
            drop_roles: false,
        }
    }

    fn run_blocking(opts: &Options) -> (anyhow::Result<()>, bool) {
        let asked = std::cell::Cell::new(false);
        let mut out = Vec::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let result = rt.block_on(run(
            opts,
            |_| {
                asked.set(true);
                Ok("pw".into())
            },
            &mut out,
        ));
        (result, asked.get())
    }

    #[test]
    fn missing_password_fails_before_asking_for_root() {
        let dir = tempfile::tempdir().expect("temp dir");
        let opts = options(
            dir.path(),
            r#"{"mongohost": "mongodb://127.0.0.1:1", "database": "d", "auth": {"disbatchd": "x"}}"#,
        );
        let (result, asked) = run_blocking(&opts);
        let err = result.expect_err("missing passwords");
        assert!(err.to_string().contains("\"disbatch_web\""), "{err:#}");
        assert!(
            !asked,
            "the root password must not be read before the checks"
        );
    }

    #[test]
    fn bad_perms_file_fails_before_asking_for_root() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut opts = options(
            dir.path(),
            r#"{"mongohost": "mongodb://127.0.0.1:1", "database": "d", "auth": {"disbatchd": "a",
            "disbatch_web": "b", "task_runner": "c", "queuebalance": "d", "plugin": "e"}}"#,
        );
        let perms = dir.path().join("perms.json");
        std::fs::write(&perms, r#"{"reports": "insert"}"#).expect("write perms");
        opts.plugin_perms = Some(perms);
        let (result, asked) = run_blocking(&opts);
        let err = format!("{:#}", result.expect_err("bad perms"));
        assert!(
            err.contains("perms.json") && err.contains("\"reports\""),
            "{err}"
        );
        assert!(!asked);
    }
}
