//! Bulk task creation: JSON-lines input, split into chunks, one POST /tasks per chunk with progress.

use std::fmt;
use std::io::{IsTerminal, Read, Write};
use std::path::Path;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::Client;
use crate::envelope::inserted_ids;

/// One task's params and the input line it came from (1-based), for error messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub line: usize,
    pub params: Value,
}

/// A line that is not a JSON object.
#[derive(Debug, PartialEq, Eq)]
pub struct LineError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for LineError {}

/// Parses JSON lines, one params object per line; blank lines are skipped. The whole input is
/// checked before anything is sent, so a bad line never leaves a half-created batch.
pub fn parse_json_lines(text: &str) -> Result<Vec<Entry>, LineError> {
    let mut entries = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let params: Value = serde_json::from_str(line).map_err(|e| LineError {
            line: line_no,
            message: format!("invalid JSON: {e}"),
        })?;
        if !params.is_object() {
            return Err(LineError {
                line: line_no,
                message: "not a JSON object (each line must be one task's params object)".into(),
            });
        }
        entries.push(Entry {
            line: line_no,
            params,
        });
    }
    Ok(entries)
}

/// The POST /tasks bodies for `entries`, at most `chunk_size` tasks each, with each chunk.
pub fn chunk_bodies<'a>(
    queue: &'a str,
    entries: &'a [Entry],
    chunk_size: usize,
) -> impl Iterator<Item = (&'a [Entry], Value)> + 'a {
    entries.chunks(chunk_size.max(1)).map(move |chunk| {
        let params: Vec<Value> = chunk.iter().map(|e| e.params.clone()).collect();
        (chunk, json!({"queue": queue, "params": params}))
    })
}

/// Reads the whole input; `-` is stdin.
pub fn read_input(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading tasks from stdin")?;
        Ok(text)
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// A progress bar on stderr, hidden when stderr is not a terminal or output is for scripts.
pub fn progress_bar(total: u64, json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    // The template is a constant; should it ever be rejected, the default style still works.
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} tasks ({eta} left)") {
        bar.set_style(style);
    }
    // Draw 0/N now: the first chunk can take a while, and a blank line looks hung.
    bar.tick();
    bar
}

/// Sends every chunk in order and returns how many tasks were created. With `json_out`, each
/// reply is written there as one compact JSON line. A failing chunk stops the upload, and the
/// error says which input lines were created so the rest can be resent.
pub async fn upload(
    client: &Client,
    queue: &str,
    entries: &[Entry],
    chunk_size: usize,
    extra: &serde_json::Map<String, Value>,
    bar: &ProgressBar,
    mut json_out: Option<&mut (dyn Write + '_)>,
) -> anyhow::Result<Uploaded> {
    let mut created: u64 = 0;
    let mut duplicates = Vec::new();
    let mut last_done_line = 0;
    for (chunk, mut body) in chunk_bodies(queue, entries, chunk_size) {
        // The same task fields (--not-before, --delay-s, --priority) on every chunk.
        if let Value::Object(m) = &mut body {
            m.extend(extra.clone());
        }
        let first_line = chunk.first().map_or(0, |e| e.line);
        let outcome = async {
            let reply = client.call(Method::POST, &["tasks"], Some(&body)).await?;
            let ids = inserted_ids(&reply.value)?;
            Ok::<_, anyhow::Error>((reply, ids.len()))
        }
        .await;
        let (reply, n) = match outcome {
            Ok(done) => done,
            Err(e) => {
                bar.abandon();
                return Err(e.context(partial_message(created, last_done_line, first_line)));
            }
        };
        if let Some(out) = json_out.as_deref_mut() {
            let line = reply.value.to_string();
            writeln!(out, "{}", disbatch_model::text::printable::json_text(&line))?;
        }
        created += n as u64;
        for (index, matched) in crate::envelope::duplicates(&reply.value) {
            let line = chunk.get(index).map_or(0, |e| e.line);
            duplicates.push((line, matched));
        }
        last_done_line = chunk.last().map_or(last_done_line, |e| e.line);
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    Ok(Uploaded {
        created,
        duplicates,
    })
}

/// What an upload made: how many new tasks, and the lines that were duplicates of live tasks
/// (the queue's `unique`), each with the task it matched.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Uploaded {
    pub created: u64,
    pub duplicates: Vec<(usize, String)>,
}

fn partial_message(created: u64, last_done_line: usize, failed_from: usize) -> String {
    if created == 0 {
        format!("no tasks were created (failed at the chunk starting on line {failed_from})")
    } else {
        format!(
            "created {created} tasks from lines 1-{last_done_line}; the chunk starting on line \
             {failed_from} and everything after it was not created"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_skip_blanks_and_keep_line_numbers() {
        let entries = parse_json_lines("{\"a\":1}\n\n  \r\n{\"b\":\"x\"}\r\n").unwrap();
        assert_eq!(
            entries,
            vec![
                Entry {
                    line: 1,
                    params: json!({"a": 1})
                },
                Entry {
                    line: 4,
                    params: json!({"b": "x"})
                },
            ]
        );
        assert_eq!(parse_json_lines("").unwrap(), vec![]);
    }

    #[test]
    fn bad_lines_are_named() {
        let err = parse_json_lines("{\"a\":1}\n\n{\"a\":\n{}\n").unwrap_err();
        assert_eq!(err.line, 3);
        assert!(err.to_string().starts_with("line 3: invalid JSON"), "{err}");
        let err = parse_json_lines("{}\n[1,2]\n").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.message.contains("not a JSON object"));
        assert_eq!(parse_json_lines("\"x\"").unwrap_err().line, 1);
    }

    #[test]
    fn chunks_cover_every_entry_in_order() {
        let entries: Vec<Entry> = (1..=7)
            .map(|i| Entry {
                line: i,
                params: json!({"n": i}),
            })
            .collect();
        let bodies: Vec<_> = chunk_bodies("q", &entries, 3).collect();
        assert_eq!(bodies.len(), 3);
        let sizes: Vec<usize> = bodies.iter().map(|(c, _)| c.len()).collect();
        assert_eq!(sizes, vec![3, 3, 1]);
        assert_eq!(
            bodies[0].1,
            json!({"queue": "q", "params": [{"n": 1}, {"n": 2}, {"n": 3}]})
        );
        assert_eq!(bodies[2].1, json!({"queue": "q", "params": [{"n": 7}]}));
        assert_eq!(bodies[2].0[0].line, 7);
        assert_eq!(chunk_bodies("q", &entries, 5000).count(), 1);
        assert_eq!(chunk_bodies("q", &[], 10).count(), 0);
    }

    #[test]
    fn partial_failure_messages_say_where_to_resume() {
        assert_eq!(
            partial_message(0, 0, 1),
            "no tasks were created (failed at the chunk starting on line 1)"
        );
        assert!(partial_message(3, 4, 6).starts_with("created 3 tasks from lines 1-4;"));
    }
}
