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
    let table = table(array(&reply, "nodes")?, now_ms());
    write!(out, "{}", table.render())?;
    Ok(())
}

/// The nodes table: one row per node document; `now` (ms since the epoch) dates the
/// heartbeats' ages.
fn table(nodes: &[Value], now: i64) -> Table {
    let mut table = Table::new(&[
        ("Node", Align::Left),
        ("Live", Align::Left),
        ("Running", Align::Right),
        ("MaxThreads", Align::Right),
        ("LastSeen", Align::Left),
        ("Clock", Align::Right),
    ]);
    for node in nodes {
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
            clock(node.get("clock_offset_ms")),
        ]);
    }
    table
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

/// A node's clock offset (its host clock minus the database server's, as its DEN last measured
/// it) in seconds with one decimal and a sign: `+90.0s`, `-0.0s`. Blank when the node does not
/// report one (a Perl Disbatch 4 node); anything else is shown as it came.
fn clock(offset_ms: Option<&Value>) -> String {
    let ms = offset_ms.and_then(|v| {
        v.as_i64()
            .map(|n| n as f64)
            .or_else(|| v.as_f64().filter(|f| f.is_finite()))
    });
    match ms {
        Some(ms) => format!("{:+.1}s", ms / 1000.0),
        None => cell(offset_ms),
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

    #[test]
    fn the_table_shows_each_clock_and_blank_for_a_perl_node() {
        let now = 1_469_805_231_996;
        let nodes = [
            json!({"node": "n1", "live": true, "running": 2, "maxthreads": 4,
                   "timestamp": 1_469_805_231_496_i64, "clock_offset_ms": 90_012}),
            json!({"node": "n2", "live": true, "running": 0, "maxthreads": null,
                   "timestamp": 1_469_805_229_996_i64, "clock_offset_ms": -40}),
            json!({"node": "perl", "live": false, "running": 0,
                   "timestamp": 1_469_805_111_996_i64}),
        ];
        assert_eq!(
            table(&nodes, now).render(),
            "\
Node  Live  Running  MaxThreads  LastSeen                         Clock
n1    yes         2           4  2016-07-29 15:13:51 (0s ago)    +90.0s
n2    yes         0              2016-07-29 15:13:49 (2s ago)     -0.0s
perl  no          0              2016-07-29 15:11:51 (120s ago)
"
        );
    }

    #[test]
    fn clock_cells() {
        assert_eq!(clock(Some(&json!(90_000))), "+90.0s");
        assert_eq!(clock(Some(&json!(-90_000))), "-90.0s");
        assert_eq!(clock(Some(&json!(0))), "+0.0s");
        assert_eq!(clock(Some(&json!(-30))), "-0.0s");
        assert_eq!(clock(Some(&json!(1_260))), "+1.3s");
        assert_eq!(clock(Some(&json!(-2_460))), "-2.5s");
        assert_eq!(clock(Some(&json!(612.0))), "+0.6s");
        // A Perl node writes none: blank, like a null.
        assert_eq!(clock(None), "");
        assert_eq!(clock(Some(&Value::Null)), "");
        assert_eq!(clock(Some(&json!("soon"))), "soon");
    }
}
