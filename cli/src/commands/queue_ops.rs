//! Queue control and Coordinate units: pause, resume, units.

use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::{json, Value};

use super::{plural, shown, Ctx};
use crate::envelope::count;

/// Units per POST when reading a file: well under the server's body limit for small units.
const UNITS_PER_REQUEST: usize = 1000;

/// `pause QUEUE` / `resume QUEUE`.
pub async fn pause_or_resume(
    ctx: &Ctx,
    queue: &str,
    action: &str,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let reply = ctx
        .client
        .call(Method::POST, &["queues", queue, action], None)
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let done = if action == "pause" {
        "Paused"
    } else {
        "Resumed"
    };
    if count(&reply.value, "MongoDB::UpdateResult", "modified_count")? > 0 {
        writeln!(out, "{done} queue {}", shown(queue))?;
    } else {
        writeln!(out, "No change to queue {}", shown(queue))?;
    }
    Ok(())
}

/// `units QUEUE JSON` or `units QUEUE --file PATH`: adds Coordinate work units by key.
pub async fn add_units(
    ctx: &Ctx,
    queue: &str,
    data: Option<&str>,
    file: Option<&Path>,
    update: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let batches: Vec<Vec<Value>> = match (data, file) {
        (Some(data), _) => {
            let units: Value = serde_json::from_str(data)
                .with_context(|| format!("invalid JSON argument: '{data}'"))?;
            match units {
                Value::Array(units) => vec![units],
                _ => bail!(
                    "units must be a JSON array of {{\"key\": …, \"params\"?: {{…}}}} objects"
                ),
            }
        }
        (None, Some(path)) => read_unit_lines(path)?
            .chunks(UNITS_PER_REQUEST)
            .map(<[Value]>::to_vec)
            .collect(),
        (None, None) => bail!("units needs a JSON array or --file PATH"),
    };
    let on_conflict = if update { "update" } else { "reject" };
    let mut totals = [0u64; 4];
    for units in batches {
        let body = json!({"units": units, "on_conflict": on_conflict});
        let reply = ctx
            .client
            .call(Method::POST, &["queues", queue, "units"], Some(&body))
            .await?;
        if ctx.json {
            super::write_raw(out, &reply.raw)?;
            continue;
        }
        for (total, key) in totals
            .iter_mut()
            .zip(["inserted", "updated", "rejected", "busy"])
        {
            *total += reply
                .value
                .get(key)
                .and_then(Value::as_array)
                .map_or(0, |a| a.len() as u64);
        }
    }
    if !ctx.json {
        let [inserted, updated, rejected, busy] = totals;
        writeln!(
            out,
            "{} added, {updated} updated, {rejected} rejected (key taken), {busy} busy (claimed, running or blocked) in queue {}",
            plural(inserted, "unit", "units"),
            shown(queue)
        )?;
    }
    Ok(())
}

/// One unit object per line; `-` reads stdin. Blank lines are skipped.
fn read_unit_lines(path: &Path) -> anyhow::Result<Vec<Value>> {
    let reader: Box<dyn BufRead> = if path == Path::new("-") {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        Box::new(std::io::BufReader::new(file))
    };
    let mut units = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let unit: Value = serde_json::from_str(&line)
            .with_context(|| format!("{} line {}: not JSON", path.display(), n + 1))?;
        units.push(unit);
    }
    Ok(units)
}
