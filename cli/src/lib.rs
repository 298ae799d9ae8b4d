//! disbatch-cli: the `disbatch` command-line client of the disbatch-web REST API.
//!
//! `args` defines the command line, `client` and `auth` talk HTTP, `commands` runs each
//! command, `table`, `timefmt` and `envelope` shape output, and `chunked` does bulk creation.

pub mod args;
pub mod auth;
pub mod chunked;
pub mod client;
pub mod commands;
pub mod envelope;
pub mod exit;
pub mod table;
pub mod timefmt;

use std::io::Write;

use clap::CommandFactory;

use crate::args::{Args, Command};
use crate::auth::Auth;
use crate::client::Client;
use crate::commands::Ctx;
use crate::exit::HttpError;

/// Runs the parsed command line, writing results to stdout.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if let Command::Completions { shell } = args.command {
        // clap_complete panics on a failed write (`| head`), so it writes to memory first.
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Args::command(), "disbatch", &mut script);
        out.write_all(&script)?;
        return Ok(());
    }
    let auth = Auth::from_options(args.username.as_deref(), args.token_file.as_deref())?;
    let ctx = Ctx {
        client: Client::new(
            &args.url,
            auth,
            args.namespace.as_deref(),
            args.cacert.as_deref(),
        )?,
        json: args.json,
    };
    let named = queue_named(&args.command).map(str::to_string);
    let result = commands::dispatch(&ctx, args.command, &mut out).await;
    // Disbatch's answer names no queue, and the Perl CLI prints it as it is: ours says which.
    let result = result.map_err(|e| match (&named, e.downcast_ref::<HttpError>()) {
        (Some(queue), Some(h)) if h.message == "queue not found" => {
            e.context(format!("queue not found: {queue:?}"))
        }
        _ => e,
    });
    if let Err(e) = &result {
        // Scripts using --json get the server's error object on stdout as well as the exit code.
        if let Some(HttpError {
            body: Some(body), ..
        }) = e.downcast_ref::<HttpError>()
        {
            if ctx.json {
                // A failed write here must not hide the server's error, which is reported next.
                let _ = writeln!(out, "{body}");
            }
        }
    }
    out.flush()?;
    result
}

/// True when the error is stdout closing early (`disbatch tasks | head`), which is no failure.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The queue a command names, for its errors.
fn queue_named(command: &Command) -> Option<&str> {
    match command {
        Command::CreateTask { queue, .. } | Command::CreateTasks { queue, .. } => Some(queue),
        Command::Tasks { search, .. } => search.queue.as_deref(),
        Command::Failures { queue, .. } | Command::Retry { queue, .. } => queue.as_deref(),
        _ => None,
    }
}
