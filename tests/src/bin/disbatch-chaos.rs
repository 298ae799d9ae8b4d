//! `disbatch-chaos`: the bounded chaos run (scripts/chaos), with its report on stdout.
//!
//! Usage: disbatch-chaos [--tasks N] [--nodes N] [--chaos-secs S] [--settle-secs S] [--seed N]

use std::process::ExitCode;
use std::time::Duration;

use disbatch_tests::faults::chaos::{run_chaos, ChaosOptions};

fn main() -> ExitCode {
    let mut opts = ChaosOptions {
        tasks: 500,
        nodes: 3,
        chaos_for: Duration::from_secs(90),
        settle_within: Duration::from_secs(180),
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().and_then(|v| v.parse::<u64>().ok());
        match (flag.as_str(), value) {
            ("--tasks", Some(v)) => opts.tasks = v as usize,
            ("--nodes", Some(v)) => opts.nodes = v.max(1) as usize,
            ("--chaos-secs", Some(v)) => opts.chaos_for = Duration::from_secs(v),
            ("--settle-secs", Some(v)) => opts.settle_within = Duration::from_secs(v),
            ("--seed", Some(v)) => opts.seed = v,
            _ => {
                eprintln!(
                    "disbatch-chaos: bad argument {flag:?} (each option takes a whole number)"
                );
                eprintln!("usage: disbatch-chaos [--tasks N] [--nodes N] [--chaos-secs S] [--settle-secs S] [--seed N]");
                return ExitCode::from(2);
            }
        }
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("disbatch-chaos: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{opts:?}");
    let report = runtime.block_on(run_chaos(&opts));
    println!("{report}");
    if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
