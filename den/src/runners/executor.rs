//! The executor: starts one task runner per claimed task, in its own session, and watches it.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::{PipeWriter, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use disbatch_config::process::isolation::CloexecRanges;
use disbatch_model::wire::handoff::Handoff;
use disbatch_model::wire::relay::{read_frame, Ack, Completion, LiveCopy, ANSWER_FD};
use disbatch_store::TaskEnd;
use tokio::process::{ChildStdout, Command};
use tokio::sync::Notify;

use crate::runners::completer::Completer;
pub use crate::runners::live::{Exited, LearnedEnd};
use crate::runners::live::{HostHandle, Live};
use crate::runners::releaser::Releaser;
use crate::runners::runner_deaths::RunnerDeaths;
use disbatch_model::task::Outcome;

/// What an empty pipe takes without blocking on Linux (its default capacity).
const PIPE_CAPACITY: usize = 64 * 1024;

/// How long a runner that exited 0 may leave its relay still finishing: it exits only after
/// the node's answer, so the relay is done but for being scheduled.
const RELAY_SETTLE: Duration = Duration::from_secs(1);

/// Spawns runners and wakes the node loop when one exits (a slot may have freed up).
#[derive(Debug, Clone)]
pub struct Executor {
    runner: PathBuf,
    config: PathBuf,
    node: String,
    /// The whole environment of every runner (`runner_env`): nothing else of this node's.
    env: Arc<Vec<(OsString, OsString)>>,
    /// Runners started by this process and still alive, by attempt: a retry of a task may
    /// start before the runner of its last attempt has exited.
    pub(crate) live: Arc<Mutex<HashMap<ObjectId, Live>>>,
    /// Runners that exited since the claimer last looked.
    exited: Arc<Mutex<Vec<Exited>>>,
    runner_exited: Arc<Notify>,
    /// Stores runners' results; None leaves each runner to store its own.
    completer: Option<Completer>,
    /// Recovers the tasks of runners that die without a result; None leaves them to leases.
    pub(crate) deaths: Option<RunnerDeaths>,
    /// The worker host running this node's persistent-queue tasks, once one is needed.
    pub(crate) host: Arc<Mutex<Option<HostHandle>>>,
    /// Settles what waits on the tasks in `waited_for` when they end; None leaves it to the
    /// maintenance leader's sweep.
    releaser: Option<Releaser>,
    /// Live attempts of tasks that others wait for (marked so when claimed).
    waited_for: Arc<Mutex<HashSet<ObjectId>>>,
}

impl Executor {
    pub fn new(
        runner: PathBuf,
        config: PathBuf,
        node: String,
        env: Vec<(OsString, OsString)>,
        completer: Option<Completer>,
        deaths: Option<RunnerDeaths>,
    ) -> Self {
        Executor {
            runner,
            config,
            node,
            env: Arc::new(env),
            completer,
            deaths,
            live: Arc::new(Mutex::new(HashMap::new())),
            host: Arc::new(Mutex::new(None)),
            exited: Arc::new(Mutex::new(Vec::new())),
            runner_exited: Arc::new(Notify::new()),
            releaser: None,
            waited_for: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// Settles the ends of tasks others wait for as soon as their runners exit.
    pub fn with_releaser(mut self, releaser: Releaser) -> Self {
        self.releaser = Some(releaser);
        self
    }

    /// Notes a task being started that others wait for.
    pub(crate) fn note_waited_for(&self, handoff: &Handoff) {
        if self.releaser.is_none() || !disbatch_store::is_waited_for(&handoff.task.raw) {
            return;
        }
        if let Ok(mut w) = self.waited_for.lock() {
            w.insert(handoff.attempt);
        }
        if let Some(r) = &self.releaser {
            r.saw_waited_for();
        }
    }

    /// The environment of runners started from now on (a config reload); running ones keep
    /// theirs.
    pub fn set_env(&mut self, env: Vec<(OsString, OsString)>) {
        self.env = Arc::new(env);
        // The host was started with the old config and environment: it drains, and the
        // next persistent task starts a new one.
        self.retire_host();
    }

    /// Whether runners hand their results to this node (`Handoff::relay`).
    pub fn relays(&self) -> bool {
        self.completer.is_some()
    }

    /// Runners started by this process that have not exited yet.
    pub fn live_runners(&self) -> u32 {
        self.live.lock().map_or(0, |l| l.len() as u32)
    }

    /// This node's runners of their own (the worker host's tasks excluded): (task, attempt,
    /// pid).
    pub(crate) fn own_runners(&self) -> Vec<(ObjectId, ObjectId, u32)> {
        self.live
            .lock()
            .map(|l| {
                l.values()
                    .filter(|r| !r.hosted)
                    .map(|r| (r.task, r.attempt, r.pid))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The live runners (task, pid), reported on the node document as its child workers.
    pub fn runners(&self) -> Vec<(ObjectId, u32)> {
        self.live
            .lock()
            .map(|l| l.values().map(|r| (r.task, r.pid)).collect())
            .unwrap_or_default()
    }

    /// Resolves when a runner exits (or already has since the last call).
    pub async fn runner_exited(&self) {
        self.runner_exited.notified().await
    }

    /// The runners that exited since the last call.
    pub fn take_exited(&self) -> Vec<Exited> {
        self.exited
            .lock()
            .map(|mut e| std::mem::take(&mut *e))
            .unwrap_or_default()
    }

    /// Sends SIGUSR1 to the runner of `task`, if this process started it: the runner then
    /// renews its lease at once and finds out what the database asks of it.
    pub fn wake_runner(&self, task: ObjectId) {
        // Every runner of the task: the one of its last attempt may still be finishing.
        let runners: Vec<(u32, bool)> = self
            .live
            .lock()
            .map(|l| {
                l.values()
                    .filter(|r| r.task == task)
                    .map(|r| (r.pid, r.hosted))
                    .collect()
            })
            .unwrap_or_default();
        for (pid, hosted) in runners {
            if hosted {
                self.wake_hosted(task);
                continue;
            }
            if pid <= 1 {
                continue;
            }
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            if let Err(e) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1) {
                tracing::debug!(task = %task, %pid, error = %e, "could not wake the task runner");
            }
        }
    }

    /// Starts `disbatch-task-runner --config C --task ID --node N --handoff` with no shell,
    /// handing it the claimed task on stdin. It runs in a new session so it outlives a restart
    /// or kill of this DEN and gets none of its signals.
    pub fn spawn_runner(&self, handoff: &Handoff, slot: Option<u32>) -> std::io::Result<()> {
        self.note_waited_for(handoff);
        if disbatch_store::runs_persistent(&handoff.queue) {
            return self.hand_to_host(handoff, slot);
        }
        let task = handoff.task_id();
        let queue = handoff
            .queue_id()
            .ok_or_else(|| std::io::Error::other("the claimed task has no queue id"))?;
        let input = handoff.encode().map_err(std::io::Error::other)?;
        let mut cmd = Command::new(&self.runner);
        cmd.arg("--config")
            .arg(&self.config)
            .arg("--task")
            .arg(task.to_hex())
            .arg("--node")
            .arg(&self.node)
            .arg("--handoff")
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(false);
        // The handoff goes into the pipe before the runner exists, so a node killed right
        // after starting it cannot leave it waiting for a task that never comes.
        let (stdin, mut handoff_pipe) = std::io::pipe()?;
        let prefilled = input.len() <= PIPE_CAPACITY;
        if prefilled {
            handoff_pipe.write_all(&input)?;
        }
        cmd.stdin(stdin);
        let completer = self.completer.clone().filter(|_| handoff.relay);
        // Answers go on their own pipe (the runner's ANSWER_FD), so stdin still closes after
        // the handoff, as any runner that reads it to its end expects.
        let answers = match completer {
            Some(_) => {
                cmd.stdout(Stdio::piped());
                Some(std::io::pipe()?)
            }
            None => None,
        };
        let answer_fd = answers.as_ref().map(|(r, _)| r.as_raw_fd());
        isolate(&mut cmd, answer_fd);
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let stdout = child.stdout.take();
        // Only the runner reads answers: its end closes here, so a runner's death is EPIPE.
        let answer_pipe = answers.map(|(_, w)| w);
        // A handoff already in the pipe is complete: closing our end now gives EOF after it.
        let unwritten = (!prefilled).then_some(handoff_pipe);
        // Resolves to the attempt's outcome when this node stored (or refused) its result.
        let relay = tokio::spawn(async move {
            if let Some(pipe) = unwritten {
                // Dropping the returned pipe closes it once the handoff is through.
                if write_blocking(Some(pipe), input).await.is_none() {
                    tracing::warn!(task = %task, "could not hand the task to its runner");
                    return None;
                }
            }
            match (completer, stdout, answer_pipe) {
                (Some(completer), Some(stdout), Some(pipe)) => {
                    relay_result(task, &completer, pipe, stdout).await
                }
                _ => None,
            }
        });
        if let Ok(mut live) = self.live.lock() {
            let runner = Live {
                task,
                pid: pid.unwrap_or(0),
                queue,
                slot,
                attempt: handoff.attempt,
                started: Instant::now(),
                hosted: false,
            };
            live.insert(handoff.attempt, runner);
        }
        self.watch_runner(child, relay, task, handoff.attempt);
        tracing::debug!(task = %task, ?pid, "started task runner");
        Ok(())
    }

    /// Waits for the runner's exit in the background: a death without a result is recovered
    /// at once, and the attempt's outcome (relayed, recovered or recorded) ends it here.
    fn watch_runner(
        &self,
        mut child: tokio::process::Child,
        mut relay: tokio::task::JoinHandle<Option<LearnedEnd>>,
        task: ObjectId,
        attempt: ObjectId,
    ) {
        let pid = child.id();
        let executor = self.clone();
        let deaths = self.deaths.clone();
        tokio::spawn(async move {
            let (success, outcome) = match child.wait().await {
                Ok(status) if status.success() => {
                    tracing::debug!(task = %task, ?pid, "task runner finished");
                    let relayed = tokio::time::timeout(RELAY_SETTLE, &mut relay).await;
                    (true, relayed.ok().and_then(Result::ok).flatten())
                }
                Ok(status) => {
                    tracing::warn!(task = %task, ?pid, %status, "task runner exited abnormally");
                    // Before the exit is reported: the slot it frees is then free in the
                    // database too, for this node's next claim.
                    let outcome = match &deaths {
                        Some(deaths) => {
                            let exit = status.to_string();
                            deaths.runner_died(task, attempt, &exit, Some(relay)).await
                        }
                        None => None,
                    };
                    (false, outcome)
                }
                Err(e) => {
                    tracing::warn!(task = %task, ?pid, error = %e, "could not wait for task runner");
                    (false, None)
                }
            };
            // A runner that stored its own result: its attempt record says how it ended.
            let outcome = match (outcome, &deaths) {
                (Some(outcome), _) => outcome,
                (None, Some(deaths)) => deaths
                    .recorded_outcome(attempt)
                    .await
                    .unwrap_or(LearnedEnd::UNKNOWN),
                (None, None) => LearnedEnd::UNKNOWN,
            };
            executor.task_ended(task, attempt, success, outcome);
        });
    }
}

impl Executor {
    /// The runner of a task's `attempt` exited (or its host reported it ended): its slot is
    /// free.
    pub(crate) fn task_ended(
        &self,
        task: ObjectId,
        attempt: ObjectId,
        success: bool,
        learned: LearnedEnd,
    ) {
        let waited_for = self.waited_for.lock().is_ok_and(|mut w| w.remove(&attempt));
        if let (true, Some(releaser)) = (waited_for, &self.releaser) {
            releaser.task_ended(task);
        }
        let runner = self.live.lock().ok().and_then(|mut l| l.remove(&attempt));
        if let (Some(runner), Ok(mut exited)) = (runner, self.exited.lock()) {
            exited.push(Exited {
                task,
                queue: runner.queue,
                slot: runner.slot,
                ran_for: runner.started.elapsed(),
                success,
                outcome: learned.outcome,
                discarded: learned.task_discarded,
                retry_at: learned.retry_at,
            });
        }
        self.runner_exited.notify_one();
    }

    /// A claim pass found nothing to start: with nothing running either, no end is coming
    /// soon for the releaser to gather, so it settles what it holds now.
    pub(crate) fn claim_pass_found_nothing(&self) {
        if let (0, Some(releaser)) = (self.live_runners(), &self.releaser) {
            releaser.node_idle();
        }
    }

    /// The environment every runner (and worker host) gets.
    pub(crate) fn runner_env(&self) -> Arc<Vec<(OsString, OsString)>> {
        self.env.clone()
    }

    pub(crate) fn runner_command(&self) -> (PathBuf, PathBuf, String) {
        (self.runner.clone(), self.config.clone(), self.node.clone())
    }
}

/// Takes the runner's result from its stdout, stores it, and answers on its ANSWER_FD. A runner
/// that stores its own result (large output, a database error here) just closes stdout.
/// Returns the attempt's outcome when this node settled it: the result's when stored,
/// `discarded` when the task had changed hands.
async fn relay_result(
    task: ObjectId,
    completer: &Completer,
    answers: PipeWriter,
    mut stdout: ChildStdout,
) -> Option<LearnedEnd> {
    // Live output copies (when the handoff said `live`) come first, then the completion.
    let frame = loop {
        let frame = match read_frame(&mut stdout).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(task = %task, error = %e, "unreadable result from the task runner; it will store its own");
                return None;
            }
        };
        if !LiveCopy::is_live_copy(&frame) {
            break frame;
        }
        match LiveCopy::decode(&frame) {
            Ok(copy) if copy.task == task => completer.offer_live(copy),
            Ok(copy) => {
                tracing::warn!(task = %task, reported = %copy.task, "the task runner sent another task's live output; skipped")
            }
            Err(e) => {
                tracing::warn!(task = %task, error = %e, "malformed live output from the task runner; skipped")
            }
        }
    };
    let mut outcome = None;
    let ack = match Completion::decode(&frame) {
        Ok(c) if c.task() == task => {
            let recorded = LearnedEnd {
                outcome: Some(c.record.end.outcome),
                task_discarded: c.record.end.task_discarded,
                retry_at: match c.end {
                    TaskEnd::Retry { not_before, .. } => not_before,
                    _ => None,
                },
            };
            let ack = completer.store_result(c).await;
            outcome = match ack {
                Ack::Recorded => Some(recorded),
                Ack::NotOurs => Some(LearnedEnd::plain(Outcome::Discarded)),
                Ack::RecordYourself => None,
            };
            ack
        }
        Ok(c) => {
            tracing::warn!(task = %task, reported = %c.task(), "the task runner reported another task; it will store its own");
            Ack::RecordYourself
        }
        Err(e) => {
            tracing::warn!(task = %task, error = %e, "malformed result from the task runner; it will store its own");
            Ack::RecordYourself
        }
    };
    let mut answer = Vec::new();
    if ack.encode().to_writer(&mut answer).is_ok()
        && write_blocking(Some(answers), answer).await.is_none()
    {
        tracing::debug!(task = %task, "the task runner left before its answer");
    }
    outcome
}

/// Writes to a runner's stdin off the async threads (a std pipe blocks when full); returns
/// the pipe again unless the write failed.
async fn write_blocking(pipe: Option<PipeWriter>, bytes: Vec<u8>) -> Option<PipeWriter> {
    let mut pipe = pipe?;
    tokio::task::spawn_blocking(move || pipe.write_all(&bytes).map(|()| pipe))
        .await
        .ok()?
        .ok()
}

/// The task runner to use: the config's `task_runner`, else the one installed beside this
/// executable, else `disbatch-task-runner` on PATH.
pub fn default_runner(configured: Option<&Path>) -> PathBuf {
    if let Some(path) = configured {
        return path.to_path_buf();
    }
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("disbatch-task-runner")));
    match sibling {
        Some(path) if path.exists() => path,
        _ => PathBuf::from("disbatch-task-runner"),
    }
}

/// Refuses to start a node whose runner cannot be executed, rather than failing every claim.
pub fn check_runner(runner: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let resolved = if runner.components().count() == 1 && !runner.is_absolute() {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|dir| dir.join(runner))
            .find(|p| p.is_file())
            .ok_or_else(|| format!("task runner {} was not found on PATH", runner.display()))?
    } else {
        runner.to_path_buf()
    };
    let meta = std::fs::metadata(&resolved)
        .map_err(|e| format!("task runner {}: {e}", resolved.display()))?;
    if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
        Ok(resolved)
    } else {
        Err(format!(
            "task runner {} is not an executable file",
            resolved.display()
        ))
    }
}

/// Runs the runner in its own session, with nothing of this node's open but stdio and the
/// answer pipe (`answer_fd`, moved to `ANSWER_FD`): a descriptor some library opened without
/// close-on-exec included.
fn isolate(cmd: &mut Command, answer_fd: Option<std::os::fd::RawFd>) {
    let private = CloexecRanges::above_stderr_except(answer_fd.map(|_| ANSWER_FD));
    // SAFETY: setsid, dup2, fcntl and close_range are async-signal-safe and touch no
    // memory of the parent; answer_fd is open (its pipe outlives spawn()).
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if let Some(fd) = answer_fd {
                // dup2 leaves the copy without close-on-exec; the original already at
                // ANSWER_FD needs the flag cleared instead.
                let kept = if fd == ANSWER_FD {
                    nix::libc::fcntl(fd, nix::libc::F_SETFD, 0)
                } else {
                    nix::libc::dup2(fd, ANSWER_FD)
                };
                if kept < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            private.apply()?;
            Ok(())
        });
    }
}
