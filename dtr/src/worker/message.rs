//! A worker's messages as its host reads them: lines capped near the result limit, parsed
//! into the few members the protocol reads, every other member skipped without being built;
//! and how a task given to a worker ended, as far as the protocol tells.

use std::ops::Range;

use disbatch_model::output::MAX_DOCUMENT_SIZE;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use crate::outcome::Exit;

/// How the task a worker was given ended, as far as the protocol tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskEnd {
    /// `done`: the exit it reports and its result as JSON bytes (None for `null`).
    Done { exit: i32, result: Option<Vec<u8>> },
    /// The channel closed or the worker exited before `done`.
    Died(Exit),
    /// The worker said something the protocol does not allow; it was killed.
    ProtocolError(String, Exit),
}

/// The longest line a worker may send, newline included (PROTOCOL.md, section 2): its
/// largest message is a `done` whose result holds at most `MAX_DOCUMENT_SIZE`, with room
/// for the other members. A worker's line is held whole before it is parsed, so this bounds
/// what one worker costs its host.
pub const MAX_WORKER_LINE: usize = MAX_DOCUMENT_SIZE as usize + 64 * 1024;

/// Lines longer than this are parsed off the host's thread, which serves every worker.
const PARSED_IN_PLACE: usize = 64 * 1024;

/// The longest member quoted back in a protocol error.
const QUOTED: usize = 200;

/// A worker's message: the members the protocol reads, as JSON text (a member that is absent
/// or `null` is None), and the `done`'s result in place in the line it came in.
#[derive(Debug)]
pub struct Message {
    line: Vec<u8>,
    /// The `type`, when it is a string.
    pub kind: Option<String>,
    protocol: Option<String>,
    attempt: Option<String>,
    exit: Option<String>,
    result: Option<Range<usize>>,
}

/// The wire form: members borrowed from the line; the derive skips unknown members with
/// `IgnoredAny`, which builds nothing.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    protocol: Option<&'a RawValue>,
    #[serde(borrow, default)]
    attempt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    exit: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
}

/// Reads one line of at most `cap` bytes, newline included, holding no more than that: a
/// longer line is an error as soon as it passes the cap. None at end of input.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    cap: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            if line.is_empty() {
                return Ok(None);
            }
            return Err(std::io::Error::other("a line cut short by end of input"));
        }
        let (take, complete) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        if line.len() + take > cap {
            return Err(std::io::Error::other(format!(
                "a line longer than {cap} bytes (a worker's message is capped near the {} MiB result limit)",
                MAX_DOCUMENT_SIZE / (1024 * 1024)
            )));
        }
        if line.capacity() - line.len() < take {
            // Doubling, but never past the cap: a line at the cap costs the cap, not twice it.
            let want = (line.len() + take).max(line.capacity() * 2).min(cap);
            line.reserve_exact(want - line.len());
        }
        line.extend_from_slice(&available[..take]);
        reader.consume(take);
        if complete {
            return Ok(Some(line));
        }
    }
}

/// Parses a worker's line, off the host's thread when it is long.
pub async fn parse_line(line: Vec<u8>) -> std::io::Result<Message> {
    if line.len() <= PARSED_IN_PLACE {
        return parse(line);
    }
    tokio::task::spawn_blocking(move || parse(line))
        .await
        .map_err(std::io::Error::other)?
}

/// Parses one line into a message. Err: not JSON, or not an object.
pub fn parse(line: Vec<u8>) -> std::io::Result<Message> {
    // The derive would also take an array, member by member.
    if line.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(&line) {
                Ok(_) => std::io::Error::other("a message that is not a JSON object"),
                Err(e) => std::io::Error::other(format!("a line that is not JSON: {e}")),
            },
        );
    }
    let wire: Wire = serde_json::from_slice(&line).map_err(|e| {
        let why = if e.is_syntax() || e.is_eof() {
            "a line that is not JSON"
        } else {
            "an unreadable message"
        };
        std::io::Error::other(format!("{why}: {e}"))
    })?;
    // Only ever compared with short values or quoted: a long member is kept cut.
    let kept = |raw: Option<&RawValue>| raw.map(|r| quote(r.get()));
    let base = line.as_ptr() as usize;
    // A borrowed member is a slice of the line: its place is its offset in it.
    let result = match wire.result {
        None => None,
        Some(r) => {
            let start = (r.get().as_ptr() as usize)
                .checked_sub(base)
                .filter(|s| s + r.get().len() <= line.len())
                .ok_or_else(|| std::io::Error::other("a result outside its line"))?;
            Some(start..start + r.get().len())
        }
    };
    let kind = kept(wire.kind).and_then(|k| serde_json::from_str::<String>(&k).ok());
    let (protocol, attempt, exit) = (kept(wire.protocol), kept(wire.attempt), kept(wire.exit));
    Ok(Message {
        line,
        kind,
        protocol,
        attempt,
        exit,
        result,
    })
}

impl Message {
    /// Whether it is the `ready` of protocol `version`; Err: what it says instead.
    pub fn ready(&self, version: u64) -> Result<(), String> {
        if self.kind.as_deref() != Some("ready") {
            return Err(format!(
                "the worker's first message is not ready but {}",
                self.kind_in_words()
            ));
        }
        match self.protocol.as_deref().map(serde_json::from_str::<u64>) {
            Some(Ok(v)) if v == version => Ok(()),
            _ => Err(format!(
                "the worker speaks protocol {}, this host speaks {version}",
                self.protocol.as_deref().unwrap_or("(none)")
            )),
        }
    }

    fn kind_in_words(&self) -> String {
        match &self.kind {
            Some(k) => format!("a {k:?} message"),
            None => "a message without a string type".to_string(),
        }
    }

    /// Checks that it is the `done` of attempt `attempt`, and takes its result.
    pub fn into_done(mut self, attempt: &str) -> Result<TaskEnd, String> {
        match self.kind.as_deref() {
            Some("done") => {}
            Some(_) => return Err(format!("{} while a task ran", self.kind_in_words())),
            None => return Err("a message without a string type".to_string()),
        }
        match self.attempt.as_deref() {
            Some(a) if serde_json::from_str::<String>(a).is_ok_and(|a| a == attempt) => {}
            Some(other) => return Err(format!("done for attempt {other}, not {attempt:?}")),
            None => {
                return Err(format!(
                    "done without an attempt (the task's is {attempt:?})"
                ))
            }
        }
        let exit = self
            .exit
            .as_deref()
            .and_then(|e| serde_json::from_str::<i64>(e).ok())
            .and_then(|e| i32::try_from(e).ok())
            .ok_or_else(|| {
                format!(
                    "done with an exit that is not a 32-bit integer: {}",
                    self.exit.as_deref().unwrap_or("(none)")
                )
            })?;
        let result = match self.result.take() {
            None => None,
            Some(range) => {
                if range.len() as u64 > MAX_DOCUMENT_SIZE {
                    return Err(format!(
                        "done's result is {} bytes, over the {MAX_DOCUMENT_SIZE} a record holds",
                        range.len()
                    ));
                }
                // In place: a result near the limit is not held twice.
                let mut bytes = std::mem::take(&mut self.line);
                bytes.truncate(range.end);
                bytes.drain(..range.start);
                Some(bytes)
            }
        };
        Ok(TaskEnd::Done { exit, result })
    }
}

/// A member's JSON text, cut when long (a cut text, ending in `…`, is never valid JSON).
fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTED) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(line: &str, attempt: &str) -> Result<TaskEnd, String> {
        parse(line.as_bytes().to_vec())
            .map_err(|e| e.to_string())?
            .into_done(attempt)
    }

    #[test]
    fn done_must_echo_the_attempt_and_carry_a_32_bit_exit() {
        let ok = done(
            r#"{"type":"done","attempt":"a","exit":3,"result":{"x":1}}"#,
            "a",
        );
        assert_eq!(
            ok,
            Ok(TaskEnd::Done {
                exit: 3,
                result: Some(b"{\"x\":1}".to_vec())
            })
        );
        let null = done(
            r#"{"type":"done","attempt":"a","exit":0,"result":null}"#,
            "a",
        );
        assert_eq!(
            null,
            Ok(TaskEnd::Done {
                exit: 0,
                result: None
            })
        );
        for (bad, needle) in [
            (r#"{"type":"done","attempt":"b","exit":0}"#, "attempt"),
            (r#"{"type":"done","attempt":"a"}"#, "exit"),
            (
                r#"{"type":"done","attempt":"a","exit":1099511627776}"#,
                "exit",
            ),
            (r#"{"type":"ready","protocol":1}"#, "\"ready\""),
            (r#"{"attempt":"a"}"#, "type"),
            (r#"{"type":7,"attempt":"a","exit":0}"#, "type"),
            (r#"[1,2]"#, "not a JSON object"),
            (r#"{"type":"done""#, "not JSON"),
        ] {
            let e = done(bad, "a").unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn unknown_members_are_skipped_and_the_result_is_cut_out_of_its_line() {
        let line = format!(
            r#"{{"junk":[{}0],"type":"done","attempt":"a","exit":0,"result": {{"output": [1, 2]}} ,"more":{{"x":"y"}}}}"#,
            "0,".repeat(10_000)
        );
        assert_eq!(
            done(&line, "a"),
            Ok(TaskEnd::Done {
                exit: 0,
                result: Some(br#"{"output": [1, 2]}"#.to_vec())
            })
        );
    }

    #[tokio::test]
    async fn a_line_over_the_cap_is_refused_without_being_held_whole() {
        let long = vec![b'x'; 10_000];
        let mut reader = tokio::io::BufReader::with_capacity(1024, &long[..]);
        let e = read_line(&mut reader, 4096).await.unwrap_err();
        assert!(e.to_string().contains("longer than 4096 bytes"), "{e}");
        let mut two = &b"{\"a\":1}\n{\"b\"\n"[..];
        let first = read_line(&mut two, 64).await.unwrap();
        assert_eq!(first.as_deref(), Some(&b"{\"a\":1}\n"[..]));
        let cut = read_line(&mut two, 64).await;
        assert_eq!(cut.ok().flatten(), Some(b"{\"b\"\n".to_vec()));
        assert!(read_line(&mut two, 64).await.unwrap().is_none());
        let mut unended = &b"{\"a\""[..];
        let e = read_line(&mut unended, 64).await.unwrap_err();
        assert!(e.to_string().contains("cut short"), "{e}");
    }
}
