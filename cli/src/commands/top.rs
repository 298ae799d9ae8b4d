//! `top`: queues and nodes redrawn every few seconds, a live view in the terminal.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use super::{nodes, queues, Ctx};
use crate::timefmt::{format_utc_ms, now_ms};

/// Redraws until interrupted, or `iterations` times (0: forever). On a terminal each frame
/// replaces the last; piped, frames follow each other, so a log of them reads in order.
pub async fn top(
    ctx: &Ctx,
    interval: Duration,
    iterations: u64,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if ctx.json {
        anyhow::bail!("top has no --json form: use `queues --json` and `nodes --json`");
    }
    let terminal = std::io::stdout().is_terminal();
    let mut drawn = 0u64;
    loop {
        // Drawn to memory first: a frame appears whole, and a failed request shows as a line
        // in the frame instead of ending the view.
        let mut frame = Vec::new();
        writeln!(
            frame,
            "disbatch top: {} UTC, every {}s (Ctrl-C quits)",
            format_utc_ms(now_ms()),
            interval.as_secs_f64()
        )?;
        writeln!(frame)?;
        if let Err(e) = queues::list(ctx, &mut frame).await {
            writeln!(frame, "queues: {e:#}")?;
        }
        writeln!(frame)?;
        if let Err(e) = nodes::list(ctx, &mut frame).await {
            writeln!(frame, "nodes: {e:#}")?;
        }
        if terminal {
            out.write_all(b"\x1b[H\x1b[2J")?;
        }
        out.write_all(&frame)?;
        out.flush()?;
        drawn += 1;
        if iterations != 0 && drawn >= iterations {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
