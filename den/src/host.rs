//! What this host offers: available memory (for work specs with `min_gb`), and the open-file
//! limit the node's runners need.

/// Memory available for new work, in GB (`MemAvailable` from /proc/meminfo); None if unknown.
pub fn available_gb() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available_gb(&text)
}

/// Raises the soft open-file limit to the hard one: each running task holds two pipe ends to its
/// runner, and a 1024 soft limit (systemd's default) would cap a node near 500 tasks.
/// Returns the limit now in force.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(std::io::Error::from)?;
    }
    Ok(hard.max(soft))
}

fn parse_mem_available_gb(meminfo: &str) -> Option<f64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_file_limit_rises_to_the_hard_limit() {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let read = || getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| e.to_string());
        let (_, hard) = read().unwrap();
        // Lowering the soft limit is always allowed; half the hard limit is plenty for the
        // other tests in this process meanwhile.
        setrlimit(Resource::RLIMIT_NOFILE, hard / 2, hard).unwrap();
        assert_eq!(read().unwrap().0, hard / 2);
        let limit = raise_open_file_limit().map_err(|e| e.to_string());
        assert_eq!(limit, Ok(hard));
        assert_eq!(read().unwrap(), (hard, hard));
    }

    #[test]
    fn reads_mem_available_in_gigabytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   2097152 kB\n";
        assert_eq!(parse_mem_available_gb(text), Some(2.0));
        assert_eq!(parse_mem_available_gb("MemTotal: 1 kB\n"), None);
        assert!(
            available_gb().is_some_and(|gb| gb > 0.0),
            "this machine reports memory"
        );
    }
}
