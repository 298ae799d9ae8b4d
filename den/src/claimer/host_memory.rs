//! What this host offers: available memory, for work specs with `min_gb`.

/// Memory available for new work, in GB (`MemAvailable` from /proc/meminfo); None if unknown.
pub fn available_gb() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available_gb(&text)
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
