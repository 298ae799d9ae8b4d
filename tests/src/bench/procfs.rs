//! Process figures from Linux /proc: CPU time, peak RSS, a node's runner children, the machine.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

/// CPU time of a process, in clock ticks: its own, and that of the children it has waited
/// for (a node's finished task runners, which include their plugins).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTicks {
    pub own: u64,
    pub children: u64,
}

/// Clock ticks per second (`getconf CLK_TCK`); 100 on every Linux we know of.
pub fn clock_ticks() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(n)) if n > 0 => n as f64,
        _ => 100.0,
    }
}

/// The fields after the `(comm)` of /proc/<pid>/stat, which may itself hold spaces.
fn stat_fields(pid: u32) -> Option<(String, Vec<String>)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest = text.get(close + 1..)?;
    Some((comm, rest.split_whitespace().map(str::to_string).collect()))
}

pub fn cpu_ticks(pid: u32) -> Option<CpuTicks> {
    let (_, f) = stat_fields(pid)?;
    // After the comm: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14).
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(CpuTicks {
        own: n(11)? + n(12)?,
        children: n(13)? + n(14)?,
    })
}

/// Peak resident set size (VmHWM) in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Resident set size now (VmRSS) in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Descriptors `pid` holds open (sockets included): what a big fleet costs the server.
pub fn open_fds(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// The machine's 1-minute load average.
pub fn load_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The live children of `pid` (every thread's `children` list).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for thread in threads.flatten() {
        if let Ok(list) = std::fs::read_to_string(thread.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// Live processes one of whose arguments is exactly `arg`.
pub fn processes_naming(arg: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
        })
        .collect()
}

/// What sampling saw of the runners.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunnerSamples {
    /// Distinct runner processes seen alive.
    pub seen: usize,
    /// The largest VmHWM read from any of them (a lower bound of their true peak: a runner's
    /// last moments fall between samples).
    pub peak_rss_kib: u64,
}

/// Samples the runner children of some nodes every `every` until stopped.
pub struct RunnerSampler {
    stop: Arc<AtomicBool>,
    result: Arc<Mutex<(BTreeSet<u32>, u64)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunnerSampler {
    pub fn start(nodes: Vec<u32>, every: Duration) -> RunnerSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let result = Arc::new(Mutex::new((BTreeSet::new(), 0)));
        let (flag, shared) = (stop.clone(), result.clone());
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                for node in &nodes {
                    for child in children(*node) {
                        let rss = peak_rss_kib(child).unwrap_or(0);
                        if let Ok(mut r) = shared.lock() {
                            r.0.insert(child);
                            r.1 = r.1.max(rss);
                        }
                    }
                }
                std::thread::sleep(every);
            }
        });
        RunnerSampler {
            stop,
            result,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) -> RunnerSamples {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.result
            .lock()
            .map(|r| RunnerSamples {
                seen: r.0.len(),
                peak_rss_kib: r.1,
            })
            .unwrap_or_default()
    }
}

impl Drop for RunnerSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The process of the server a `mongodb://host:port/…` URI names, when it runs on this
/// machine: the benches read its CPU from /proc.
pub fn server_pid(uri: &str) -> Option<u32> {
    let port: u16 = uri
        .rsplit(':')
        .next()
        .and_then(|p| p.split(['/', '?']).next())
        .and_then(|p| p.parse().ok())?;
    listener_pid(port)
}

/// The process listening on a local TCP port (the server, when it runs here), found through
/// /proc/net/tcp{,6} and the socket inodes in /proc/<pid>/fd.
pub fn listener_pid(port: u16) -> Option<u32> {
    let mut inodes = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if *state == "0A" && local_port == Some(port) {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for proc_entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = proc_entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.contains(target.to_string_lossy().as_ref()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// The machine the figures come from.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    Machine {
        cpu,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_found_by_an_argument() {
        let arg = format!("/tmp/no-such-config-{}.json", std::process::id());
        // A shell waiting in its own `read` builtin: no child process left behind.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read line", "sh", &arg])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawn sh");
        // Until its exec the child still shows the test's own command line.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut found = processes_naming(&arg);
        while found.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            found = processes_naming(&arg);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, [child.id()]);
        assert!(processes_naming(&format!("{arg}.other")).is_empty());
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let before = cpu_ticks(me).expect("own stat");
        let mut x = 0u64;
        for i in 0..30_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        let after = cpu_ticks(me).expect("own stat");
        assert!(after.own >= before.own);
        assert!(peak_rss_kib(me).expect("VmHWM") > 0);
        assert!(rss_kib(me).expect("VmRSS") > 0);
        assert!(open_fds(me).expect("fd count") >= 3);
        assert!(load_1m().is_some_and(|l| l >= 0.0));
        assert!(clock_ticks() > 0.0);
        let m = machine();
        assert!(m.cores > 0 && m.memory_gib > 0.0);
        assert_eq!(cpu_ticks(u32::MAX), None);
    }

    #[test]
    fn finds_a_listener_and_a_child() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert_eq!(listener_pid(port), Some(std::process::id()));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("spawn sleep");
        assert!(children(std::process::id()).contains(&child.id()));
        let _ = child.kill();
        let _ = child.wait();
    }
}
