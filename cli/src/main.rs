//! `disbatch`: argument parsing and exit status for the disbatch-web command-line client.

use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue};
use clap::{CommandFactory, Parser};
use disbatch_cli::args::{Args, Command};
use disbatch_cli::commands::users;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::try_parse().unwrap_or_else(|e| with_plain_usage(e).exit());
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
            disbatch_config::process::logging::print_error(&format!("{e:#}"));
            ExitCode::from(disbatch_cli::exit::status_for(&e))
        }
    }
}

/// Clap's usage line for a mistyped argument names the argument it suggests, which reads as
/// if that argument were required (`Usage: disbatch --url <URL> <COMMAND>`): the error shows
/// the (sub)command's plain usage instead, and keeps the suggestion as its tip.
fn with_plain_usage(mut e: clap::Error) -> clap::Error {
    if e.get(ContextKind::SuggestedArg).is_none() {
        return e;
    }
    let Some(ContextValue::StyledStr(usage)) = e.get(ContextKind::Usage) else {
        return e;
    };
    let shown = usage.to_string();
    let mut command = Args::command();
    command.build();
    // "Usage: disbatch tasks --bound <N> [FILTER]": the words after the program's name that
    // name subcommands.
    let words = shown.split_whitespace().skip(2);
    for word in words {
        match command.find_subcommand(word) {
            Some(sub) => command = sub.clone(),
            None => break,
        }
    }
    e.insert(
        ContextKind::Usage,
        ContextValue::StyledStr(command.render_usage()),
    );
    e
}
