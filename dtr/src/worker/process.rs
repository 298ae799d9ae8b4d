//! One worker process and its end of the protocol: started like a process plugin but with
//! the channel on descriptor 3, output in `O_APPEND` files emptied before each task.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use disbatch_config::process::isolation::CloexecRanges;
use disbatch_config::Config;
use disbatch_model::worker_policy::{PROTOCOL_ENV, PROTOCOL_VERSION};
use nix::libc;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};

use super::message::{parse_line, read_line, Message, TaskEnd, MAX_WORKER_LINE};
use crate::outcome::Exit;
use crate::plugin_process::{plugin_may_see, stop_group, Identity};
use crate::spool::SpoolPaths;

/// A started worker that has said `ready`.
pub struct Worker {
    child: Child,
    group: Option<Pid>,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// The supervisor's handles on the output files, to empty them before a task.
    stdout: File,
    stderr: File,
    pub paths: SpoolPaths,
    dir: Option<tempfile::TempDir>,
    pub executable: PathBuf,
    pub pid: u32,
    /// Tasks it has answered `done` to.
    pub tasks_done: u64,
    /// The attempt of the task it runs, while it runs one.
    running: Option<String>,
    /// How the last task ended, once it has.
    pub ended: Option<TaskEnd>,
    /// It exited or was stopped: it is never given another task.
    pub dead: bool,
}

/// An output file the worker appends to: new, never a link, readable by the host only.
fn append_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

fn reopen(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// The worker's command: the plugin's allowed environment and user, the protocol's variable,
/// its output appended to `out` and `err`, and `channel` as its descriptor 3.
fn command(
    executable: &Path,
    config: &Config,
    out: File,
    err: File,
    channel: &std::os::unix::net::UnixStream,
) -> Command {
    let user = config.plugin_user.as_ref();
    let mut cmd = Command::new(executable);
    cmd.env_clear();
    for (name, value) in std::env::vars_os() {
        if name
            .to_str()
            .is_some_and(|n| plugin_may_see(&config.plugin_env, n))
        {
            cmd.env(name, value);
        }
    }
    if let Some(user) = user {
        cmd.env("HOME", &user.home)
            .env("USER", &user.name)
            .env("LOGNAME", &user.name);
    }
    cmd.env(PROTOCOL_ENV, PROTOCOL_VERSION.to_string())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true);
    let identity = user.map(Identity::of);
    let host = std::process::id();
    let channel = channel.as_raw_fd();
    let private = CloexecRanges::above_stderr_except(Some(3));
    // SAFETY: setgroups, setgid, setuid, prctl, getppid, dup2, fcntl and close_range are
    // async-signal-safe; everything they use was made before the fork and is only read.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(identity) = &identity {
                identity.assume()?;
            }
            // A host killed outright takes its workers with it: no orphan worker.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if libc::getppid() as u32 != host {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // The channel is descriptor 3; dup2 leaves the copy without close-on-exec.
            let kept = if channel == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(channel, 3)
            };
            if kept < 0 {
                return Err(std::io::Error::last_os_error());
            }
            private.apply()?;
            Ok(())
        });
    }
    cmd
}

impl Worker {
    /// Starts `executable` as a worker of the node's `config` and waits up to `start` for its
    /// `ready`. Err: why it could not start, for the task's stderr.
    pub async fn start(
        executable: &Path,
        config: &Config,
        start: Duration,
        grace: Duration,
    ) -> Result<Worker, String> {
        let user = config.plugin_user.as_ref();
        let euid = nix::unistd::geteuid();
        if let Some(user) = user.filter(|_| !euid.is_root()) {
            return Err(format!(
                "`plugin_user` {} needs the task runner to run as root; it runs as uid {euid}",
                user.name
            ));
        }
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        let dir = tempfile::Builder::new()
            .prefix("disbatch-worker-")
            .tempdir()
            .map_err(|e| io("creating the worker's output directory", e))?;
        let paths = SpoolPaths::prepare(dir.path(), user)
            .map_err(|e| io("laying out the worker's output directory", e))?;
        let out = append_file(&paths.stdout).map_err(|e| io("creating stdout", e))?;
        let err = append_file(&paths.stderr).map_err(|e| io("creating stderr", e))?;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| io("creating the worker's channel", e))?;
        let child = command(executable, config, out, err, &theirs)
            .spawn()
            .map_err(|e| format!("could not start plugin {}: {e}", executable.display()))?;
        drop(theirs);
        ours.set_nonblocking(true)
            .map_err(|e| io("setting up the channel", e))?;
        let stream =
            tokio::net::UnixStream::from_std(ours).map_err(|e| io("setting up the channel", e))?;
        let (read, write) = stream.into_split();
        let pid = child.id().unwrap_or(0);
        let worker = Worker {
            group: child.id().map(|id| Pid::from_raw(id as i32)),
            child,
            reader: BufReader::new(read),
            writer: write,
            stdout: reopen(&paths.stdout).map_err(|e| io("opening stdout", e))?,
            stderr: reopen(&paths.stderr).map_err(|e| io("opening stderr", e))?,
            paths,
            dir: Some(dir),
            executable: executable.to_path_buf(),
            pid,
            tasks_done: 0,
            running: None,
            ended: None,
            dead: false,
        };
        worker.until_ready(start, grace).await
    }

    /// Waits up to `start` for the new worker's `ready`; one that does not say it is stopped.
    async fn until_ready(mut self, start: Duration, grace: Duration) -> Result<Worker, String> {
        let why = match tokio::time::timeout(start, self.read_message()).await {
            Err(_) => format!(
                "the worker did not say ready within {} s",
                start.as_secs_f64()
            ),
            Ok(Ok(Some(m))) => match m.ready(PROTOCOL_VERSION as u64) {
                Ok(()) => return Ok(self),
                Err(why) => why,
            },
            Ok(Ok(None)) => "the worker exited before it said ready".to_string(),
            Ok(Err(e)) => format!("the worker's first message cannot be read: {e}"),
        };
        let exit = self.stop(grace).await;
        let tail = self.stderr_tail().await;
        Err(format!(
            "could not start worker {}: {why} ({}){tail}",
            self.executable.display(),
            describe(exit)
        ))
    }

    /// Empties the output files and sends the task.
    pub async fn begin(
        &mut self,
        task: Value,
        env: Map<String, Value>,
        attempt: &str,
    ) -> std::io::Result<()> {
        self.stdout.set_len(0)?;
        self.stderr.set_len(0)?;
        self.ended = None;
        self.running = Some(attempt.to_string());
        let msg = json!({"type": "task", "task": task, "env": env, "attempt": attempt});
        let mut line = serde_json::to_vec(&msg).map_err(std::io::Error::other)?;
        line.push(b'\n');
        if let Err(e) = self.writer.write_all(&line).await {
            // A worker that died since it was lent: `wait` finds out how.
            tracing::debug!(pid = self.pid, error = %e, "could not send the task to the worker");
        }
        Ok(())
    }

    /// One message, None at end of input. Err: a line over the cap, cut short, not JSON or
    /// not an object.
    async fn read_message(&mut self) -> std::io::Result<Option<Message>> {
        match read_line(&mut self.reader, MAX_WORKER_LINE).await? {
            Some(line) => parse_line(line).await.map(Some),
            None => Ok(None),
        }
    }

    /// Waits for the task's end: `done`, the worker's death, or a protocol error (the worker
    /// is then killed). Cancel-safe enough for `select!`: a run it loses is stopped.
    pub async fn wait_task(&mut self, grace: Duration) -> std::io::Result<Exit> {
        let attempt = self.running.clone().unwrap_or_default();
        let end = match self.read_message().await {
            Ok(Some(m)) => match m.into_done(&attempt) {
                Ok(end) => end,
                Err(why) => TaskEnd::ProtocolError(why, self.stop(grace).await?),
            },
            Ok(None) => {
                // The channel closed: the worker is exiting; give it its grace to finish.
                let exit = match tokio::time::timeout(grace, self.child.wait()).await {
                    Ok(status) => {
                        self.end_group();
                        Exit::from(status?)
                    }
                    Err(_) => self.stop(grace).await?,
                };
                self.dead = true;
                TaskEnd::Died(exit)
            }
            Err(e) => TaskEnd::ProtocolError(e.to_string(), self.stop(grace).await?),
        };
        self.running = None;
        let exit = match &end {
            TaskEnd::Done { exit, .. } => {
                self.tasks_done += 1;
                Exit::Code(*exit)
            }
            TaskEnd::Died(exit) | TaskEnd::ProtocolError(_, exit) => *exit,
        };
        self.ended = Some(end);
        Ok(exit)
    }

    /// Stops the worker now (its whole process group); it is never used again.
    pub async fn stop(&mut self, grace: Duration) -> std::io::Result<Exit> {
        self.dead = true;
        // It kills the group once the worker is reaped, leftovers included.
        stop_group(&mut self.child, self.group.take(), grace).await
    }

    /// Kills what is left of the worker's process group, as soon as the worker was reaped:
    /// a process a task left behind, even double-forked, must not live on to write into later
    /// tasks' output or hold the channel. Done at once, so the group's id cannot have been
    /// taken by a new process since.
    fn end_group(&mut self) {
        if let Some(group) = self.group.take() {
            // ESRCH: nothing was left behind.
            let _ = killpg(group, Signal::SIGKILL);
        }
    }

    /// Asks an idle worker to stop, as the protocol says, and stops it if it does not
    /// within `grace`.
    pub async fn retire(mut self, grace: Duration) {
        let _ = self.writer.write_all(b"{\"type\":\"stop\"}\n").await;
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(_) => {
                self.end_group();
                tracing::debug!(pid = self.pid, "worker stopped");
            }
            Err(_) => {
                tracing::warn!(
                    pid = self.pid,
                    ?grace,
                    "worker did not stop when asked; stopping it"
                );
                let _ = self.stop(grace).await;
            }
        }
    }

    /// Whether it has exited (reaped here) while idle.
    pub fn exited(&mut self) -> bool {
        if self.dead {
            return true;
        }
        match self.child.try_wait() {
            Ok(None) => false,
            Ok(Some(_)) => {
                self.end_group();
                true
            }
            Err(_) => true,
        }
    }

    /// Its resident memory in MiB, from /proc; None when it cannot be read.
    pub fn rss_mb(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024)
    }

    /// Keeps the output directory on disk (the worker must not be used again).
    pub fn keep_dir(&mut self) -> PathBuf {
        self.dead = true;
        match self.dir.take() {
            Some(dir) => dir.keep(),
            None => self
                .paths
                .stdout
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
        }
    }

    /// The end of what the worker wrote on stderr, for a start that failed.
    async fn stderr_tail(&self) -> String {
        match tokio::fs::read(&self.paths.stderr).await {
            Ok(bytes) if !bytes.is_empty() => {
                let from = bytes.len().saturating_sub(2000);
                format!(
                    "; its stderr: {}",
                    String::from_utf8_lossy(&bytes[from..]).trim_end()
                )
            }
            _ => String::new(),
        }
    }
}

impl Drop for Worker {
    /// A worker never reaped here (`kill_on_drop` kills it) ends with its group too.
    fn drop(&mut self) {
        self.end_group();
    }
}

/// An exit in words, for messages.
pub fn describe(exit: std::io::Result<Exit>) -> String {
    match exit {
        Ok(Exit::Code(c)) => format!("exited with code {c}"),
        Ok(Exit::Signal(s)) => format!("killed by signal {s}"),
        Err(e) => format!("could not be waited for: {e}"),
    }
}
