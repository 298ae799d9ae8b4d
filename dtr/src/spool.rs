//! One run's spool directory: the plugin's stdout and stderr files and its result file, laid
//! out so that a plugin running as `plugin_user` can write its result but cannot redirect
//! what the runner reads back or writes (no symbolic link is ever followed there).

use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use disbatch_config::PluginUser;
use disbatch_model::output::MAX_DOCUMENT_SIZE;
use nix::libc;
use tokio::io::AsyncReadExt;

/// The most a result file may hold: it is kept on the attempt record, one document.
const MAX_RESULT: u64 = MAX_DOCUMENT_SIZE;

/// Where a plugin leaves its output.
#[derive(Debug, Clone)]
pub struct SpoolPaths {
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub result: PathBuf,
}

impl SpoolPaths {
    /// Lays out `dir`, a fresh directory private to the runner. A plugin of the runner's own
    /// user writes its result beside the output files. A plugin of another user gets a
    /// directory of its own (`plugin/`: its result, and room for a temporary file to rename)
    /// inside `dir`, which its group may enter but nobody but the runner may change.
    pub fn prepare(dir: &Path, user: Option<&PluginUser>) -> io::Result<SpoolPaths> {
        let mut paths = SpoolPaths {
            stdout: dir.join("stdout"),
            stderr: dir.join("stderr"),
            result: dir.join("result.json"),
        };
        if let Some(user) = user {
            let own = dir.join("plugin");
            std::fs::DirBuilder::new().mode(0o700).create(&own)?;
            std::os::unix::fs::chown(&own, Some(user.uid), Some(user.gid))?;
            std::os::unix::fs::chown(dir, None, Some(user.gid))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710))?;
            paths.result = own.join("result.json");
        }
        Ok(paths)
    }
}

/// Creates an output file for the plugin to inherit: a new file (never an existing one or a
/// link), readable by the runner only.
pub fn create_output(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Opens a spool file the runner reads back, refusing a symbolic link put in its place.
pub async fn open_read(path: &Path) -> io::Result<tokio::fs::File> {
    tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .await
}

/// `open_read` without a thread hop, for a caller that reads in place.
pub fn open_read_std(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// The plugin's result file, as far as the runner may trust it.
#[derive(Debug, PartialEq, Eq)]
pub enum ResultFile {
    Missing,
    Written(Vec<u8>),
    /// Ignored for this reason: a link, not a regular file, too large, unreadable.
    Refused(String),
}

/// Reads the result file without following a link (it could lead to any file the runner may
/// read, into the task) and without blocking on a FIFO.
pub async fn read_result(path: &Path) -> ResultFile {
    let opened = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .await;
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return ResultFile::Missing,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return ResultFile::Refused("it is a symbolic link".into())
        }
        Err(e) => return ResultFile::Refused(format!("it cannot be read: {e}")),
    };
    let too_large = |len: u64| {
        ResultFile::Refused(format!(
            "it holds {len} bytes or more, beyond the {MAX_RESULT} a result may"
        ))
    };
    match file.metadata().await {
        Ok(m) if !m.is_file() => {
            return ResultFile::Refused("it is not a regular file".into());
        }
        Ok(m) if m.len() > MAX_RESULT => return too_large(m.len()),
        Ok(_) => {}
        Err(e) => return ResultFile::Refused(format!("it cannot be read: {e}")),
    }
    let mut bytes = Vec::new();
    // Capped again: a child of the plugin may still be writing to it.
    match file.take(MAX_RESULT + 1).read_to_end(&mut bytes).await {
        Ok(n) if n as u64 > MAX_RESULT => too_large(n as u64),
        Ok(_) => ResultFile::Written(bytes),
        Err(e) => ResultFile::Refused(format!("it cannot be read: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_result_is_read_only_from_a_regular_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("result.json");
        assert_eq!(read_result(&path).await, ResultFile::Missing);
        std::fs::write(&path, b"{\"status\": 1}").expect("write");
        assert_eq!(
            read_result(&path).await,
            ResultFile::Written(b"{\"status\": 1}".to_vec())
        );
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"not for the plugin").expect("write");
        std::fs::remove_file(&path).expect("rm");
        std::os::unix::fs::symlink(&secret, &path).expect("symlink");
        assert_eq!(
            read_result(&path).await,
            ResultFile::Refused("it is a symbolic link".into())
        );
        std::fs::remove_file(&path).expect("rm");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        // A FIFO with no writer would block a plain read forever.
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), read_result(&path));
        assert_eq!(
            read.await.expect("no block"),
            ResultFile::Refused("it is not a regular file".into())
        );
    }

    #[tokio::test]
    async fn spooled_output_is_never_read_or_created_through_a_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("target");
        std::fs::write(&target, b"x").expect("write");
        let link = dir.path().join("stdout");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert!(open_read(&link).await.is_err());
        assert!(create_output(&link).is_err());
        let fresh = dir.path().join("stderr");
        let file = create_output(&fresh).expect("create");
        let mode = file.metadata().expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_plugin_of_another_user_writes_its_result_in_a_directory_of_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let same = SpoolPaths::prepare(dir.path(), None).expect("prepare");
        assert_eq!(same.result, dir.path().join("result.json"));
        if !nix::unistd::geteuid().is_root() {
            return; // chown needs root; the isolation tests cover it end to end
        }
        let user = PluginUser {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
            home: "/nonexistent".into(),
        };
        let paths = SpoolPaths::prepare(dir.path(), Some(&user)).expect("prepare");
        use std::os::unix::fs::MetadataExt;
        let own = paths.result.parent().expect("parent");
        let own_meta = std::fs::metadata(own).expect("stat");
        assert_eq!((own_meta.uid(), own_meta.gid()), (65534, 65534));
        assert_eq!(own_meta.mode() & 0o777, 0o700);
        let spool = std::fs::metadata(dir.path()).expect("stat");
        assert_eq!(
            (spool.uid(), spool.gid(), spool.mode() & 0o777),
            (0, 65534, 0o710)
        );
        assert_eq!(paths.stdout.parent(), Some(dir.path()));
    }
}
