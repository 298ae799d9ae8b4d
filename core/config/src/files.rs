//! The config file and the secret files it names, read so that no file can hang or swamp a
//! process (regular files only, opened without blocking, size-capped), and which of them
//! other users can read.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Larger config files are refused: real ones are a few kilobytes.
pub const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;
/// Larger token, password and URI files are refused.
pub const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// Reads a whole regular file of at most `cap` bytes as UTF-8. A FIFO, a device (`/dev/zero`)
/// or a directory is refused with a clear error, also behind a symlink: opening a FIFO to read
/// would wait for a writer, and a device may never end.
pub fn read_capped(path: &Path, cap: u64) -> std::io::Result<String> {
    // O_NONBLOCK: the open of a FIFO returns at once, so its type can be checked and refused.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(std::io::Error::other(format!(
            "it is not a regular file but {}",
            describe(kind)
        )));
    }
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(std::io::Error::other(format!(
            "it is larger than {cap} bytes"
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

fn describe(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

/// The `token_file` of each `web.tokens` entry of a config's value, by token name, resolved
/// against the config's directory.
pub fn token_files(config: &Path, value: &Value) -> Vec<(String, PathBuf)> {
    let base = config.parent().unwrap_or(Path::new("."));
    let entries = value
        .get("web")
        .and_then(|w| w.get("tokens"))
        .and_then(Value::as_array);
    entries
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let name = entry.get("name")?.as_str()?;
            let file = entry.get("token_file")?.as_str()?;
            Some((name.to_string(), resolve(base, file)))
        })
        .collect()
}

/// One warning for each file holding a secret that others than its owner may read: the config
/// when it holds a password or token itself, and the password, URI and token files it names.
pub fn exposed_secret_files(config: &Path, value: &Value) -> Vec<String> {
    let base = config.parent().unwrap_or(Path::new("."));
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    if holds_secrets(value) {
        files.push(("the config".into(), config.to_path_buf()));
    }
    if let Some(Value::String(file)) = value.get("mongohost_file") {
        files.push(("`mongohost_file`".into(), resolve(base, file)));
    }
    if let Some(Value::Object(map)) = value.get("auth_files") {
        for (user, file) in map {
            if let Value::String(file) = file {
                files.push((format!("`auth_files.{user}`"), resolve(base, file)));
            }
        }
    }
    for (name, file) in token_files(config, value) {
        files.push((format!("the `token_file` of web token {name:?}"), file));
    }
    files
        .into_iter()
        .filter_map(|(what, path)| {
            let mode = std::fs::metadata(&path).ok()?.mode() & 0o777;
            (mode & 0o077 != 0).then(|| {
                format!(
                    "{what} ({}) holds a secret and is readable by {} (mode {mode:04o}): make it 0600 or 0640 with a trusted group",
                    path.display(),
                    if mode & 0o007 != 0 { "every user" } else { "its group" }
                )
            })
        })
        .collect()
}

/// Whether the config itself holds a password or token (not only file names for them).
fn holds_secrets(value: &Value) -> bool {
    let uri_password = value
        .get("mongohost")
        .and_then(Value::as_str)
        .is_some_and(|uri| !disbatch_model::text::redact::uri_passwords(uri).is_empty());
    let auth = value
        .get("auth")
        .and_then(Value::as_object)
        .is_some_and(|map| !map.is_empty());
    let attribute = value
        .get("attributes")
        .and_then(|a| a.get("password"))
        .is_some();
    let token = value
        .get("web")
        .and_then(|w| w.get("tokens"))
        .and_then(Value::as_array)
        .is_some_and(|tokens| tokens.iter().any(|t| t.get("token").is_some()));
    uri_password || auth || attribute || token
}

/// Paths in the config are relative to the config file, so a checkout can carry its own config.
pub(crate) fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_and_big_ones_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let refused = read_capped(&fifo, 10).expect_err("a FIFO");
        assert!(refused.to_string().contains("a FIFO"), "{refused}");
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        let refused = read_capped(&zero, 10).expect_err("a device");
        assert!(
            refused.to_string().contains("character device"),
            "{refused}"
        );
        let big = dir.path().join("big");
        std::fs::write(&big, "x".repeat(11)).expect("write");
        let refused = read_capped(&big, 10).expect_err("too big");
        assert!(refused.to_string().contains("larger than 10"), "{refused}");
        assert_eq!(read_capped(&big, 11).expect("fits"), "x".repeat(11));
    }
}
