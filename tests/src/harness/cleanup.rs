//! Every process a test started is gone when the test ends, pass or panic.
//!
//! A node starts its runners in a session of their own, runners put plugins and persistent
//! workers in process groups of their own, and Chromium forks a tree of its own: no signal to
//! one process reaches them all, and a killed node leaves its runners running, renewing leases
//! and writing into databases the test has dropped. So the test process makes itself the
//! *child subreaper* of everything it starts: whatever an orphan's parent was, it is re-parented
//! to the test process instead of to init, and stays findable as a descendant. When the last
//! `TestDb` of the process is dropped, every descendant is killed.
//!
//! Under cargo-nextest (the suite's runner, `scripts/test`) each test is a process of its own,
//! so "descendants of this process" are exactly the test's processes. Under plain `cargo test`
//! several tests share one process, so killing every descendant would kill a neighbour's
//! nodes; there the guard kills only the processes that name the test's own directory on their
//! command line (nodes, runners and worker hosts carry `--config <dir>/...`).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

static SUBREAPER: Once = Once::new();
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Called when a `TestDb` is made: the process becomes a subreaper, and one more database is
/// live.
pub(crate) fn test_started() {
    SUBREAPER.call_once(|| {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            eprintln!(
                "cleanup: cannot become a child subreaper ({e}); orphans may outlive the test"
            );
        }
    });
    LIVE.fetch_add(1, Ordering::SeqCst);
}

/// Called when a `TestDb` is dropped. `dir` is its temporary directory.
pub(crate) fn test_ended(dir: &Path) {
    let last = LIVE.fetch_sub(1, Ordering::SeqCst) == 1;
    if process_per_test() {
        if last {
            kill_descendants();
        }
    } else {
        kill_naming(&dir.to_string_lossy());
    }
}

/// True under cargo-nextest's process-per-test mode.
pub fn process_per_test() -> bool {
    std::env::var("NEXTEST_EXECUTION_MODE").is_ok_and(|m| m == "process-per-test")
}

/// SIGKILLs every descendant of this process, again until none is left (a process forking as
/// it is killed), at most 50 rounds. Returns how many were killed.
pub fn kill_descendants() -> usize {
    let me = std::process::id() as i32;
    let mut killed = HashSet::new();
    for _ in 0..50 {
        let found: Vec<i32> = descendants_of(me)
            .into_iter()
            .filter(|p| !is_zombie(*p))
            .collect();
        if found.is_empty() {
            break;
        }
        for pid in found {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            killed.insert(pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    killed.len()
}

/// SIGKILLs every process whose command line has an argument containing `needle`.
pub fn kill_naming(needle: &str) {
    for pid in all_pids() {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let names = cmdline
            .split(|b| *b == 0)
            .any(|arg| String::from_utf8_lossy(arg).contains(needle));
        if names && pid != std::process::id() as i32 {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The live descendants of `root`, read from `/proc/*/stat`.
pub fn descendants_of(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for pid in all_pids() {
        if let Some(ppid) = parent_of(pid) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Fields of `/proc/PID/stat` after the command name, which may itself hold spaces and ')'.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_string).collect())
}

fn parent_of(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

fn is_zombie(pid: i32) -> bool {
    stat_fields(pid).is_none_or(|f| f.first().is_some_and(|s| s == "Z" || s == "X"))
}
