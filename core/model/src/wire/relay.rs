//! The runner↔node pipes: a runner reports its ended attempt to its node on stdout and the
//! node answers on the runner's `ANSWER_FD` once the result is stored, so results are written
//! in batches over the node's pooled connections and a runner need not connect at all.

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::fleet_time;
use crate::task::TaskEnd;
use crate::task::{
    AttemptEnd, AttemptRecord, LiveOutput, LiveStream, Outcome, StoredOutput, LIVE_TAIL,
};

/// The runner's descriptor for the node's answers (stdin closes after the handoff).
pub const ANSWER_FD: i32 = 3;

/// Largest frame either side accepts: a completion carries at most `MAX_RELAYED_OUTPUT` of
/// output, plus its attempt record.
pub const MAX_FRAME: usize = 24 * 1024 * 1024;

/// Output above this (both streams together) is recorded by the runner itself, which can
/// move it to GridFS should the task document be refused as too large.
pub const MAX_RELAYED_OUTPUT: u64 = 4 * 1024 * 1024;

/// An ended attempt, ready to store: its record and the task's result with inline output.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub record: AttemptRecord,
    pub end: TaskEnd,
    pub stdout: String,
    pub stderr: String,
}

/// The node's answer to a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// The attempt record and the task's result are stored.
    Recorded,
    /// The task no longer runs as this attempt (recovered, given back, changed by an
    /// operator): the result was not written and the attempt record says so.
    NotOurs,
    /// The node could not store it (database errors, a document too large): the runner
    /// records the result itself, as it would without a node.
    RecordYourself,
}

impl Completion {
    pub fn task(&self) -> ObjectId {
        self.record.task
    }

    pub fn encode(&self) -> Document {
        let r = &self.record;
        let opt = |v: Option<i32>| v.map_or(Bson::Null, Bson::Int32);
        let (status, retry, not_before, keep_key_slot) = match self.end {
            TaskEnd::Status(s) | TaskEnd::Discarded(s) => {
                (Bson::Int32(s), false, Bson::Null, false)
            }
            TaskEnd::Retry {
                not_before,
                keep_key_slot,
            } => (
                Bson::Null,
                true,
                not_before.map_or(Bson::Null, Bson::DateTime),
                keep_key_slot,
            ),
        };
        doc! {
            "attempt": r.id, "task": r.task, "queue": r.queue.map_or(Bson::Null, Bson::ObjectId),
            "node": &r.node, "pid": r.pid as i64, "start": r.start,
            "outcome": r.end.outcome, "attempt_status": opt(r.end.status),
            "exit_code": opt(r.end.exit_code), "signal": opt(r.end.signal),
            "result": r.end.result.clone().map_or(Bson::Null, Bson::Document),
            "status": status, "retry": retry, "not_before": not_before, "keep_key_slot": keep_key_slot,
            "task_discarded": r.end.task_discarded,
            "reason": r.end.reason.clone().map_or(Bson::Null, Bson::String),
            "output_file": r.end.output_file.map_or(Bson::Null, |o| Bson::ObjectId(o.file)),
            "output_bytes": r.end.output_file.map_or(0, |o| i64::try_from(o.bytes).unwrap_or(i64::MAX)),
            "stdout": &self.stdout, "stderr": &self.stderr,
        }
    }

    pub fn decode(d: &Document) -> Result<Completion, String> {
        let id = |k: &str| {
            d.get_object_id(k)
                .map_err(|_| format!("completion: no `{k}` id"))
        };
        let int = |k: &str| match d.get(k) {
            Some(Bson::Int32(n)) => Ok(Some(*n)),
            None | Some(Bson::Null) => Ok(None),
            _ => Err(format!("completion: `{k}` is not a 32-bit integer")),
        };
        let text = |k: &str| {
            d.get_str(k)
                .map(str::to_string)
                .map_err(|_| format!("completion: no `{k}` string"))
        };
        let outcome = d.get_str("outcome").unwrap_or_default();
        let outcome = Outcome::parse(outcome)
            .ok_or_else(|| format!("completion: unknown outcome {outcome:?}"))?;
        let end = if d.get_bool("retry").unwrap_or(false) {
            TaskEnd::Retry {
                not_before: d.get_datetime("not_before").ok().copied(),
                // Absent from an older runner's completions: the slot is let go.
                keep_key_slot: d.get_bool("keep_key_slot").unwrap_or(false),
            }
        } else {
            let status = int("status")?.ok_or("completion: no `status`")?;
            // Absent from an older runner's completions: a plain end.
            if d.get_bool("task_discarded").unwrap_or(false) {
                TaskEnd::Discarded(status)
            } else {
                TaskEnd::Status(status)
            }
        };
        let queue = match d.get("queue") {
            Some(Bson::ObjectId(q)) => Some(*q),
            None | Some(Bson::Null) => None,
            _ => return Err("completion: `queue` is not an id".into()),
        };
        let pid = match d.get("pid") {
            Some(Bson::Int64(p)) => u32::try_from(*p).map_err(|_| "completion: bad `pid`")?,
            _ => return Err("completion: no `pid`".into()),
        };
        Ok(Completion {
            record: AttemptRecord {
                id: id("attempt")?,
                task: id("task")?,
                queue,
                node: text("node")?,
                pid,
                start: d
                    .get_datetime("start")
                    .copied()
                    .unwrap_or_else(|_| fleet_time::now()),
                end: AttemptEnd {
                    outcome,
                    status: int("attempt_status")?,
                    exit_code: int("exit_code")?,
                    signal: int("signal")?,
                    result: d.get_document("result").ok().cloned(),
                    reason: d.get_str("reason").ok().map(str::to_string),
                    task_discarded: d.get_bool("task_discarded").unwrap_or(false),
                    // Absent from an older runner's completions: an output kept inline.
                    output_file: d
                        .get_object_id("output_file")
                        .ok()
                        .map(|file| StoredOutput {
                            file,
                            bytes: d
                                .get_i64("output_bytes")
                                .ok()
                                .and_then(|n| u64::try_from(n).ok())
                                .unwrap_or(0),
                        }),
                },
            },
            end,
            stdout: text("stdout")?,
            stderr: text("stderr")?,
        })
    }
}

/// A running task's output so far, runner → node on stdout when the handoff says `live`,
/// about once a second while the plugin runs: the node writes it to the task, fenced on the
/// attempt, in batches with other runners' copies. Nothing is answered; the runner goes on
/// and its completion follows on the same pipe.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveCopy {
    pub task: ObjectId,
    pub output: LiveOutput,
}

impl LiveCopy {
    /// The key that tells a live copy from a completion on the runner's stdout.
    const KEY: &'static str = "live";

    /// Whether a frame from a runner is a live copy (anything else is its completion).
    pub fn is_live_copy(d: &Document) -> bool {
        d.contains_key(Self::KEY)
    }

    pub fn encode(&self) -> Document {
        let stream = |s: &LiveStream| {
            doc! {
                "text": s.text.as_str(),
                "from": s.from.min(i64::MAX as u64) as i64,
                "bytes": s.bytes.min(i64::MAX as u64) as i64,
            }
        };
        doc! {
            Self::KEY: self.task, "attempt": self.output.attempt,
            "stdout": stream(&self.output.stdout), "stderr": stream(&self.output.stderr),
        }
    }

    /// Refuses anything a runner of ours would not send: the node writes what it decodes.
    pub fn decode(d: &Document) -> Result<LiveCopy, String> {
        let stream = |k: &str| -> Result<LiveStream, String> {
            let s = d
                .get_document(k)
                .map_err(|_| format!("live copy: no `{k}` document"))?;
            let count = |n: &str| {
                match s.get(n) {
                    Some(Bson::Int64(v)) => u64::try_from(*v).map_err(|_| ()),
                    _ => Err(()),
                }
                .map_err(|_| format!("live copy: `{k}.{n}` is not a count"))
            };
            let text = s
                .get_str("text")
                .map_err(|_| format!("live copy: no `{k}.text` string"))?;
            let (from, bytes) = (count("from")?, count("bytes")?);
            if text.len() as u64 > LIVE_TAIL || from > bytes {
                return Err(format!(
                    "live copy: `{k}` is not a tail of at most {LIVE_TAIL} bytes"
                ));
            }
            Ok(LiveStream {
                text: text.to_string(),
                from,
                bytes,
            })
        };
        Ok(LiveCopy {
            task: d
                .get_object_id(Self::KEY)
                .map_err(|_| "live copy: no task id".to_string())?,
            output: LiveOutput {
                attempt: d
                    .get_object_id("attempt")
                    .map_err(|_| "live copy: no `attempt` id".to_string())?,
                stdout: stream("stdout")?,
                stderr: stream("stderr")?,
            },
        })
    }
}

impl Ack {
    pub fn name(self) -> &'static str {
        match self {
            Ack::Recorded => "recorded",
            Ack::NotOurs => "not_ours",
            Ack::RecordYourself => "record_yourself",
        }
    }

    pub fn encode(self) -> Document {
        doc! {"ack": self.name()}
    }

    /// Anything unexpected means the runner records the result itself: it is fenced, so
    /// writing twice is harmless, while trusting a garbled answer could lose it.
    pub fn decode(d: &Document) -> Ack {
        match d.get_str("ack") {
            Ok("recorded") => Ack::Recorded,
            Ok("not_ours") => Ack::NotOurs,
            _ => Ack::RecordYourself,
        }
    }
}

/// Writes one BSON document (BSON is self-delimiting: it starts with its own length).
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, d: &Document) -> std::io::Result<()> {
    write_frames(w, std::slice::from_ref(d)).await
}

/// Writes several BSON documents with one write: a busy worker host and its node exchange
/// frames in bursts, and a write per frame is a wake-up of the reader per frame.
pub async fn write_frames<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: &[Document],
) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    for d in frames {
        d.to_writer(&mut bytes).map_err(std::io::Error::other)?;
    }
    w.write_all(&bytes).await?;
    w.flush().await
}

/// Reads one BSON document; `None` when the pipe closed before a frame began.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<Document>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let n = i32::from_le_bytes(len);
    let size = usize::try_from(n)
        .ok()
        .filter(|n| (5..=MAX_FRAME).contains(n))
        .ok_or_else(|| std::io::Error::other(format!("a frame of {n} bytes is out of range")))?;
    let mut bytes = vec![0u8; size];
    bytes[..4].copy_from_slice(&len);
    r.read_exact(&mut bytes[4..]).await?;
    crate::text::raw_doc::from_bytes(&bytes)
        .map(Some)
        .map_err(|e| std::io::Error::other(format!("a frame cannot be read: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::DateTime;

    fn completion(end: TaskEnd) -> Completion {
        Completion {
            record: AttemptRecord {
                id: ObjectId::new(),
                task: ObjectId::new(),
                queue: Some(ObjectId::new()),
                node: "n1".into(),
                pid: 4242,
                start: DateTime::from_millis(1_700_000_000_123),
                end: AttemptEnd {
                    outcome: Outcome::Retry,
                    status: None,
                    exit_code: Some(75),
                    signal: None,
                    result: Some(doc! {"retry": true}),
                    reason: Some("failed (exit code 75); retry in 2 s".into()),
                    task_discarded: matches!(end, TaskEnd::Discarded(_)),
                    output_file: None,
                },
            },
            end,
            stdout: "out ✓".into(),
            stderr: String::new(),
        }
    }

    fn live_copy() -> LiveCopy {
        LiveCopy {
            task: ObjectId::new(),
            output: LiveOutput {
                attempt: ObjectId::new(),
                stdout: LiveStream {
                    text: "line 2 ✓\n".into(),
                    from: 7,
                    bytes: 18,
                },
                stderr: LiveStream::default(),
            },
        }
    }

    #[tokio::test]
    async fn live_copies_then_the_completion_share_the_runners_stdout() {
        let copies = [live_copy(), live_copy()];
        let done = completion(TaskEnd::Status(1));
        let mut pipe = Vec::new();
        for c in &copies {
            write_frame(&mut pipe, &c.encode()).await.unwrap();
        }
        write_frame(&mut pipe, &done.encode()).await.unwrap();
        let mut r = pipe.as_slice();
        for c in &copies {
            let d = read_frame(&mut r).await.unwrap().unwrap();
            assert!(LiveCopy::is_live_copy(&d));
            assert_eq!(&LiveCopy::decode(&d).unwrap(), c);
        }
        let d = read_frame(&mut r).await.unwrap().unwrap();
        assert!(!LiveCopy::is_live_copy(&d), "a completion is not a copy");
        assert_eq!(Completion::decode(&d).unwrap(), done);
    }

    #[tokio::test]
    async fn completions_and_acks_round_trip_through_a_pipe() {
        let sent = [
            completion(TaskEnd::Status(1)),
            completion(TaskEnd::Retry {
                not_before: Some(DateTime::from_millis(5)),
                keep_key_slot: true,
            }),
            completion(TaskEnd::Retry {
                not_before: None,
                keep_key_slot: false,
            }),
            completion(TaskEnd::Discarded(3)),
        ];
        let mut pipe = Vec::new();
        for c in &sent {
            write_frame(&mut pipe, &c.encode()).await.unwrap();
        }
        write_frame(&mut pipe, &Ack::NotOurs.encode())
            .await
            .unwrap();
        let mut r = pipe.as_slice();
        for c in &sent {
            let d = read_frame(&mut r).await.unwrap().unwrap();
            assert_eq!(&Completion::decode(&d).unwrap(), c);
        }
        let ack = read_frame(&mut r).await.unwrap().unwrap();
        assert_eq!(Ack::decode(&ack), Ack::NotOurs);
        assert!(
            read_frame(&mut r).await.unwrap().is_none(),
            "clean end of pipe"
        );
    }

    #[tokio::test]
    async fn bad_frames_are_errors_not_panics() {
        for bytes in [
            &[0xff, 0xff, 0xff, 0x7f, 0][..], // 2 GiB claimed
            &[3, 0, 0, 0][..],                // shorter than any document
            &[16, 0, 0, 0, 1, 2][..],         // truncated
            &[5, 0, 0, 0, 7][..],             // not BSON
        ] {
            assert!(read_frame(&mut &bytes[..]).await.is_err(), "{bytes:?}");
        }
        let garbled = doc! {"attempt": 1, "task": "x"};
        assert!(Completion::decode(&garbled).is_err());
        let mut bad_outcome = completion(TaskEnd::Status(1)).encode();
        bad_outcome.insert("outcome", "exploded");
        assert!(Completion::decode(&bad_outcome)
            .unwrap_err()
            .contains("exploded"));
        assert_eq!(Ack::decode(&doc! {"ack": 3}), Ack::RecordYourself);
        let copy = live_copy();
        let mut oversized = copy.clone();
        oversized.output.stdout.text = "x".repeat(LIVE_TAIL as usize + 1);
        oversized.output.stdout.bytes = LIVE_TAIL + 1;
        assert!(LiveCopy::decode(&oversized.encode())
            .unwrap_err()
            .contains("tail"));
        let mut backwards = copy.encode();
        backwards.insert("stderr", doc! {"text": "", "from": 9_i64, "bytes": 2_i64});
        assert!(LiveCopy::decode(&backwards).is_err());
        let mut no_attempt = copy.encode();
        no_attempt.remove("attempt");
        assert!(LiveCopy::decode(&no_attempt).is_err());
    }
}
