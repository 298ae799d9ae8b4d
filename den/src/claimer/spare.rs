//! Spare candidates: claimable tasks a claim read found beyond its batch, kept for the next
//! batches of the same queue, so a busy node reads a queue once per several batches rather
//! than once per freed slot. A server like SecantusDB charges a read for the whole claim
//! window whatever its limit, so reading a few more costs about nothing; claiming a spare
//! that changed since it was read fails its claim filter and costs one statement.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::Document;

/// Fewest candidates a read of a queue in `_id` order asks for.
pub const READ_AT_LEAST: usize = 32;
/// Spares older than this are read again: a task queued ahead of them since (a retry, a task
/// given back) waits at most this long, on top of the claim window's own age.
const MAX_AGE: Duration = Duration::from_secs(1);
/// Most bytes of spare task documents kept per queue, and for all queues: tasks with large
/// params are read again rather than held, and a node serving many queues holds at most this.
const MAX_BYTES_PER_QUEUE: usize = 1 << 20;
const MAX_BYTES: usize = 16 << 20;

/// Spare candidates by queue, in claim order, with when they were read.
#[derive(Debug, Default)]
pub struct Spares {
    by_queue: HashMap<ObjectId, Spare>,
}

#[derive(Debug)]
struct Spare {
    tasks: Vec<Document>,
    read_at: Instant,
    bytes: usize,
}

impl Spares {
    /// The queue's spares, with when they were read, if at least `n` are left and they are
    /// fresh; either way they are no longer kept.
    pub fn take(&mut self, queue: ObjectId, n: usize) -> Option<(Vec<Document>, Instant)> {
        let spare = self.by_queue.remove(&queue)?;
        (spare.tasks.len() >= n && spare.read_at.elapsed() < MAX_AGE)
            .then_some((spare.tasks, spare.read_at))
    }

    /// Keeps `tasks` (left over from a read made at `read_at`), up to the byte bound.
    pub fn keep(&mut self, queue: ObjectId, mut tasks: Vec<Document>, read_at: Instant) {
        self.by_queue.remove(&queue);
        self.by_queue.retain(|_, s| s.read_at.elapsed() < MAX_AGE);
        let others: usize = self.by_queue.values().map(|s| s.bytes).sum();
        let room = MAX_BYTES_PER_QUEUE.min(MAX_BYTES.saturating_sub(others));
        let mut bytes = 0;
        let fits = tasks
            .iter()
            .take_while(|t| {
                let size = approximate_size(t);
                let fits = bytes + size <= room;
                bytes += size;
                fits
            })
            .count();
        tasks.truncate(fits);
        let bytes = tasks.iter().map(approximate_size).sum();
        if !tasks.is_empty() && read_at.elapsed() < MAX_AGE {
            self.by_queue.insert(
                queue,
                Spare {
                    tasks,
                    read_at,
                    bytes,
                },
            );
        }
    }

    pub fn forget(&mut self, queue: ObjectId) {
        self.by_queue.remove(&queue);
    }

    pub fn clear(&mut self) {
        self.by_queue.clear();
    }
}

/// The document's encoded size; a document that will not encode counts as too large.
fn approximate_size(task: &Document) -> usize {
    bson::to_vec(task).map_or(usize::MAX / 2, |v| v.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn tasks(n: usize) -> Vec<Document> {
        (0..n).map(|i| doc! {"n": i as i64}).collect()
    }

    #[test]
    fn spares_are_taken_once_and_only_when_enough_are_left() {
        let q = ObjectId::new();
        let mut spares = Spares::default();
        spares.keep(q, tasks(3), Instant::now());
        assert_eq!(spares.take(q, 4), None, "too few: read again");
        assert_eq!(spares.take(q, 1), None, "taking too few forgot them");
        let read_at = Instant::now();
        spares.keep(q, tasks(3), read_at);
        assert_eq!(spares.take(q, 3), Some((tasks(3), read_at)));
        assert_eq!(spares.take(q, 1), None, "taken once");
    }

    #[test]
    fn old_reads_and_forgotten_queues_give_no_spares() {
        let q = ObjectId::new();
        let mut spares = Spares::default();
        let old = Instant::now().checked_sub(MAX_AGE * 2);
        if let Some(old) = old {
            spares.keep(q, tasks(5), old);
            assert_eq!(spares.take(q, 1), None);
        }
        spares.keep(q, tasks(5), Instant::now());
        spares.forget(q);
        assert_eq!(spares.take(q, 1), None);
        spares.keep(q, tasks(5), Instant::now());
        spares.clear();
        assert_eq!(spares.take(q, 1), None);
    }

    #[test]
    fn large_tasks_are_not_kept_past_the_byte_bound() {
        let q = ObjectId::new();
        let mut spares = Spares::default();
        let big = "x".repeat(400 * 1024);
        let docs: Vec<Document> = (0..5).map(|_| doc! {"params": &big}).collect();
        spares.keep(q, docs.clone(), Instant::now());
        assert_eq!(spares.take(q, 1).map(|(t, _)| t.len()), Some(2));
        // All queues together keep at most MAX_BYTES.
        let queues: Vec<ObjectId> = (0..2 * MAX_BYTES / MAX_BYTES_PER_QUEUE + 4)
            .map(|_| ObjectId::new())
            .collect();
        for q in &queues {
            spares.keep(*q, docs.clone(), Instant::now());
        }
        let kept: usize = spares.by_queue.values().map(|s| s.bytes).sum();
        assert!(kept <= MAX_BYTES, "{kept}");
        assert!(spares.by_queue.len() < queues.len());
    }
}
