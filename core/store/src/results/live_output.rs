//! A running task's output so far (`live_output`): its runner replaces it about once a
//! second while the plugin runs, fenced on the attempt, and the result's write unsets it.
//! It is a bounded copy for watching (the last `LIVE_TAIL` bytes of each stream); the
//! output itself is stored only at the end, exactly as Disbatch stores it.

use crate::ResultStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, Document};

use crate::error::{Error, Result};
use disbatch_model::fleet_time;
use disbatch_model::schema::{live, task, TASKS};
use disbatch_model::status;
use disbatch_model::task::{LiveOutput, LiveStream};

/// What became of a live copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveWrite {
    Written,
    /// The task no longer runs as this attempt: nothing was written.
    NotOurs,
    /// The server refused it (the task document would pass 16 MiB): nothing was written.
    TooLarge,
}

fn stream_doc(s: &LiveStream) -> Document {
    doc! {
        live::TEXT: s.text.as_str(),
        live::FROM: s.from.min(i64::MAX as u64) as i64,
        live::BYTES: s.bytes.min(i64::MAX as u64) as i64,
    }
}

impl ResultStore<'_> {
    /// Replaces the task's live copy while it still runs as `live.attempt`: a runner whose
    /// attempt was recovered, or whose result is recorded, never writes one again.
    pub async fn write_live_output(
        self,
        task_id: ObjectId,
        live: &LiveOutput,
    ) -> Result<LiveWrite> {
        let (filter, update) = live_write(task_id, live);
        match self.collection(TASKS).update_one(filter, update).await {
            Ok(r) if r.matched_count == 0 => Ok(LiveWrite::NotOurs),
            Ok(_) => Ok(LiveWrite::Written),
            Err(e) if crate::driver_error::is_document_too_large(&e) => Ok(LiveWrite::TooLarge),
            Err(e) => Err(Error::mongo(
                format!("writing the live output of task {task_id}"),
                e,
            )),
        }
    }

    /// Writes the live copies runners relayed to this node, each fenced as
    /// `write_live_output` fences it, in as few `update` commands as their size allows.
    /// Copies are for watching: one the server refuses (its task would pass 16 MiB) or whose
    /// attempt is over is simply not written. Returns how many were written.
    pub async fn write_live_outputs(self, copies: &[(ObjectId, LiveOutput)]) -> Result<u64> {
        let statements: Vec<(usize, Document)> = copies
            .iter()
            .enumerate()
            .map(|(i, (task_id, live))| {
                let (q, u) = live_write(*task_id, live);
                (i, doc! {"q": q, "u": u, "multi": false, "upsert": false})
            })
            .collect();
        let mut written = 0;
        for chunk in crate::results::completions::chunks_by_size(&statements) {
            let updates: Vec<Document> = chunk.iter().map(|(_, s)| s.clone()).collect();
            let reply = self
                .db
                .run_command(doc! {"update": TASKS, "updates": updates, "ordered": false})
                .await
                .map_err(|e| Error::mongo("writing live output copies", e))?;
            written += crate::count_value(reply.get("n"));
        }
        Ok(written)
    }
}

/// The fenced write of one live copy: only while the task still runs as its attempt.
fn live_write(task_id: ObjectId, live: &LiveOutput) -> (Document, Document) {
    let filter = doc! {
        task::ID: task_id,
        task::ATTEMPT: live.attempt,
        task::STATUS: status::RUNNING,
    };
    let copy = doc! {
        live::ATTEMPT: live.attempt,
        live::AT: fleet_time::now(),
        live::STDOUT: stream_doc(&live.stdout),
        live::STDERR: stream_doc(&live.stderr),
    };
    (filter, doc! {"$set": {task::LIVE_OUTPUT: copy}})
}

/// The live copy of `stream` ("stdout" or "stderr") in a task document, when the task runs
/// and the copy is its current attempt's; None otherwise (not running, not written yet, an
/// earlier attempt's, or not in our shape).
pub fn live_stream(task_doc: &Document, stream: &str) -> Option<LiveStream> {
    let running = matches!(task_doc.get(task::STATUS), Some(Bson::Int32(s)) if *s == status::RUNNING)
        || matches!(task_doc.get(task::STATUS), Some(Bson::Int64(s)) if *s == status::RUNNING as i64);
    if !running {
        return None;
    }
    let copy = task_doc.get_document(task::LIVE_OUTPUT).ok()?;
    let attempt = task_doc.get_object_id(task::ATTEMPT).ok()?;
    if copy.get_object_id(live::ATTEMPT).ok()? != attempt {
        return None;
    }
    let s = copy.get_document(stream).ok()?;
    let count = |name: &str| match s.get(name) {
        Some(Bson::Int64(n)) => u64::try_from(*n).ok(),
        Some(Bson::Int32(n)) => u64::try_from(*n).ok(),
        _ => None,
    };
    Some(LiveStream {
        text: s.get_str(live::TEXT).ok()?.to_string(),
        from: count(live::FROM)?,
        bytes: count(live::BYTES)?,
    })
}

/// `.terse` for the live copy too: its texts (up to 64 KiB each per running task) become
/// "[terse mode]", as `stdout`/`stderr` do, so a search of running tasks stays small.
pub fn terse_live_output(task_doc: &mut Document) {
    let Ok(copy) = task_doc.get_document_mut(task::LIVE_OUTPUT) else {
        return;
    };
    for stream in [live::STDOUT, live::STDERR] {
        if let Ok(s) = copy.get_document_mut(stream) {
            if matches!(s.get(live::TEXT), Some(Bson::String(t)) if !t.is_empty()) {
                s.insert(live::TEXT, "[terse mode]");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_running_attempts_copy_is_live() {
        let attempt = ObjectId::new();
        let copy = doc! {
            live::ATTEMPT: attempt,
            live::AT: fleet_time::now(),
            live::STDOUT: {live::TEXT: "b\n", live::FROM: 5_i64, live::BYTES: 7_i64},
            live::STDERR: {live::TEXT: "", live::FROM: 0_i64, live::BYTES: 0_i64},
        };
        let mut task_doc = doc! {
            task::STATUS: status::RUNNING,
            task::ATTEMPT: attempt,
            task::LIVE_OUTPUT: copy,
        };
        let want = LiveStream {
            text: "b\n".into(),
            from: 5,
            bytes: 7,
        };
        assert_eq!(live_stream(&task_doc, "stdout"), Some(want));
        assert_eq!(live_stream(&task_doc, "stderr").map(|s| s.bytes), Some(0));
        task_doc.insert(task::ATTEMPT, ObjectId::new());
        assert_eq!(live_stream(&task_doc, "stdout"), None, "another attempt's");
        task_doc.insert(task::ATTEMPT, attempt);
        task_doc.insert(task::STATUS, status::SUCCEEDED);
        assert_eq!(live_stream(&task_doc, "stdout"), None, "not running");
        terse_live_output(&mut task_doc);
        let copy = task_doc.get_document(task::LIVE_OUTPUT).expect("copy");
        let text = |s: &str| copy.get_document(s).expect(s).get_str(live::TEXT).ok();
        assert_eq!(text("stdout"), Some("[terse mode]"));
        assert_eq!(text("stderr"), Some(""), "empty stays empty");
    }
}
