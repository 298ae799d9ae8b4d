//! `disbatch-bench`: task execution measured end to end on real DENs, runners and a real
//! server — throughput, enqueue→start latency, round trips (counted by a wire proxy), CPU,
//! RSS — judged against the server's own raw claim rate.

pub mod accounting;
pub mod ceiling;
pub mod contention;
mod fan;
pub mod flags;
pub mod fleet;
mod fleet_backlog;
pub mod fleet_paused;
mod fleet_recovery;
pub mod fleet_run;
pub mod fleet_scale;
pub mod procfs;
pub mod proxy;
pub mod report;
pub mod scale_report;
pub mod standalone;
pub mod stats;
pub mod wire;

use std::time::Duration;

use anyhow::Context;

use fleet::Fleet;
use proxy::HostUri;
use report::{BenchReport, FleetReport};
use scale_report::ScaleReport;

/// What to measure and how much.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    /// The server; None uses the test harness's (`DISBATCH_TEST_MONGODB_URI`, else a private
    /// server started the way scripts/local-mongodb starts one).
    pub uri: Option<String>,
    pub dens: Vec<usize>,
    /// Tasks worked per run.
    pub tasks: usize,
    /// Queue depths (backlogs) to work from.
    pub depths: Vec<usize>,
    /// The queue's `threads`; None gives 8 per DEN.
    pub threads: Option<u32>,
    pub repeat: usize,
    pub idle: Duration,
    /// Tasks enqueued one at a time into the idle fleet, and the gap between them.
    pub latency_tasks: usize,
    pub latency_gap: Duration,
    /// Ceiling: depths drained (up to `ceiling_drain_limit`) or sampled, by claimer counts.
    pub ceiling_depths: Vec<usize>,
    pub ceiling_concurrency: Vec<usize>,
    pub ceiling_drain_limit: usize,
    pub ceiling_sample_claims: usize,
    pub ceiling_sample_time: Duration,
    pub runner_runs: usize,
    /// The DENs' `loop_interval_ms` (the DEN's own default unless set).
    pub loop_ms: u64,
    /// The DENs' `change_streams`; `--polling` turns them off, to measure the fallback and
    /// what the streams cost the server.
    pub change_streams: bool,
    /// A run from a backlog deeper than `tasks` stops after `tasks` tasks or this long,
    /// whichever comes first: on a server whose claims slow down with depth, deep runs are
    /// sampled. Runs that drain their queue always run every task.
    pub run_secs: Duration,
    pub json: Option<std::path::PathBuf>,
    /// Fleet mode (`--fleet 1,10,50,100`): these fleet sizes instead of the task matrix. There
    /// `tasks` is the backlog worked, `threads` the queue's (default max(8, 2·N)), `idle` the
    /// idle window and `latency_tasks` the enqueue→start probes.
    pub fleet: Option<Vec<usize>>,
    /// Fleet mode: the `lease` (seconds) of the queue whose tasks a killed node leaves behind.
    pub lease_secs: u64,
    /// Fleet mode: the most one fleet size may take, from its first DEN to its last stopped.
    pub size_secs: Duration,
    /// Fleet mode: DENs started at once; each batch reports before the next starts, so a
    /// hundred nodes' start-up (indexes, first readings) does not hit the server in one burst.
    pub start_batch: usize,
    /// The bench queue's `worker` modes, each measured on a fleet of its own, in this order
    /// (`--worker process|persistent|both`).
    pub workers: Vec<&'static str>,
    /// Fleet mode: nodes are named `PREFIX-000`, `PREFIX-001`, … (default `fleet`). A test
    /// names its own, so that its check for processes left over sees none of another run's.
    pub node_prefix: String,
    /// Fleet mode: tasks inserted in bulk into the paused queue with the fleet idle, once
    /// through our writers and once straight into the collection (`--paused-tasks`).
    pub paused_tasks: usize,
    /// Fleet mode: how long the server is watched after each paused insert.
    pub paused_watch: Duration,
    /// A flow limit set on the bench queue far above what the fleet can start, to measure
    /// what asking for it costs (`--limits rate|concurrency`): None sets none.
    pub limits: Option<&'static str>,
    /// Each run's tasks as one graph (`--graph fan`): a root, the rest waiting on it, and a
    /// merge waiting on all of those; else independent tasks.
    pub graph: bool,
}

impl BenchOptions {
    /// The scale points; about 10 minutes on 2 cores.
    pub fn full() -> Self {
        BenchOptions {
            uri: None,
            dens: vec![1, 2, 4],
            tasks: 1000,
            depths: vec![1000, 100_000],
            threads: None,
            repeat: 3,
            idle: Duration::from_secs(10),
            latency_tasks: 200,
            latency_gap: Duration::from_millis(20),
            ceiling_depths: vec![1000, 100_000],
            ceiling_concurrency: vec![1, 4, 16],
            ceiling_drain_limit: 2000,
            ceiling_sample_claims: 2000,
            ceiling_sample_time: Duration::from_secs(3),
            runner_runs: 20,
            loop_ms: disbatch_config::DEFAULT_LOOP_INTERVAL.as_millis() as u64,
            change_streams: true,
            run_secs: Duration::from_secs(15),
            json: None,
            fleet: None,
            lease_secs: 6,
            size_secs: Duration::from_secs(900),
            start_batch: 10,
            workers: vec!["process"],
            node_prefix: "fleet".to_string(),
            paused_tasks: 100_000,
            paused_watch: Duration::from_secs(20),
            limits: None,
            graph: false,
        }
    }

    /// Fleet mode's base: a 20 s idle window, 50 probes 200 ms apart, a 2 000-task backlog
    /// (`quick`: 5 s, 20 probes, 300 tasks).
    fn fleet_mode(quick: bool) -> Self {
        let base = if quick {
            BenchOptions::quick()
        } else {
            BenchOptions::full()
        };
        BenchOptions {
            idle: Duration::from_secs(if quick { 5 } else { 20 }),
            latency_tasks: if quick { 20 } else { 50 },
            latency_gap: Duration::from_millis(200),
            tasks: if quick { 300 } else { 2000 },
            paused_tasks: if quick { 2000 } else { 100_000 },
            paused_watch: Duration::from_secs(if quick { 5 } else { 20 }),
            ..base
        }
    }

    /// About a minute: smaller numbers, one repeat.
    pub fn quick() -> Self {
        BenchOptions {
            dens: vec![1, 2],
            tasks: 200,
            depths: vec![200, 5000],
            repeat: 1,
            idle: Duration::from_secs(3),
            latency_tasks: 50,
            ceiling_depths: vec![200, 5000],
            ceiling_sample_time: Duration::from_secs(2),
            runner_runs: 5,
            run_secs: Duration::from_secs(10),
            ..BenchOptions::full()
        }
    }

    fn threads_for(&self, dens: usize) -> u32 {
        self.threads.unwrap_or(8 * dens as u32)
    }

    /// Fleet mode: room for every node to run some of the backlog.
    fn fleet_threads_for(&self, dens: usize) -> u32 {
        self.threads.unwrap_or((2 * dens as u32).max(8))
    }
}

pub const USAGE: &str = "usage: disbatch-bench [--quick] [--uri URI] [--dens 1,2,4] [--tasks N] \
[--depth 1000,100000] [--threads N] [--repeat N] [--run-secs S] [--idle-secs S] \
[--latency-tasks N] [--loop-ms MS] [--polling] [--worker process|persistent|both] [--json FILE]
       disbatch-bench --fleet 1,10,50,100 [--quick] [--uri URI] [--tasks N] [--threads N] \
[--idle-secs S] [--latency-tasks N] [--paused-tasks N] [--lease-secs S] [--size-secs S] [--loop-ms MS] \
[--json FILE]";

fn list(flag: &str, v: &str) -> Result<Vec<usize>, String> {
    let items: Result<Vec<usize>, _> = v.split(',').map(|s| s.trim().parse::<usize>()).collect();
    match items {
        Ok(items) if !items.is_empty() && items.iter().all(|n| *n > 0) => Ok(items),
        _ => Err(format!(
            "{flag} {v:?}: expected positive whole numbers separated by commas"
        )),
    }
}

fn number(flag: &str, v: &str) -> Result<u64, String> {
    v.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{flag} {v:?}: expected a positive whole number"))
}

/// Parses the command line (without the program name). `--quick` sets the base wherever it
/// appears; the other options override it.
pub fn parse_args(args: &[String]) -> Result<BenchOptions, String> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = if args.iter().any(|a| a == "--fleet") {
        BenchOptions::fleet_mode(quick)
    } else if quick {
        BenchOptions::quick()
    } else {
        BenchOptions::full()
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--quick" {
            continue;
        }
        if flag == "--polling" {
            o.change_streams = false;
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag}: missing value (or unknown flag)"))?;
        match flag.as_str() {
            "--uri" => o.uri = Some(value.clone()),
            "--dens" => o.dens = list(flag, value)?,
            "--tasks" => o.tasks = number(flag, value)? as usize,
            "--depth" => o.depths = list(flag, value)?,
            "--threads" => {
                o.threads = Some(u32::try_from(number(flag, value)?).map_err(|e| e.to_string())?)
            }
            "--repeat" => o.repeat = number(flag, value)? as usize,
            "--idle-secs" => o.idle = Duration::from_secs(number(flag, value)?),
            "--latency-tasks" => o.latency_tasks = number(flag, value)? as usize,
            "--loop-ms" => o.loop_ms = number(flag, value)?,
            "--run-secs" => o.run_secs = Duration::from_secs(number(flag, value)?),
            "--json" => o.json = Some(value.into()),
            "--fleet" => o.fleet = Some(list(flag, value)?),
            "--lease-secs" => o.lease_secs = number(flag, value)?.max(3),
            "--size-secs" => o.size_secs = Duration::from_secs(number(flag, value)?),
            "--paused-tasks" => o.paused_tasks = number(flag, value)? as usize,
            "--limits" => {
                o.limits = match value.as_str() {
                    "none" => None,
                    "rate" => Some("rate"),
                    "concurrency" => Some("concurrency"),
                    other => {
                        return Err(format!(
                            "--limits {other:?}: expected none, rate or concurrency"
                        ))
                    }
                }
            }
            "--graph" => {
                o.graph = match value.as_str() {
                    "none" => false,
                    "fan" => true,
                    other => return Err(format!("--graph {other:?}: expected none or fan")),
                }
            }
            "--worker" => {
                o.workers = match value.as_str() {
                    "process" => vec!["process"],
                    "persistent" => vec!["persistent"],
                    "both" => vec!["process", "persistent"],
                    other => {
                        return Err(format!(
                            "--worker {other:?}: expected process, persistent or both"
                        ))
                    }
                }
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    // The ceiling is measured at the depths the scenarios use.
    o.ceiling_depths = o.depths.clone();
    Ok(o)
}

static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Progress on stderr, with seconds since the first line, so stdout carries only the report.
pub fn progress(line: &str) {
    let started = STARTED.get_or_init(std::time::Instant::now);
    eprintln!("[bench {:>6.1}s] {line}", started.elapsed().as_secs_f64());
}

/// What a run measured: the task matrix, or fleet mode's sizes.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum Report {
    Tasks(Box<BenchReport>),
    Fleet(Box<ScaleReport>),
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Report::Tasks(r) => r.fmt(f),
            Report::Fleet(r) => r.fmt(f),
        }
    }
}

/// Runs fleet mode when `o.fleet` names sizes, else the task matrix.
pub async fn run(o: &BenchOptions, command: String) -> anyhow::Result<Report> {
    if o.fleet.is_some() {
        fleet_scale::run(o, command)
            .await
            .map(|r| Report::Fleet(Box::new(r)))
    } else {
        run_bench(o, command)
            .await
            .map(|r| Report::Tasks(Box::new(r)))
    }
}

/// Runs every measurement of `o` and judges the targets.
pub async fn run_bench(o: &BenchOptions, command: String) -> anyhow::Result<BenchReport> {
    progress("starting");
    let uri = o.uri.clone().unwrap_or_else(crate::harness::server_uri);
    let server = HostUri::parse(&uri).map_err(anyhow::Error::msg)?;
    let info = standalone::server_info(&uri, &server).await?;
    progress(&format!("server {} version {}", info.host, info.version));
    let proxy_cost = standalone::proxy_cost(&uri, &server, 200).await?;
    let ceiling = ceiling::measure(
        &uri,
        &o.ceiling_depths,
        &o.ceiling_concurrency,
        o.ceiling_drain_limit,
        o.ceiling_sample_claims,
        o.ceiling_sample_time,
    )
    .await
    .context("measuring the raw claim ceiling")?;
    let runner = standalone::runner(&uri, &server, o.runner_runs)
        .await
        .context("timing the task runner alone")?;
    progress(&format!(
        "runner alone: p50 {:.1} ms, {:.2} requests",
        runner.spawn_to_exit.p50_ms, runner.requests_per_run
    ));
    let mut fleets = Vec::new();
    for &dens in &o.dens {
        for &worker in &o.workers {
            fleets.push(measure_fleet(o, &uri, &server, dens, worker).await?);
        }
    }
    let verdicts = report::verdicts(&fleets, &ceiling);
    Ok(BenchReport {
        command,
        machine: procfs::machine(),
        server: info,
        loop_interval_ms: o.loop_ms,
        change_streams: o.change_streams,
        proxy_cost,
        ceiling,
        runner,
        fleets,
        verdicts,
    })
}

async fn measure_fleet(
    o: &BenchOptions,
    uri: &str,
    server: &HostUri,
    dens: usize,
    worker: &'static str,
) -> anyhow::Result<FleetReport> {
    let threads = o.threads_for(dens);
    let mut fleet = Fleet::start(uri, server, dens, threads, o.loop_ms, o.change_streams).await?;
    fleet.graph = o.graph;
    fleet.set_worker(worker).await?;
    if let Some(limits) = o.limits {
        fleet.set_limits(limits).await?;
    }
    progress(&format!("{dens} DEN, worker {worker}"));
    let result = async {
        let idle = fleet.idle(o.idle).await.context("idle baseline")?;
        progress(&format!(
            "{dens} DEN idle: {:.2} requests/s, CPU {:?}, server CPU {:?}",
            idle.requests_per_sec, idle.den_cpu_percent, idle.server_cpu_percent
        ));
        let latency = fleet
            .idle_latency(&idle, o.latency_tasks, o.latency_gap)
            .await
            .context("enqueue→start on an idle fleet")?;
        progress(&format!(
            "{dens} DEN enqueue→start p50 {:.1} ms p99 {:.1} ms",
            latency.p50_ms, latency.p99_ms
        ));
        let mut runs = Vec::new();
        for &depth in &o.depths {
            for repeat in 1..=o.repeat {
                let tasks = o.tasks.min(depth);
                let limit = (depth > tasks).then_some(o.run_secs);
                let r = fleet
                    .run(depth, tasks, repeat, &idle, limit)
                    .await
                    .with_context(|| format!("{dens} DEN, depth {depth}, run {repeat}"))?;
                progress(&format!(
                    "{dens} DEN {worker} depth {depth} run {repeat}: {} tasks, {:.1} tasks/s, {:.2} requests/task, CPU ms/task DEN {:.2} runner {:.2} server {:?}",
                    r.tasks, r.tasks_per_sec, r.round_trips.per_task, r.den_cpu_ms_per_task, r.runner_cpu_ms_per_task, r.server_cpu_ms_per_task
                ));
                runs.push(r);
            }
        }
        Ok::<_, anyhow::Error>(FleetReport {
            dens,
            worker,
            threads,
            idle,
            idle_enqueue_to_start: latency,
            runs,
        })
    }
    .await;
    fleet.finish().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn options_parse_and_bad_input_is_refused() {
        let o = parse_args(&args(
            "--dens 1,4 --tasks 50 --depth 100 --quick --json out.json",
        ))
        .expect("parses");
        assert_eq!(o.dens, [1, 4]);
        assert_eq!(o.tasks, 50);
        assert_eq!(o.depths, [100]);
        assert_eq!(o.ceiling_depths, [100]);
        assert_eq!(o.repeat, 1, "--quick applies wherever it is");
        assert_eq!(o.json.as_deref(), Some(std::path::Path::new("out.json")));
        assert_eq!(o.threads_for(4), 32);
        assert!(o.change_streams);
        assert_eq!(o.workers, ["process"]);
        let both = parse_args(&args("--quick --worker both")).expect("parses");
        assert_eq!(both.workers, ["process", "persistent"]);
        assert!(parse_args(&args("--worker pool"))
            .unwrap_err()
            .contains("--worker"));
        assert!(
            !parse_args(&args("--polling --quick"))
                .expect("parses")
                .change_streams
        );
        assert_eq!(parse_args(&[]).expect("defaults"), {
            let mut f = BenchOptions::full();
            f.ceiling_depths = f.depths.clone();
            f
        });
        let f = parse_args(&args("--fleet 1,10 --lease-secs 4 --idle-secs 3")).expect("fleet");
        assert_eq!(f.fleet.as_deref(), Some(&[1, 10][..]));
        assert_eq!(
            (f.lease_secs, f.idle, f.tasks),
            (4, Duration::from_secs(3), 2000)
        );
        assert_eq!((f.fleet_threads_for(1), f.fleet_threads_for(50)), (8, 100));
        assert_eq!(
            parse_args(&args("--fleet 2 --quick")).expect("quick").tasks,
            300
        );
        for bad in [
            "--fleet",
            "--fleet 0",
            "--dens",
            "--dens 0",
            "--dens 1,x",
            "--tasks -3",
            "--frobs 2",
            "--repeat 0",
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad} should be refused");
        }
    }
}
