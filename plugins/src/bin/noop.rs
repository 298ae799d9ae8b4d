//! Disbatch no-op plugin: reads nothing and exits 0 at once, so a benchmark measures only
//! Disbatch's own cost per task (claim, runner, records), not a plugin's. Started with
//! `DISBATCH_WORKER_PROTOCOL` it is a persistent worker that succeeds every task at once
//! (plugins/PROTOCOL.md).

fn main() -> std::process::ExitCode {
    if disbatch_worker::requested() {
        return disbatch_worker::run(|_| disbatch_worker::Outcome::success());
    }
    std::process::ExitCode::SUCCESS
}
