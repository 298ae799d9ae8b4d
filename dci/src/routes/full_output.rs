//! `.full`: a task's GridFS output inlined in a search answer, bounded per output and per answer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bson::oid::ObjectId;

use crate::state::AppState;

/// At most this much of each output is inlined; the rest is left to `GET /tasks/:id/stdout`
/// (or `stderr`), which streams it whole. A marker at the end says it was cut.
pub const MAX_OUTPUT_BYTES: usize = 4 * 1024 * 1024;
/// At most this much output in all is inlined in one answer (a search returns up to 100
/// tasks through the legacy route, any number through `GET /tasks`); outputs past it are
/// replaced by a marker.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// What is left of one answer's budget for inlined outputs, shared by its tasks.
#[derive(Debug, Clone)]
pub struct Budget(Arc<AtomicUsize>);

impl Default for Budget {
    fn default() -> Self {
        Budget(Arc::new(AtomicUsize::new(MAX_ANSWER_BYTES)))
    }
}

impl Budget {
    /// Takes up to `want` bytes of what is left; returns how many were granted.
    fn take(&self, want: usize) -> usize {
        let mut granted = 0;
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                granted = left.min(want);
                Some(left - granted)
            });
        granted
    }

    fn give_back(&self, unused: usize) {
        self.0.fetch_add(unused, Ordering::SeqCst);
    }
}

/// The text `.full` shows for output file `file` (`field`: stdout or stderr) of `task`: its
/// first `MAX_OUTPUT_BYTES` within what is left of the answer's budget, with a marker when
/// cut. Only what is shown is read from the database.
pub async fn text(
    state: &AppState,
    task: Option<ObjectId>,
    field: &str,
    file: ObjectId,
    budget: &Budget,
) -> disbatch_store::Result<String> {
    let whole = match task {
        Some(t) => format!("GET /tasks/{t}/{field} has all of it"),
        None => format!("GET /tasks/:id/{field} has all of it"),
    };
    let granted = budget.take(MAX_OUTPUT_BYTES);
    if granted == 0 {
        return Ok(format!(
            "[output not included: this answer already holds {MAX_ANSWER_BYTES} bytes of output; {whole}]"
        ));
    }
    let (mut bytes, more) = match state
        .store
        .results()
        .read_output_prefix(file, granted)
        .await
    {
        Ok(read) => read,
        Err(e) => {
            budget.give_back(granted);
            return Err(e);
        }
    };
    budget.give_back(granted.saturating_sub(bytes.len()));
    if !more {
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    // Cut at a character, not inside one.
    if let Err(e) = std::str::from_utf8(&bytes) {
        if e.error_len().is_none() {
            bytes.truncate(e.valid_up_to());
        }
    }
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    text.push_str(&format!(
        "\n[output truncated: the first {} bytes are shown; {whole}]",
        bytes.len()
    ));
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_shared_and_unused_bytes_return() {
        let b = Budget::default();
        assert_eq!(b.take(MAX_ANSWER_BYTES - 10), MAX_ANSWER_BYTES - 10);
        let other = b.clone();
        assert_eq!(other.take(100), 10);
        assert_eq!(b.take(1), 0);
        other.give_back(4);
        assert_eq!(b.take(100), 4);
    }
}
