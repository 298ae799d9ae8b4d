//! `balance`: the queue balancer's document, or (with --set) a new one.

use std::io::Write;

use anyhow::Context;
use reqwest::Method;
use serde_json::Value;

use super::{cell, shown, Ctx};

pub async fn balance(ctx: &Ctx, set: Option<&str>, out: &mut dyn Write) -> anyhow::Result<()> {
    if let Some(body) = set {
        let body: Value = serde_json::from_str(body)
            .with_context(|| format!("--set is not valid JSON: '{body}'"))?;
        let reply = ctx
            .client
            .call(Method::POST, &["balance"], Some(&body))
            .await?;
        if !ctx.raw(&reply, out)? {
            writeln!(out, "{}", shown(&cell(reply.value.get("status"))))?;
        }
        return Ok(());
    }
    let reply = ctx.client.call(Method::GET, &["balance"], None).await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let b = &reply.value;
    if let Some(notice) = b.get("notice") {
        writeln!(out, "{}", shown(&cell(Some(notice))))?;
    }
    let disabled = b.get("disabled").filter(|d| !d.is_null());
    writeln!(
        out,
        "balancer: {}",
        disabled.map_or_else(
            || "enabled".to_string(),
            |d| format!("disabled until {}", cell(Some(d)))
        )
    )?;
    if let Some(groups) = b.get("queues").and_then(Value::as_array) {
        for (i, group) in groups.iter().enumerate() {
            let names: Vec<String> = group
                .as_array()
                .map(|g| {
                    g.iter()
                        .map(|n| shown(&cell(Some(n))).into_owned())
                        .collect()
                })
                .unwrap_or_default();
            writeln!(out, "group {}: {}", i + 1, names.join(", "))?;
        }
    }
    if let Some(limits) = b.get("max_tasks").and_then(Value::as_object) {
        for (when, n) in limits {
            writeln!(out, "max_tasks {}: {}", shown(when), cell(Some(n)))?;
        }
    }
    Ok(())
}
