//! `disbatch`: argument parsing and exit status for the disbatch-web command-line client.

use std::process::ExitCode;

use clap::Parser;
use disbatch_cli::args::Args;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match disbatch_cli::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if disbatch_cli::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
