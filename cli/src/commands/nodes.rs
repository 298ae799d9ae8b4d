//! Node commands: nodes (heartbeat table) and set-maxthreads.

use std::io::Write;

use reqwest::Method;
use serde_json::{json, Value};

use super::{array, cell, shown, Ctx};
use crate::envelope::count;
use crate::table::{Align, Table};
use crate::timefmt::{format_ago, format_utc_ms, now_ms};

pub async fn list(ctx: &Ctx, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = ctx.client.call(Method::GET, &["nodes"], None).await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let now = now_ms();
    let mut table = Table::new(&[
        ("Node", Align::Left),
        ("Live", Align::Left),
        ("Running", Align::Right),
        ("MaxThreads", Align::Right),
        ("LastSeen", Align::Left),
    ]);
    for node in array(&reply, "nodes")? {
        let live = match node.get("live") {
            Some(Value::Bool(true)) => "yes".to_string(),
            Some(Value::Bool(false)) => "no".to_string(),
            other => cell(other),
        };
        table.row(vec![
            cell(node.get("node")),
            live,
            cell(node.get("running")),
            cell(node.get("maxthreads")),
            last_seen(node.get("timestamp"), now),
        ]);
    }
    write!(out, "{}", table.render())?;
    Ok(())
}

/// A heartbeat as UTC time and age. The API sends ms since the epoch; anything else (a
/// Perl-era date string, say) is shown as it came.
fn last_seen(timestamp: Option<&Value>, now: i64) -> String {
    let ms = timestamp.and_then(|t| {
        t.as_i64()
            .or_else(|| t.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
    });
    match ms {
        Some(ms) => format!("{} ({})", format_utc_ms(ms), format_ago(now, ms)),
        None => cell(timestamp),
    }
}

pub async fn set_maxthreads(
    ctx: &Ctx,
    node: &str,
    maxthreads: Option<u64>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let body = json!({"maxthreads": maxthreads});
    let reply = ctx
        .client
        .call(Method::POST, &["nodes", node], Some(&body))
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let limit = maxthreads.map_or_else(|| "null (no limit)".to_string(), |n| n.to_string());
    let node = shown(node);
    if count(&reply.value, "MongoDB::UpdateResult", "modified_count")? > 0 {
        writeln!(out, "Set maxthreads of node {node} to {limit}")?;
    } else {
        writeln!(
            out,
            "No change to node {node}: maxthreads is already {limit}"
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_cells() {
        let now = 1_469_805_231_996;
        assert_eq!(
            last_seen(Some(&json!(1_469_805_221_996_i64)), now),
            "2016-07-29 15:13:41 (10s ago)"
        );
        assert_eq!(
            last_seen(Some(&json!(1_469_805_221_996.0)), now),
            "2016-07-29 15:13:41 (10s ago)"
        );
        assert_eq!(
            last_seen(Some(&json!("2016-07-29T15:13:41")), now),
            "2016-07-29T15:13:41"
        );
        assert_eq!(last_seen(None, now), "");
    }
}
