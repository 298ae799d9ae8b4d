//! Runs a plugin executable without a shell, in its own process group, with a controlled
//! environment and nothing else of the runner's (descriptors, user), spooling its output to
//! files, never to memory; and stops the whole group.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use disbatch_config::plugin_env::PluginEnv;
use disbatch_config::process::isolation::CloexecRanges;
use disbatch_config::PluginUser;
use nix::libc;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::outcome::Exit;
use crate::spool::{create_output, SpoolPaths};

/// What the plugin is told about its task.
#[derive(Debug, Clone)]
pub struct PluginCall<'a> {
    pub executable: &'a Path,
    pub task_json: Vec<u8>,
    /// The `DISBATCH_*` variables naming its attempt, task, queue and node
    /// (`launch::plugin_env`); the attempt's id is its fencing token, which a plugin can tag
    /// side effects with.
    pub vars: Vec<(&'static str, String)>,
    /// Which of the runner's environment variables the plugin may see.
    pub env: &'a PluginEnv,
    /// The account the plugin runs as (`plugin_user`); None: the runner's own.
    pub user: Option<&'a PluginUser>,
}

/// A started plugin: its process and its process group.
pub struct PluginProcess {
    child: Child,
    group: Option<Pid>,
    pub paths: SpoolPaths,
}

/// Starts the plugin in `spool`, with the task document on stdin.
pub fn start_plugin(call: PluginCall<'_>, spool: &Path) -> std::io::Result<PluginProcess> {
    let euid = nix::unistd::geteuid();
    if let Some(user) = call.user.filter(|_| !euid.is_root()) {
        return Err(std::io::Error::other(format!(
            "`plugin_user` {} needs the task runner to run as root; it runs as uid {euid}",
            user.name
        )));
    }
    let paths = SpoolPaths::prepare(spool, call.user)?;
    let mut cmd = Command::new(call.executable);
    // Only allow-listed variables reach the plugin: a node's environment may hold secrets.
    cmd.env_clear();
    for (name, value) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| plugin_may_see(call.env, n)) {
            cmd.env(name, value);
        }
    }
    if let Some(user) = call.user {
        cmd.env("HOME", &user.home)
            .env("USER", &user.name)
            .env("LOGNAME", &user.name);
    }
    cmd.envs(call.vars)
        .env("DISBATCH_RESULT", &paths.result)
        .stdin(Stdio::piped())
        .stdout(create_output(&paths.stdout)?)
        .stderr(create_output(&paths.stderr)?)
        // Its own process group, so the whole tree can be signalled (timeouts, cancel, and
        // what is left at its end).
        .process_group(0)
        .kill_on_drop(true);
    let identity = call.user.map(Identity::of);
    let runner = std::process::id();
    let private = CloexecRanges::above_stderr_except(None);
    // SAFETY: setgroups, setgid, setuid, prctl, getppid and close_range are async-signal-safe;
    // everything they use was made before the fork and is only read here.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(identity) = &identity {
                identity.assume()?;
            }
            // After the change of user, which clears it. A runner killed outright takes its
            // plugin with it, so a recovered task never runs twice at once.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if libc::getppid() as u32 != runner {
                // The runner died before the signal was armed.
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            private.apply()?;
            Ok(())
        });
    }
    // This runner runs one plugin and then exits: as the subreaper of its descendants, it
    // adopts what the plugin leaves behind even in a session of its own, to kill at its end.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(error = %e, "cannot adopt what the plugin leaves behind; its group is still killed");
    }
    let mut child = cmd.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        let json = call.task_json;
        // A plugin need not read its stdin; a closed pipe is not an error.
        tokio::spawn(async move {
            let _ = stdin.write_all(&json).await;
            let _ = stdin.shutdown().await;
        });
    }
    let group = child.id().map(|id| Pid::from_raw(id as i32));
    Ok(PluginProcess {
        child,
        group,
        paths,
    })
}

/// Whether a variable of the runner's reaches a plugin: allow-listed, and never one of the
/// worker protocol's (a dual-mode plugin would take it as a call to run as a worker).
pub fn plugin_may_see(env: &PluginEnv, name: &str) -> bool {
    env.allows(name) && !name.starts_with(disbatch_model::worker_policy::RESERVED_ENV_PREFIX)
}

/// The ids a plugin of `plugin_user` takes on, ready for use between fork and exec.
pub(crate) struct Identity {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

impl Identity {
    pub(crate) fn of(user: &PluginUser) -> Identity {
        Identity {
            uid: user.uid,
            gid: user.gid,
            groups: user.groups.clone(),
        }
    }

    /// Groups first, then the group, then the user: each step needs the privilege the next
    /// one gives up. Async-signal-safe: it only reads `self`.
    pub(crate) fn assume(&self) -> std::io::Result<()> {
        // SAFETY: the pointer and length describe `self.groups`, alive for the call.
        let set = unsafe {
            libc::setgroups(self.groups.len(), self.groups.as_ptr()) == 0
                && libc::setgid(self.gid) == 0
                && libc::setuid(self.uid) == 0
        };
        if set {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

impl crate::supervisor::Supervised for PluginProcess {
    async fn wait(&mut self) -> std::io::Result<Exit> {
        let exit = self.child.wait().await.map(Exit::from);
        // What the plugin left running dies with its run: a background job or a daemon would
        // otherwise write into files, and outputs, that are no longer its own.
        if let Some(group) = self.group {
            // ESRCH: nothing of the group is left.
            let _ = killpg(group, Signal::SIGKILL);
        }
        let killed = kill_adopted_orphans();
        if killed > 0 {
            tracing::info!(
                killed,
                "killed processes the plugin left running in sessions of their own"
            );
        }
        exit
    }

    async fn stop(&mut self, grace: Duration) -> std::io::Result<Exit> {
        stop_group(&mut self.child, self.group, grace).await
    }
}

/// Kills this runner's children other than its plugin: as its subreaper (`spawn`) it adopts
/// what the plugin left behind in sessions or groups of their own, which its group kill
/// misses. Each one killed may leave children of its own to adopt, so a few rounds. Returns
/// how many were killed.
fn kill_adopted_orphans() -> usize {
    let me = std::process::id();
    let mut killed = 0;
    for _ in 0..8 {
        let orphans = children_of(me);
        if orphans.is_empty() {
            break;
        }
        for pid in &orphans {
            let pid = Pid::from_raw(*pid as i32);
            if nix::sys::signal::kill(pid, Signal::SIGKILL).is_ok() {
                killed += 1;
            }
            // Reaped now that they are ours: SIGKILL makes this quick.
            let _ = nix::sys::wait::waitpid(pid, None);
        }
    }
    killed
}

/// The processes whose parent is `parent`, read from /proc.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // After the command's closing parenthesis: state, then the parent's pid.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// Stops a plugin's whole process group: SIGTERM, up to `grace` for `child` to exit, then
/// SIGKILL (also to children that ignored the TERM).
pub async fn stop_group(
    child: &mut Child,
    group: Option<Pid>,
    grace: Duration,
) -> std::io::Result<Exit> {
    let signal_group = |signal| {
        if let Some(group) = group {
            // ESRCH: the group is already gone, which is what we want.
            let _ = killpg(group, signal);
        }
    };
    signal_group(Signal::SIGTERM);
    if let Ok(exit) = tokio::time::timeout(grace, child.wait()).await {
        signal_group(Signal::SIGKILL);
        return exit.map(Exit::from);
    }
    tracing::warn!(grace = ?grace, "plugin ignored SIGTERM; sending SIGKILL");
    signal_group(Signal::SIGKILL);
    child.wait().await.map(Exit::from)
}
