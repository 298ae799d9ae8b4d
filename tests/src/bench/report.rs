//! The benchmark's report: the figures, the verdict on each target, and the text tables.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::Serialize;

use super::accounting::IdleReport;
use super::ceiling::{CeilingPoint, ClaimPath};
use super::fleet_run::RunReport;
use super::procfs::Machine;
use super::standalone::{ProxyCost, RunnerReport, ServerInfo};
use super::stats::{median, Latency};

/// Everything one DEN count measured.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    pub dens: usize,
    /// The bench queue's `worker` mode.
    pub worker: &'static str,
    pub threads: u32,
    pub idle: IdleReport,
    /// Enqueue→start (attempt start − ctime) of tasks enqueued one at a time into the idle fleet.
    pub idle_enqueue_to_start: Latency,
    pub runs: Vec<RunReport>,
}

/// One target of the issue, judged.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub target: String,
    pub scope: String,
    pub measured: f64,
    pub limit: f64,
    pub pass: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub command: String,
    pub machine: Machine,
    pub server: ServerInfo,
    pub loop_interval_ms: u64,
    /// The DENs' `change_streams` setting (false: they poll).
    pub change_streams: bool,
    pub proxy_cost: ProxyCost,
    pub ceiling: Vec<CeilingPoint>,
    pub runner: RunnerReport,
    pub fleets: Vec<FleetReport>,
    pub verdicts: Vec<Verdict>,
}

/// The best rate measured on `path` at the ceiling depth nearest `depth`: `Raw` is the
/// server's own claim; `Cycle` the whole-task ceiling (the DEN's claim in batches with its
/// results recorded as a worker host records them, no process anywhere: "DEN's + result").
fn best_at(points: &[CeilingPoint], path: ClaimPath, depth: usize) -> Option<&CeilingPoint> {
    let on_path = || points.iter().filter(|p| p.path == path);
    let nearest = on_path()
        .map(|p| p.depth)
        .min_by_key(|d| d.abs_diff(depth))?;
    on_path()
        .filter(|p| p.depth == nearest)
        .max_by(|a, b| a.claims_per_sec.total_cmp(&b.claims_per_sec))
}

/// Runs grouped by depth, in the order first seen.
fn by_depth(runs: &[RunReport]) -> Vec<(usize, Vec<&RunReport>)> {
    let mut out: Vec<(usize, Vec<&RunReport>)> = Vec::new();
    for r in runs {
        match out.iter_mut().find(|(d, _)| *d == r.depth) {
            Some((_, v)) => v.push(r),
            None => out.push((r.depth, vec![r])),
        }
    }
    out
}

/// Judges the four targets, on the median of each scenario's repeats.
pub fn verdicts(fleets: &[FleetReport], ceiling: &[CeilingPoint]) -> Vec<Verdict> {
    let mut out = worker_verdicts(fleets, ceiling);
    for f in fleets {
        let scope = format!("{} DEN, worker {}", f.dens, f.worker);
        for (depth, runs) in by_depth(&f.runs) {
            let scope = format!("{scope}, depth {depth}");
            let rt = median(
                &runs
                    .iter()
                    .map(|r| r.round_trips.per_task)
                    .collect::<Vec<_>>(),
            );
            let tput = median(&runs.iter().map(|r| r.tasks_per_sec).collect::<Vec<_>>());
            if let Some(c) = best_at(ceiling, ClaimPath::Raw, depth) {
                let limit = 0.5 * c.claims_per_sec / rt.max(1.0);
                out.push(Verdict {
                    target: "throughput ≥ 50% of raw claim rate ÷ round trips per task".into(),
                    scope: scope.clone(),
                    measured: tput,
                    limit,
                    pass: tput >= limit,
                    detail: format!(
                        "{tput:.1} tasks/s vs 0.5 × {:.0} claims/s (depth {}, ×{}) ÷ {rt:.2}",
                        c.claims_per_sec, c.depth, c.concurrency
                    ),
                });
            }
            out.push(Verdict {
                target: "≤ 3 round trips per task".into(),
                scope,
                measured: rt,
                limit: 3.0,
                pass: rt <= 3.0,
                detail: format!("{rt:.2} requests/task (monitoring and idle traffic excluded)"),
            });
        }
        if let Some(v) = depth_verdict(f, ceiling) {
            out.push(v);
        }
        let p50 = f.idle_enqueue_to_start.p50_ms;
        out.push(Verdict {
            target: "p50 enqueue→start < 20 ms on an idle fleet".into(),
            scope: format!("{} DEN", f.dens),
            measured: p50,
            limit: 20.0,
            pass: p50 < 20.0,
            detail: format!(
                "p50 {p50:.1} ms, p99 {:.1} ms over {} tasks",
                f.idle_enqueue_to_start.p99_ms, f.idle_enqueue_to_start.n
            ),
        });
        let cpu = f.idle.den_cpu_percent.iter().copied().fold(0.0, f64::max);
        out.push(Verdict {
            target: "DEN idle CPU < 1%".into(),
            scope: format!("{} DEN", f.dens),
            measured: cpu,
            limit: 1.0,
            pass: cpu < 1.0,
            detail: format!("busiest DEN {cpu:.2}% of a core over {:.0} s", f.idle.secs),
        });
    }
    out
}

/// Issue 32: persistent workers at ≥ 3× process mode's throughput and ≥ 80% of the
/// whole-task ceiling measured in the same invocation (what is left is our own overhead: node,
/// worker host, workers, protocol), with the server's CPU ≤ 1.5 ms per task (what decides how
/// large a fleet one server carries), at each DEN count and depth both modes ran.
fn worker_verdicts(fleets: &[FleetReport], ceiling: &[CeilingPoint]) -> Vec<Verdict> {
    let mut out = Vec::new();
    let tput =
        |runs: &Vec<&RunReport>| median(&runs.iter().map(|r| r.tasks_per_sec).collect::<Vec<_>>());
    for p in fleets.iter().filter(|f| f.worker == "persistent") {
        let process = fleets
            .iter()
            .find(|f| f.worker == "process" && f.dens == p.dens);
        for (depth, runs) in by_depth(&p.runs) {
            let fast = tput(&runs);
            let scope = format!("{} DEN, depth {depth}", p.dens);
            if let Some(slow) = process.and_then(|f| {
                by_depth(&f.runs)
                    .into_iter()
                    .find(|(d, _)| *d == depth)
                    .map(|(_, r)| tput(&r))
            }) {
                out.push(Verdict {
                    target: "persistent workers ≥ 3× process mode".into(),
                    scope: scope.clone(),
                    measured: fast / slow.max(1e-9),
                    limit: 3.0,
                    pass: fast >= 3.0 * slow,
                    detail: format!("{fast:.1} vs {slow:.1} tasks/s"),
                });
            }
            if let Some(c) = best_at(ceiling, ClaimPath::Cycle, depth) {
                let share = fast / c.claims_per_sec.max(1e-9);
                out.push(Verdict {
                    target: "persistent workers ≥ 80% of the whole-task ceiling".into(),
                    scope: scope.clone(),
                    measured: share,
                    limit: 0.8,
                    pass: share >= 0.8,
                    detail: format!(
                        "{fast:.1} tasks/s vs {:.0} tasks/s claimed and recorded alone (depth {}, batch {})",
                        c.claims_per_sec, c.depth, c.batch
                    ),
                });
            }
            let server: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.server_cpu_ms_per_task)
                .collect();
            if !server.is_empty() {
                let ms = median(&server);
                // The floor beside it: the same server's CPU for a task's writes with no node,
                // worker or stream (the whole-task ceiling's own run).
                let floor = best_at(ceiling, ClaimPath::Cycle, depth)
                    .and_then(|c| c.server_cpu_ms_per_claim)
                    .map_or(String::new(), |f| {
                        format!("; the whole-task ceiling's own writes: {f:.2} ms per task")
                    });
                out.push(Verdict {
                    target: "server CPU ≤ 1.5 ms per task, persistent workers".into(),
                    scope,
                    measured: ms,
                    limit: 1.5,
                    pass: ms <= 1.5,
                    detail: format!(
                        "{ms:.2} ms per task (median of {} runs){floor}",
                        server.len()
                    ),
                });
            }
        }
    }
    out
}

/// The issue: claim cost should not grow with queue depth beyond what the server's own does.
/// Judged on throughput, shallowest against deepest depth, with 25% for noise.
fn depth_verdict(f: &FleetReport, ceiling: &[CeilingPoint]) -> Option<Verdict> {
    let groups = by_depth(&f.runs);
    let (shallow, shallow_runs) = groups.iter().min_by_key(|(d, _)| *d)?;
    let (deep, deep_runs) = groups.iter().max_by_key(|(d, _)| *d)?;
    if shallow == deep {
        return None;
    }
    let tput =
        |runs: &Vec<&RunReport>| median(&runs.iter().map(|r| r.tasks_per_sec).collect::<Vec<_>>());
    let ours = tput(shallow_runs) / tput(deep_runs).max(1e-9);
    let server = best_at(ceiling, ClaimPath::Raw, *shallow)?.claims_per_sec
        / best_at(ceiling, ClaimPath::Raw, *deep)?
            .claims_per_sec
            .max(1e-9);
    let limit = server.max(1.0) * 1.25;
    Some(Verdict {
        target: "slowdown with depth ≤ the server's own (+25%)".into(),
        scope: format!("{} DEN, depth {shallow} → {deep}", f.dens),
        measured: ours,
        limit,
        pass: ours <= limit,
        detail: format!(
            "throughput falls {ours:.2}× from depth {shallow} to {deep}; the raw claim rate falls {server:.2}×"
        ),
    })
}

fn kib(v: u64) -> String {
    format!("{:.1} MiB", v as f64 / 1024.0)
}

impl fmt::Display for BenchReport {
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
            "server:  {} version {} (set {})  DEN loop_interval_ms {}, change_streams {}",
            self.server.host,
            self.server.version,
            self.server.set_name.as_deref().unwrap_or("-"),
            self.loop_interval_ms,
            self.change_streams
        )?;
        writeln!(
            out,
            "proxy:   ping p50 {:.3} ms direct, {:.3} ms through the counting proxy\n",
            self.proxy_cost.direct.p50_ms, self.proxy_cost.proxied.p50_ms
        )?;
        writeln!(
            out,
            "Raw claim ceiling (findOneAndUpdate, sort _id, same driver), and the DEN's own claim alone"
        )?;
        writeln!(
            out,
            "| claim | depth | claimers | tasks per claim | tasks claimed | tasks/s | p50 ms per claim | p99 ms | server CPU ms/task | drained |"
        )?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
        for p in &self.ceiling {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {} | {} |",
                match p.path {
                    ClaimPath::Raw => "raw",
                    ClaimPath::Disbatch => "DEN's",
                    ClaimPath::Cycle => "DEN's + result",
                },
                p.depth,
                p.concurrency,
                p.batch,
                p.claims,
                p.claims_per_sec,
                p.latency.p50_ms,
                p.latency.p99_ms,
                p.server_cpu_ms_per_claim
                    .map_or("n/a".into(), |v| format!("{v:.2}")),
                if p.drained { "yes" } else { "sampled" }
            )?;
        }
        let r = &self.runner;
        writeln!(
            out,
            "\nTask runner alone ({} runs): spawn→exit p50 {:.1} ms p99 {:.1} ms; {:.2} requests/run \
             (+{:.2} monitoring, {:.1} connections); peak RSS {}",
            r.runs, r.spawn_to_exit.p50_ms, r.spawn_to_exit.p99_ms, r.requests_per_run,
            r.monitoring_per_run, r.connections_per_run,
            r.peak_rss_kib.map_or("n/a".into(), kib)
        )?;
        writeln!(out, "  per run: {}", fmt_map(&r.by_command))?;
        for f in &self.fleets {
            fleet_table(out, f)?;
        }
        writeln!(out, "\nVerdict")?;
        for v in &self.verdicts {
            writeln!(
                out,
                "  {} {} [{}]: {}",
                if v.pass { "PASS" } else { "FAIL" },
                v.target,
                v.scope,
                v.detail
            )?;
        }
        Ok(())
    }
}

fn fmt_map(map: &BTreeMap<String, f64>) -> String {
    let mut s = String::new();
    for (k, v) in map {
        let _ = write!(s, "{k} {v:.2}; ");
    }
    s.trim_end_matches("; ").to_string()
}

fn fleet_table(out: &mut fmt::Formatter<'_>, f: &FleetReport) -> fmt::Result {
    let i = &f.idle;
    writeln!(
        out,
        "\n{} DEN, worker {}, queue threads {}",
        f.dens, f.worker, f.threads
    )?;
    writeln!(
        out,
        "  idle {:.0} s: {:.2} requests/s (+{:.2} monitoring/s); DEN CPU {}",
        i.secs,
        i.requests_per_sec,
        i.monitoring_per_sec,
        i.den_cpu_percent
            .iter()
            .map(|c| format!("{c:.2}%"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    if let Some(server) = i.server_cpu_percent {
        writeln!(out, "  idle server CPU {server:.2}%")?;
    }
    writeln!(out, "  idle requests/s: {}", fmt_map(&i.by_command_per_sec))?;
    let l = &f.idle_enqueue_to_start;
    writeln!(
        out,
        "  enqueue→start, idle fleet, one task at a time: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={})",
        l.p50_ms, l.p99_ms, l.max_ms, l.n
    )?;
    writeln!(
        out,
        "  | depth | run | queued | tasks | tasks/s | queued→start p50 / p99 ms | req/task (raw) | monitoring/task | DEN CPU ms/task | runner CPU ms/task | server CPU ms/task | DEN peak RSS | runner peak RSS (sampled, n) |"
    )?;
    writeln!(
        out,
        "  |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    for r in &f.runs {
        writeln!(
            out,
            "  | {} | {} | {} | {} | {:.1} | {:.0} / {:.0} | {:.2} ({:.2}) | {:.2} | {:.2} | {:.2} | {} | {} | {} ({}) |",
            r.depth, r.repeat, r.queued_at_go,
            if r.stopped_by == "time" { format!("{} (time limit)", r.tasks) } else { r.tasks.to_string() },
            r.tasks_per_sec,
            r.queued_to_start.p50_ms, r.queued_to_start.p99_ms,
            r.round_trips.per_task, r.round_trips.raw_per_task, r.round_trips.monitoring_per_task,
            r.den_cpu_ms_per_task, r.runner_cpu_ms_per_task,
            r.server_cpu_ms_per_task.map_or("n/a".into(), |v| format!("{v:.2}")),
            kib(r.den_peak_rss_kib), kib(r.runners.peak_rss_kib), r.runners.seen
        )?;
    }
    for (depth, runs) in by_depth(&f.runs) {
        if let Some(last) = runs.last() {
            writeln!(
                out,
                "  depth {depth}, run {} requests/task: {}",
                last.repeat,
                fmt_map(&last.round_trips.by_command)
            )?;
            let replies: BTreeMap<String, f64> = last
                .reply_ms
                .iter()
                .filter(|(k, _)| k.starts_with("den "))
                .map(|(k, l)| (k.clone(), l.p50_ms))
                .collect();
            writeln!(out, "    DEN request→reply p50 ms: {}", fmt_map(&replies))?;
            writeln!(
                out,
                "    by process: {}; connections/task {:.2}; first claim from {}",
                fmt_map(&last.round_trips.by_process),
                last.round_trips.connections_per_task,
                last.first_claim_from
            )?;
            let c = &last.contention;
            writeln!(
                out,
                "    claims per task (DEN metrics): claimed {:.2}, lost to another node {:.3}, slot taken {:.3}, empty reads {:.3}",
                c.claimed_per_task, c.lost_per_task, c.slot_taken_per_task, c.empty_reads_per_task
            )?;
        }
    }
    Ok(())
}
