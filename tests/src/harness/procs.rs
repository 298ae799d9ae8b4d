//! Processes as `/proc` shows them: a plugin found by its attempt, and whether a pid still runs.

use bson::oid::ObjectId;
use bson::Document;

/// Processes whose environment names this attempt: its plugin, while it lives (a zombie
/// shows no environment).
pub fn processes_of_attempt(attempt: ObjectId) -> Vec<u32> {
    let needle = format!("DISBATCH_ATTEMPT={}", attempt.to_hex());
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

/// The worker pid a task printed (echo's `print_pid`).
pub fn pid_of(task: &Document) -> Option<u32> {
    task.get_str("stdout")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("pid ")?.trim().parse().ok())
}

/// The pid is there and not a zombie; a pid whose `stat` cannot be read counts as alive.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// The pid's `stat` reads and shows a state other than zombie; one that cannot be read is gone.
pub fn running_process(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}
