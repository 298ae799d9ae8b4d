//! Request accounting for a run: requests per task by process and command with the idle
//! fleet's share taken out, the run's first claim, and request→reply times.

use std::collections::BTreeMap;

use serde::Serialize;

use super::proxy::{Counts, Tally};
use super::stats::Latency;

/// Requests per task during a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RoundTrips {
    /// App requests per task, with the idle fleet's rate over the run subtracted.
    pub per_task: f64,
    /// App requests per task as counted.
    pub raw_per_task: f64,
    /// The driver's monitoring requests per task (not in `per_task`).
    pub monitoring_per_task: f64,
    /// Per task by process kind (`den`, `dtr`), as counted.
    pub by_process: BTreeMap<String, f64>,
    /// Per task by `process label`, idle subtracted.
    pub by_command: BTreeMap<String, f64>,
    /// New connections per task (each runner opens its own).
    pub connections_per_task: f64,
}

/// What an idle fleet costs: requests and CPU while no task exists.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    pub secs: f64,
    pub requests_per_sec: f64,
    pub monitoring_per_sec: f64,
    /// App requests per second by `process label`.
    pub by_command_per_sec: BTreeMap<String, f64>,
    /// Each DEN's CPU use, percent of one core.
    pub den_cpu_percent: Vec<f64>,
    /// The server's CPU use over the same window (when it runs on this machine): what an idle
    /// fleet's change streams and periodic readings cost it.
    pub server_cpu_percent: Option<f64>,
    #[serde(skip)]
    pub(super) counts: Counts,
}

/// `den` for the DEN's connections, `dtr` for the task runners' (from the driver's `appName`).
pub fn short(who: &str) -> &str {
    match who.strip_prefix("disbatch-rs/").unwrap_or(who) {
        "disbatchd" => "den",
        "task_runner" => "dtr",
        other => other,
    }
}

pub fn flatten(tally: &Tally) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (who, labels) in tally {
        for (label, n) in labels {
            *out.entry(format!("{} {label}", short(who))).or_default() += n;
        }
    }
    out
}

/// Request→reply times by `process label`.
pub fn reply_latencies(counts: &Counts) -> BTreeMap<String, Latency> {
    counts
        .reply_ms
        .iter()
        .flat_map(|(who, labels)| {
            labels
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(move |(label, v)| (format!("{} {label}", short(who)), Latency::of(v)))
        })
        .collect()
}

/// The earliest write to `tasks` after the mark that the idle fleet never makes: a claim.
pub fn first_claim(counts: &Counts, idle: &IdleReport) -> Option<i64> {
    let idle_labels: Vec<&String> = idle.counts.app.values().flat_map(|m| m.keys()).collect();
    counts
        .first_seen
        .iter()
        .filter(|(label, _)| {
            let write = label.starts_with("findAndModify ") || label.starts_with("update ");
            write && label.ends_with(" tasks") && !idle_labels.contains(label)
        })
        .map(|(_, ms)| *ms)
        .min()
}

pub fn round_trips(counts: &Counts, idle: &IdleReport, window: f64, done: usize) -> RoundTrips {
    let n = done as f64;
    let scale = window / idle.secs.max(1e-9);
    let idle_flat = flatten(&idle.counts.app);
    let mut by_command = BTreeMap::new();
    let mut subtracted_total = 0.0;
    for (label, count) in flatten(&counts.app) {
        let idle_share = idle_flat.get(&label).copied().unwrap_or(0) as f64 * scale;
        let net = (count as f64 - idle_share).max(0.0);
        subtracted_total += net;
        if net > 0.0 {
            by_command.insert(label, net / n);
        }
    }
    let mut by_process = BTreeMap::new();
    for (who, labels) in &counts.app {
        *by_process.entry(short(who).to_string()).or_insert(0.0) +=
            labels.values().sum::<u64>() as f64 / n;
    }
    RoundTrips {
        per_task: subtracted_total / n,
        raw_per_task: counts.app_total() as f64 / n,
        monitoring_per_task: counts.monitoring_total() as f64 / n,
        by_process,
        by_command,
        connections_per_task: counts.connections as f64 / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(entries: &[(&str, &str, u64)]) -> Tally {
        let mut t = Tally::new();
        for (who, label, n) in entries {
            t.entry(who.to_string())
                .or_default()
                .insert(label.to_string(), *n);
        }
        t
    }

    #[test]
    fn the_idle_share_is_taken_out_per_command_and_claims_are_found() {
        const DEN: &str = "disbatch-rs/disbatchd";
        const DTR: &str = "disbatch-rs/task_runner";
        let idle = IdleReport {
            secs: 10.0,
            requests_per_sec: 2.0,
            monitoring_per_sec: 0.0,
            by_command_per_sec: BTreeMap::new(),
            den_cpu_percent: vec![0.1],
            server_cpu_percent: None,
            counts: Counts {
                app: tally(&[(DEN, "findAndModify nodes", 10), (DEN, "update tasks", 10)]),
                ..Counts::default()
            },
        };
        let mut run = Counts {
            app: tally(&[
                (DEN, "findAndModify nodes", 20),
                (DEN, "update tasks", 25),
                (DEN, "findAndModify tasks", 100),
                (DTR, "insert attempts", 100),
            ]),
            monitoring: tally(&[(DTR, "hello", 300)]),
            connections: 300,
            ..Counts::default()
        };
        // Over 20 s the idle fleet accounts for 20 heartbeats and 20 reaper updates.
        let rt = round_trips(&run, &idle, 20.0, 100);
        assert!((rt.per_task - 2.05).abs() < 1e-9, "{rt:?}");
        assert!((rt.raw_per_task - 2.45).abs() < 1e-9);
        assert!((rt.monitoring_per_task - 3.0).abs() < 1e-9);
        assert_eq!(rt.by_command.get("den findAndModify nodes"), None);
        assert_eq!(rt.by_command["den update tasks"], 0.05);
        assert_eq!(rt.by_command["dtr insert attempts"], 1.0);
        assert_eq!(rt.by_process["den"], 1.45);

        run.first_seen = [
            ("findAndModify nodes".to_string(), 3000),
            ("update tasks".to_string(), 4000),
            ("findAndModify tasks".to_string(), 5000),
            ("insert attempts".to_string(), 5100),
        ]
        .into();
        assert_eq!(
            first_claim(&run, &idle),
            Some(5000),
            "the reaper's update is idle traffic"
        );
        run.first_seen.remove("findAndModify tasks");
        assert_eq!(first_claim(&run, &idle), None);
    }
}
