//! `spec load`: Coordinate work-spec files (YAML or JSON, one or many) loaded into queues.

use std::io::Write;

use anyhow::{anyhow, bail, Context};
use reqwest::Method;
use serde_json::{json, Map, Value};

use super::{shown, Ctx};

/// Reads specs from a file's text: JSON, or YAML with one or more documents; each document
/// is a spec with a `name`, a list of such specs, or a `flows:` map of name → spec.
pub fn parse_specs(text: &str) -> anyhow::Result<Vec<Value>> {
    let documents: Vec<Value> = match serde_json::from_str::<Value>(text) {
        Ok(v) => vec![v],
        Err(_) => {
            let mut docs = Vec::new();
            for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
                let v = serde::Deserialize::deserialize(doc)
                    .with_context(|| format!("YAML document {}", i + 1))?;
                docs.push(v);
            }
            docs
        }
    };
    let mut specs = Vec::new();
    for (i, document) in documents.into_iter().enumerate() {
        match document {
            Value::Null => {}
            Value::Array(items) => specs.extend(items),
            Value::Object(map) if map.contains_key("flows") => {
                let Some(Value::Object(flows)) = map.get("flows") else {
                    bail!("document {}: `flows` must map names to specs", i + 1);
                };
                for (name, spec) in flows {
                    let mut spec: Map<String, Value> = match spec {
                        Value::Object(m) => m.clone(),
                        Value::Null => Map::new(),
                        _ => bail!("document {}: flow {name:?} must be a mapping", i + 1),
                    };
                    spec.insert("name".into(), Value::String(name.clone()));
                    specs.push(Value::Object(spec));
                }
            }
            v @ Value::Object(_) => specs.push(v),
            _ => bail!(
                "document {}: expected a spec, a list of specs or a `flows:` map",
                i + 1
            ),
        }
    }
    if specs.is_empty() {
        return Err(anyhow!("no work specs found"));
    }
    Ok(specs)
}

pub async fn load(
    ctx: &Ctx,
    out: &mut dyn Write,
    file: &str,
    plugin: Option<&str>,
    dry_run: bool,
) -> anyhow::Result<()> {
    let text = if file == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading stdin")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?
    };
    let specs = parse_specs(&text).with_context(|| format!("in {file}"))?;
    let mut body = json!({"specs": specs, "dry_run": dry_run});
    if let Some(p) = plugin {
        body["plugin"] = json!(p);
    }
    let reply = ctx
        .client
        .call(Method::POST, &["specs"], Some(&body))
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let names = |k: &str| -> Vec<String> {
        reply.value[k]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (created, updated) = (names("created"), names("updated"));
    writeln!(
        out,
        "{} {} work specs: {} created, {} updated.",
        if dry_run { "Would load" } else { "Loaded" },
        created.len() + updated.len(),
        created.len(),
        updated.len()
    )?;
    for n in created {
        writeln!(out, "created {}", shown(&n))?;
    }
    for n in updated {
        let changes = reply.value["changes"][&n]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if changes.is_empty() {
            writeln!(out, "updated {}: no field changes", shown(&n))?;
            continue;
        }
        writeln!(out, "updated {}:", shown(&n))?;
        for c in changes {
            writeln!(
                out,
                "  {}: {} → {}",
                shown(c["field"].as_str().unwrap_or("?")),
                brief(&c["old"]),
                brief(&c["new"])
            )?;
        }
    }
    Ok(())
}

/// A field's value on one line: JSON, cut at 80 characters (a spec's `config` is the whole
/// definition), unset fields as `(none)`.
fn brief(v: &Value) -> String {
    if v.is_null() {
        return "(none)".into();
    }
    let text = shown(&v.to_string()).to_string();
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_maps_lists_and_documents_all_become_named_specs() {
        let yaml = "flows:\n  a:\n    weight: 1000\n    then: b\n  b:\n    weight: 1\n---\nname: c\npriority: 2\n";
        let specs = parse_specs(yaml).expect("parse");
        let names: Vec<&str> = specs.iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(specs[0]["then"], json!("b"));
        let json_list = r#"[{"name": "x"}, {"name": "y", "max_running": 2}]"#;
        assert_eq!(parse_specs(json_list).expect("json").len(), 2);
    }

    #[test]
    fn bad_files_are_refused_with_where() {
        assert!(parse_specs("").is_err());
        assert!(parse_specs("flows: [1, 2]")
            .expect_err("flows")
            .to_string()
            .contains("flows"));
        assert!(parse_specs("flows:\n  a: 3\n").is_err());
        assert!(parse_specs("42").is_err());
        assert!(parse_specs("a: [unclosed").is_err());
    }
}
