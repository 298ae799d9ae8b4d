//! `disbatch-bench`: the task-execution benchmark (see BENCHMARKS.md), report on stdout.
//!
//! Usage: disbatch-bench [--quick] [--uri URI] [--dens 1,2,4] [--tasks N] [--depth 1000,100000]
//! [--threads N] [--repeat N] [--run-secs S] [--idle-secs S] [--latency-tasks N] [--loop-ms MS]
//! [--json FILE]
//!        disbatch-bench --fleet 1,10,50,100 [...]: fleet mode (see BENCHMARKS.md, "Fleet")

use std::process::ExitCode;

use disbatch_tests::bench::{parse_args, run, BenchOptions, Report, USAGE};
use tokio::signal::unix::{signal, SignalKind};

/// Runs the bench until it ends or SIGINT/SIGTERM arrives. On a signal the bench is dropped,
/// which stops the DENs it started; without this, Ctrl-C would leave them running.
async fn run_until_signal(opts: &BenchOptions, command: String) -> Option<anyhow::Result<Report>> {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return Some(Err(anyhow::anyhow!("cannot install the signal handlers")));
    };
    tokio::select! {
        report = run(opts, command) => Some(report),
        _ = int.recv() => None,
        _ = term.recv() => None,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let opts = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("disbatch-bench: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("disbatch-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let command = std::iter::once("disbatch-bench".to_string())
        .chain(args.iter().map(|a| {
            if a.contains("://") {
                "URI".to_string() // a URI may carry a password
            } else {
                a.clone()
            }
        }))
        .collect::<Vec<_>>()
        .join(" ");
    let report = match runtime.block_on(run_until_signal(&opts, command)) {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            let text = format!("{e:#}");
            // Its --uri may carry a password, and driver errors may quote it.
            eprintln!(
                "disbatch-bench: {}",
                disbatch_model::text::redact::redact(&text)
            );
            return ExitCode::FAILURE;
        }
        None => {
            eprintln!("disbatch-bench: interrupted; the DENs it started were stopped");
            return ExitCode::from(130);
        }
    };
    println!("{report}");
    if let Some(path) = &opts.json {
        let written = serde_json::to_string_pretty(&report)
            .map_err(|e| e.to_string())
            .and_then(|text| std::fs::write(path, text).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!("disbatch-bench: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
