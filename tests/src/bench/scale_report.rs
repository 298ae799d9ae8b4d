//! Fleet mode's report: the figures of each fleet size, and their text tables.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::Serialize;

use super::procfs::Machine;
use super::standalone::ServerInfo;
use super::stats::Latency;

/// A second whose server CPU is under this (percent of a core) counts as settled.
pub const SETTLED_PERCENT: f64 = 5.0;

#[derive(Debug, Clone, Serialize)]
pub struct PausedInsertFigures {
    /// "store": through the DCI's path (tasks, then their queue's work signal); "direct".
    pub how: &'static str,
    pub tasks: usize,
    pub insert_secs: f64,
    /// The server's CPU, percent of a core, in each second after the insert ended.
    pub server_cpu_after: Vec<f64>,
    /// Requests the proxy forwarded (the DENs' app requests) in each of those seconds.
    pub requests_after: Vec<f64>,
    /// Seconds from the insert's end to the start of the first second under
    /// `SETTLED_PERCENT` (None: the server's CPU is not visible from here, or none was).
    pub settled_after_secs: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    pub command: String,
    pub machine: Machine,
    pub server: ServerInfo,
    pub loop_interval_ms: u64,
    pub change_streams: bool,
    /// The recovery queue's `lease`, seconds (the default is 30).
    pub recovery_lease_secs: u64,
    pub sizes: Vec<SizeReport>,
    /// Why the sizes after the last one reported were not measured (an error, the time bound).
    pub stopped: Option<String>,
}

/// Everything measured on one fleet size.
#[derive(Debug, Clone, Serialize)]
pub struct SizeReport {
    pub dens: usize,
    /// The bench queue's `threads` during probes and the backlog.
    pub threads: u32,
    /// From the first DEN's start until every node had heartbeat.
    pub start_secs: f64,
    pub idle: IdleFigures,
    /// Attempt start − task ctime of tasks inserted one at a time into the idle fleet.
    pub enqueue_to_start: Latency,
    /// Requests above the idle rate per probe task: every node's change stream wakes it.
    pub requests_per_probe: f64,
    /// The same probes inserted straight into the collection (no work signal): started on the
    /// maintenance leader's probe, within a pass.
    pub enqueue_to_start_direct: Latency,
    /// Bulk inserts into the paused queue with the fleet idle: through our writers, then
    /// straight into the collection.
    pub paused_inserts: Vec<PausedInsertFigures>,
    pub backlog: BacklogFigures,
    /// A follower's host dying, then (with 3 nodes or more) the maintenance leader's.
    pub recovery: Vec<RecoveryFigures>,
    /// The machine's 1-minute load average after the idle window and after the backlog: the
    /// cores are shared, and other work running meanwhile shows here.
    pub load_1m: (Option<f64>, Option<f64>),
}

#[derive(Debug, Clone, Serialize)]
pub struct IdleFigures {
    pub secs: f64,
    /// Every request the proxy forwarded (app and driver monitoring), per second.
    pub requests_per_sec: f64,
    pub requests_per_sec_per_den: f64,
    /// Of which the drivers' monitoring (hello on connections that only monitor).
    pub monitoring_per_sec: f64,
    /// Of which change-stream `getMore`s.
    pub get_more_per_sec: f64,
    /// App requests per second by `process command collection`.
    pub by_command_per_sec: BTreeMap<String, f64>,
    pub server_cpu_percent: Option<f64>,
    /// All DENs together, percent of one core; and the busiest one.
    pub den_cpu_percent_total: f64,
    pub den_cpu_percent_max: f64,
    /// Connections open through the proxy (all the DENs'), and per DEN.
    pub open_connections: u64,
    pub connections_per_den: f64,
    /// Descriptors the server process holds (when it runs here).
    pub server_fds: Option<usize>,
    pub den_rss_mib_total: f64,
    pub den_rss_mib_max: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BacklogFigures {
    pub depth: usize,
    pub tasks: usize,
    /// "tasks" when every task ran, "time" when the run's bound came first.
    pub stopped_by: &'static str,
    /// From enqueueing the backlog into the closed queue until the fleet's traffic was back to
    /// idle: N nodes read N change streams' insert events.
    pub enqueue_settle_secs: f64,
    /// First attempt start → last task mtime.
    pub busy_secs: f64,
    pub tasks_per_sec: f64,
    /// App requests during the run, less the idle rate over the same time, ÷ tasks.
    pub requests_per_task: f64,
    /// Every app request during the run ÷ tasks. When the server is saturated the fleet's
    /// own periodic traffic slows down too, and the figure above undercounts (even below 0).
    pub raw_requests_per_task: f64,
    pub den_cpu_ms_per_task: f64,
    pub runner_cpu_ms_per_task: f64,
    pub server_cpu_ms_per_task: Option<f64>,
    pub share: Share,
}

/// How the backlog's tasks spread over the nodes (the tasks' `node`).
#[derive(Debug, Clone, Serialize)]
pub struct Share {
    pub nodes_used: usize,
    pub min: u64,
    pub max: u64,
    pub min_percent: f64,
    pub max_percent: f64,
    /// 100 / N: what a perfectly even split gives each node.
    pub even_percent: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RecoveryFigures {
    /// "follower" or "leader" (held the maintenance lease when killed).
    pub victim: &'static str,
    pub node: String,
    /// Its tasks (of a queue of long tasks, `on_lost: requeue`) when its host died.
    pub tasks: usize,
    /// Each task's `lease_until` − the kill: the lease still to run (min, max).
    pub lease_left_ms: (f64, f64),
    /// The kill → the next attempt's start on another node (min, max).
    pub retaken_ms: (f64, f64),
    /// The kill → the task's success (min, max).
    pub done_ms: (f64, f64),
    /// Nodes that took its tasks.
    pub taken_by: usize,
}

fn ms_range((a, b): (f64, f64)) -> String {
    format!("{:.1}–{:.1} s", a / 1000.0, b / 1000.0)
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

impl fmt::Display for ScaleReport {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.machine;
        writeln!(out, "command: {}", self.command)?;
        writeln!(
            out,
            "machine: {} × {}, {} GiB, Linux {}",
            m.cores, m.cpu, m.memory_gib, m.kernel
        )?;
        writeln!(
            out,
            "server:  {} version {}  DEN loop_interval_ms {}, change_streams {}, recovery queue lease {} s (on_lost requeue)",
            self.server.host,
            self.server.version,
            self.loop_interval_ms,
            self.change_streams,
            self.recovery_lease_secs
        )?;
        writeln!(
            out,
            "\nFleet: one row per size (all DENs on this machine's cores, with the server)"
        )?;
        writeln!(
            out,
            "| DENs | idle req/s (per DEN) | of which getMore / monitoring | idle server CPU | idle DEN CPU (all / max) | connections (per DEN) | server fds | DEN RSS (all / max) | enqueue→start p50 / p99 | req per probe | backlog tasks/s | req/task (raw) | share min–max (even) | follower's tasks retaken | leader's tasks retaken |"
        )?;
        writeln!(
            out,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        )?;
        for s in &self.sizes {
            let i = &s.idle;
            let b = &s.backlog;
            let rec = |who: &str| {
                s.recovery
                    .iter()
                    .find(|r| r.victim == who)
                    .map_or("n/a".to_string(), |r| {
                        format!("{} ({} tasks)", ms_range(r.retaken_ms), r.tasks)
                    })
            };
            writeln!(
                out,
                "| {} | {:.1} ({:.2}) | {:.2} / {:.2} | {}% | {:.1}% / {:.2}% | {} ({:.1}) | {} | {:.0} / {:.0} MiB | {:.0} / {:.0} ms | {:.1} | {:.1}{} | {:.2} ({:.2}) | {}–{} ({:.1}–{:.1}%, even {:.1}%) | {} | {} |",
                s.dens,
                i.requests_per_sec,
                i.requests_per_sec_per_den,
                i.get_more_per_sec,
                i.monitoring_per_sec,
                opt(i.server_cpu_percent, 2),
                i.den_cpu_percent_total,
                i.den_cpu_percent_max,
                i.open_connections,
                i.connections_per_den,
                i.server_fds.map_or("n/a".into(), |n| n.to_string()),
                i.den_rss_mib_total,
                i.den_rss_mib_max,
                s.enqueue_to_start.p50_ms,
                s.enqueue_to_start.p99_ms,
                s.requests_per_probe,
                b.tasks_per_sec,
                if b.stopped_by == "time" { " (time bound)" } else { "" },
                b.requests_per_task,
                b.raw_requests_per_task,
                b.share.min,
                b.share.max,
                b.share.min_percent,
                b.share.max_percent,
                b.share.even_percent,
                rec("follower"),
                rec("leader"),
            )?;
        }
        for s in &self.sizes {
            size_details(out, s)?;
        }
        if let Some(why) = &self.stopped {
            writeln!(out, "\nStopped: {why}")?;
        }
        Ok(())
    }
}

fn size_details(out: &mut fmt::Formatter<'_>, s: &SizeReport) -> fmt::Result {
    let i = &s.idle;
    let b = &s.backlog;
    writeln!(
        out,
        "\n{} DENs: started in {:.1} s; queue threads {}; load average after idle {}, after backlog {}",
        s.dens,
        s.start_secs,
        s.threads,
        opt(s.load_1m.0, 2),
        opt(s.load_1m.1, 2)
    )?;
    let mut by = String::new();
    for (k, v) in &i.by_command_per_sec {
        let _ = write!(by, "{k} {v:.2}; ");
    }
    writeln!(
        out,
        "  idle {:.0} s, app requests/s: {}",
        i.secs,
        by.trim_end_matches("; ")
    )?;
    writeln!(
        out,
        "  enqueue→start: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={}); {:.1} requests per probe above idle",
        s.enqueue_to_start.p50_ms,
        s.enqueue_to_start.p99_ms,
        s.enqueue_to_start.max_ms,
        s.enqueue_to_start.n,
        s.requests_per_probe
    )?;
    writeln!(
        out,
        "  backlog {}: {} tasks in {:.1} s = {:.1} tasks/s (stopped by {}); {:.2} requests/task ({:.2} raw); CPU ms/task DEN {:.2}, runner+plugin {:.2}, server {}; the enqueue settled in {:.1} s",
        b.depth,
        b.tasks,
        b.busy_secs,
        b.tasks_per_sec,
        b.stopped_by,
        b.requests_per_task,
        b.raw_requests_per_task,
        b.den_cpu_ms_per_task,
        b.runner_cpu_ms_per_task,
        opt(b.server_cpu_ms_per_task, 2),
        b.enqueue_settle_secs
    )?;
    writeln!(
        out,
        "  share: {} of {} nodes ran tasks; fewest {} ({:.2}%), most {} ({:.2}%); even {:.2}%",
        b.share.nodes_used,
        s.dens,
        b.share.min,
        b.share.min_percent,
        b.share.max,
        b.share.max_percent,
        b.share.even_percent
    )?;
    writeln!(
        out,
        "  enqueue→start of tasks inserted directly: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={})",
        s.enqueue_to_start_direct.p50_ms,
        s.enqueue_to_start_direct.p99_ms,
        s.enqueue_to_start_direct.max_ms,
        s.enqueue_to_start_direct.n
    )?;
    for p in &s.paused_inserts {
        let cpu: Vec<String> = p
            .server_cpu_after
            .iter()
            .map(|c| format!("{c:.0}"))
            .collect();
        let req: Vec<String> = p.requests_after.iter().map(|r| format!("{r:.0}")).collect();
        writeln!(
            out,
            "  paused insert ({}): {} tasks in {:.1} s; server CPU % each second after: [{}]; requests/s: [{}]; under {}% after {}",
            p.how,
            p.tasks,
            p.insert_secs,
            cpu.join(", "),
            req.join(", "),
            SETTLED_PERCENT,
            p.settled_after_secs
                .map_or("n/a".into(), |s| format!("{s:.1} s"))
        )?;
    }
    for r in &s.recovery {
        writeln!(
            out,
            "  {} {} killed with its runners, {} tasks: lease left {}, retaken {}, done {}, by {} node(s)",
            r.victim,
            r.node,
            r.tasks,
            ms_range(r.lease_left_ms),
            ms_range(r.retaken_ms),
            ms_range(r.done_ms),
            r.taken_by
        )?;
    }
    Ok(())
}
