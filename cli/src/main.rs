//! `disbatch`: argument parsing and exit status for the disbatch-web command-line client.

use std::process::ExitCode;

use clap::Parser;
use disbatch_cli::args::{Args, Command};
use disbatch_cli::commands::users;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        // The one command that talks to MongoDB rather than to the DCI.
        Command::CreateUsers {
            config,
            root_user,
            plugin_perms,
            additional_perms,
            create_root,
            drop_roles,
        } => {
            let opts = users::Options {
                config,
                root_user,
                plugin_perms,
                additional_perms,
                create_root,
                drop_roles,
            };
            users::run(&opts, users::read_root_password, &mut std::io::stdout()).await
        }
        _ => disbatch_cli::run(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if disbatch_cli::is_broken_pipe(&e) => ExitCode::SUCCESS,
        // Redacted (create-users reads a config with passwords) and escaped: the server's
        // message may quote a stored name.
        Err(e) => {
            disbatch_core::logging::print_error(&format!("{e:#}"));
            ExitCode::from(disbatch_cli::exit::status_for(&e))
        }
    }
}
