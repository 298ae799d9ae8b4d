//! `limits QUEUE`: a queue's flow limits and their budget now, or setting them from options.

use std::io::Write;

use reqwest::Method;
use serde_json::{json, Map, Value};

use super::{cell, shown, Ctx};
use crate::args::LimitOptions;

/// The POST /queues/:queue body the options ask for; empty when they set nothing.
pub fn limits_body(o: &LimitOptions) -> anyhow::Result<Map<String, Value>> {
    let mut body = Map::new();
    if let Some(rate) = &o.rate {
        let value = if rate == "none" {
            Value::Null
        } else {
            let (starts, per_s) = parse_rate(rate).map_err(crate::exit::usage)?;
            let mut r = json!({"starts": starts, "per_s": seconds(per_s)});
            if let Some(p) = &o.partition {
                r["partition"] = json!(p);
            }
            if let Some(m) = o.max_partitions {
                r["max_partitions"] = json!(m);
            }
            r
        };
        body.insert("rate_limit".into(), value);
    }
    if let Some(key) = &o.concurrency_key {
        let value = if key == "none" {
            Value::Null
        } else {
            let mut c = json!({"key": key, "ordered": o.ordered});
            if let Some(m) = o.max {
                c["max"] = json!(m);
            }
            c
        };
        body.insert("concurrency".into(), value);
    }
    if let Some(key) = &o.unique_key {
        let value = if key == "none" {
            Value::Null
        } else {
            let mut u = json!({"key": key});
            if let Some(states) = &o.unique_states {
                u["states"] = json!(states);
            }
            if let Some(s) = o.unique_for {
                u["for_s"] = seconds(s);
            }
            u
        };
        body.insert("unique".into(), value);
    }
    if o.force && !body.is_empty() {
        body.insert("force".into(), Value::Bool(true));
    }
    Ok(body)
}

/// Seconds as JSON: whole ones as integers (`10`, not `10.0`), as a person would write them.
fn seconds(s: f64) -> Value {
    if s.fract() == 0.0 && s.abs() < 1e15 {
        json!(s as i64)
    } else {
        json!(s)
    }
}

/// `50/10s`, `5/500ms`, `100/1m`, `5/min`, `3/s`, `20/2` (seconds): starts and the period in
/// seconds.
pub fn parse_rate(text: &str) -> Result<(u64, f64), String> {
    let bad = || format!("--rate takes STARTS/PERIOD like 50/10s, 5/500ms or 100/1m, not {text:?}");
    let (starts, period) = text.split_once('/').ok_or_else(bad)?;
    let starts: u64 = starts.trim().parse().map_err(|_| bad())?;
    let period = period.trim();
    let (number, unit) = match period.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => period.split_at(i),
        None => (period, "s"),
    };
    let number: f64 = if number.is_empty() {
        1.0
    } else {
        number.parse().map_err(|_| bad())?
    };
    // As people write them: `5/min` as well as `5/1m`.
    let scale = match unit.to_ascii_lowercase().as_str() {
        "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => 0.001,
        "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3600.0,
        _ => return Err(bad()),
    };
    if !number.is_finite() || number <= 0.0 {
        return Err(bad());
    }
    Ok((starts, number * scale))
}

pub async fn limits(
    ctx: &Ctx,
    queue: &str,
    options: &LimitOptions,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let body = limits_body(options)?;
    if !body.is_empty() {
        let sent = Value::Object(body);
        let reply = ctx
            .client
            .call(Method::POST, &["queues", queue], Some(&sent))
            .await?;
        if ctx.raw(&reply, out)? {
            return Ok(());
        }
        let line = disbatch_model::text::printable::json_text(&sent.to_string()).into_owned();
        writeln!(out, "Set the limits of queue {}: {line}", shown(queue))?;
        return Ok(());
    }
    let reply = ctx
        .client
        .call(Method::GET, &["queues", queue], None)
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    // Each line's values are escaped where it is built (`line`): stored names and keys may
    // hold characters a terminal acts on.
    for line in view_lines(&reply.value) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// A line of the view: its label, then the text with hidden characters escaped.
fn line(label: &str, text: &str) -> String {
    format!(
        "{label:<13}{}",
        disbatch_model::text::printable::escape(text)
    )
}

/// The limits as set and the budget, one line each, for `limits QUEUE`.
pub fn view_lines(q: &Value) -> Vec<String> {
    let mut lines = vec![line("queue", &shown(&cell(q.get("name"))))];
    let flow = q.get("flow").unwrap_or(&Value::Null);
    match q.get("rate_limit") {
        Some(r) => {
            let mut text = format!(
                "{} starts per {} s",
                cell(r.get("starts")),
                cell(r.get("per_s"))
            );
            if let Some(p) = r.get("partition").filter(|p| !p.is_null()) {
                text += &format!(", per value of {}", cell(Some(p)));
                if let Some(m) = r.get("max_partitions") {
                    text += &format!(" (at most {} live)", cell(Some(m)));
                }
            }
            lines.push(line("rate_limit", &text));
            if let Some(b) = flow.get("rate_limit") {
                lines.push(line("  now", &rate_now(b)));
            }
        }
        None => lines.push(line("rate_limit", "none")),
    }
    match q.get("concurrency") {
        Some(c) => {
            let max = c.get("max").map_or_else(|| "1".into(), |m| cell(Some(m)));
            let ordered = if c.get("ordered") == Some(&Value::Bool(true)) {
                ", ordered"
            } else {
                ""
            };
            let text = format!(
                "at most {max} running per value of {}{ordered}",
                cell(c.get("key"))
            );
            lines.push(line("concurrency", &text));
            if let Some(b) = flow.get("concurrency") {
                let at_max: Vec<String> = b["at_max"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|k| format!("{} ({})", k["key"], cell(k.get("holding"))))
                            .collect()
                    })
                    .unwrap_or_default();
                let text = format!(
                    "{} slot(s) held by {} key(s); {} key(s) at max{}{}",
                    cell(b.get("holding")),
                    cell(b.get("keys")),
                    cell(b.get("keys_at_max")),
                    if at_max.is_empty() { "" } else { ": " },
                    at_max.join(", ")
                );
                lines.push(line("  now", &text));
            }
        }
        None => lines.push(line("concurrency", "none")),
    }
    match q.get("unique") {
        Some(u) => lines.push(line(
            "unique",
            &format!(
                "per value of {}, states {}, for_s {}",
                cell(u.get("key")),
                u.get("states")
                    .map_or_else(|| "queued,running".into(), |s| cell(Some(s))),
                u.get("for_s").map_or_else(|| "0".into(), |s| cell(Some(s)))
            ),
        )),
        None => lines.push(line("unique", "none")),
    }
    if let Some(h) = flow.get("held") {
        let n = |k: &str| cell(h.get(k));
        let text = format!(
            "rate_limit {}, partition_limit {}, concurrency {}, ordered {} (of {} claimable task(s) judged{})",
            n("rate_limit"),
            n("partition_limit"),
            n("concurrency"),
            n("ordered"),
            n("scanned"),
            if h["capped"] == Value::Bool(true) { ", the oldest only" } else { "" }
        );
        lines.push(line("held", &text));
    }
    if let Some(e) = flow.get("error") {
        lines.push(line("problem", &cell(Some(e))));
    }
    lines
}

fn rate_now(b: &Value) -> String {
    if b.get("used").is_some() {
        let next = b
            .get("next_free")
            .filter(|n| !n.is_null())
            .map_or_else(String::new, |n| {
                format!("; next start frees at {}", cell(Some(n)))
            });
        return format!(
            "{} used, {} left in the window{next}",
            cell(b.get("used")),
            cell(b.get("left"))
        );
    }
    let busiest: Vec<String> = b["busiest"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    format!(
                        "{} {} used/{} left",
                        p["partition"],
                        cell(p.get("used")),
                        cell(p.get("left"))
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "{} live partition(s), {} with no start left{}{}",
        cell(b.get("live_partitions")),
        cell(b.get("exhausted_partitions")),
        if busiest.is_empty() {
            ""
        } else {
            "; busiest: "
        },
        busiest.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_starts_and_a_period() {
        assert_eq!(parse_rate("50/10s"), Ok((50, 10.0)));
        assert_eq!(parse_rate("5/500ms"), Ok((5, 0.5)));
        assert_eq!(parse_rate("100/1m"), Ok((100, 60.0)));
        assert_eq!(parse_rate("3/s"), Ok((3, 1.0)));
        assert_eq!(parse_rate("20/2"), Ok((20, 2.0)));
        assert_eq!(parse_rate("5/min"), Ok((5, 60.0)));
        assert_eq!(parse_rate("5/2min"), Ok((5, 120.0)));
        assert_eq!(parse_rate("10/sec"), Ok((10, 1.0)));
        assert_eq!(parse_rate("1000/hour"), Ok((1000, 3600.0)));
        assert_eq!(parse_rate("7/Minute"), Ok((7, 60.0)));
        for bad in ["50", "x/1s", "5/1d", "5/-1s", "5/0s", "-1/1s"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn options_become_the_limit_fields() {
        let o = LimitOptions {
            rate: Some("50/10s".into()),
            partition: Some("params.customer".into()),
            concurrency_key: Some("params.account".into()),
            max: Some(2),
            ordered: true,
            unique_key: Some("none".into()),
            force: true,
            ..Default::default()
        };
        assert_eq!(
            Value::Object(limits_body(&o).expect("body")),
            json!({"rate_limit": {"starts": 50, "per_s": 10, "partition": "params.customer"},
                   "concurrency": {"key": "params.account", "max": 2, "ordered": true},
                   "unique": null, "force": true})
        );
        assert!(limits_body(&LimitOptions::default())
            .expect("body")
            .is_empty());
    }

    #[test]
    fn the_view_shows_limits_budget_and_held_counts() {
        let q = json!({"name": "q", "rate_limit": {"starts": 5, "per_s": 1},
            "concurrency": {"key": "params.a", "max": 1, "ordered": true},
            "flow": {"rate_limit": {"used": 5, "left": 0, "next_free": "2026-01-01T00:00:01"},
                     "concurrency": {"holding": 1, "keys": 1, "keys_at_max": 1, "at_max": [{"key": "a1", "holding": 1}]},
                     "held": {"rate_limit": 2, "partition_limit": 0, "concurrency": 1, "ordered": 3, "scanned": 6, "capped": false}}});
        let text = view_lines(&q).join("\n");
        for want in [
            "5 starts per 1 s",
            "5 used, 0 left in the window; next start frees at 2026-01-01T00:00:01",
            "at most 1 running per value of params.a, ordered",
            "key(s) at max: \"a1\" (1)",
            "unique       none",
            "rate_limit 2, partition_limit 0, concurrency 1, ordered 3 (of 6 claimable",
        ] {
            assert!(text.contains(want), "{want} not in {text}");
        }
    }
}
