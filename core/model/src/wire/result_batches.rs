//! Results stored together: the DEN (for its runners) and a worker host (for its tasks) hand
//! each ended attempt here and wait for its answer, while one task stores whatever is waiting
//! as one batch, so batches grow with load without holding a result back for company.

use std::future::Future;

use tokio::sync::{mpsc, oneshot};

use crate::wire::relay::{Ack, Completion};

/// Most results stored by one batch; more wait for the next.
pub const MAX_BATCH: usize = 256;

type Pending = (Completion, oneshot::Sender<Ack>);

/// A handle on the batch writer; clones share it.
#[derive(Clone)]
pub struct ResultBatches {
    pending: mpsc::UnboundedSender<Pending>,
}

impl ResultBatches {
    /// Starts the writer (on the current tokio runtime). `store_batch` stores a batch and
    /// answers each of its results, in order; a result it leaves unanswered is answered
    /// `RecordYourself`, so its holder stores it alone.
    pub fn start<F, Fut>(mut store_batch: F) -> ResultBatches
    where
        F: FnMut(Vec<Completion>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<Ack>> + Send,
    {
        let (pending, mut queue) = mpsc::unbounded_channel::<Pending>();
        tokio::spawn(async move {
            let mut batch = Vec::new();
            while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
                let (completions, replies): (Vec<Completion>, Vec<_>) = batch.drain(..).unzip();
                let mut acks = store_batch(completions).await.into_iter();
                for reply in replies {
                    let _ = reply.send(acks.next().unwrap_or(Ack::RecordYourself));
                }
            }
        });
        ResultBatches { pending }
    }

    /// Stores one result with whatever else is waiting, and returns its answer;
    /// `RecordYourself` if the writer is gone.
    pub async fn store(&self, completion: Completion) -> Ack {
        let (reply, answer) = oneshot::channel();
        if self.pending.send((completion, reply)).is_err() {
            return Ack::RecordYourself;
        }
        answer.await.unwrap_or(Ack::RecordYourself)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use bson::oid::ObjectId;
    use bson::DateTime;

    use super::*;
    use crate::task::TaskEnd;
    use crate::task::{AttemptEnd, AttemptRecord, Outcome};

    fn completion(pid: u32) -> Completion {
        Completion {
            record: AttemptRecord {
                id: ObjectId::new(),
                task: ObjectId::new(),
                queue: None,
                node: "n1".into(),
                pid,
                start: DateTime::now(),
                end: AttemptEnd {
                    outcome: Outcome::Succeeded,
                    status: Some(1),
                    exit_code: Some(0),
                    signal: None,
                    result: None,
                    reason: None,
                    task_discarded: false,
                    output_file: None,
                },
            },
            end: TaskEnd::Status(1),
            stdout: String::new(),
            stderr: String::new(),
        }
    }

    #[tokio::test]
    async fn results_that_wait_together_go_as_one_batch_and_each_gets_its_own_answer() {
        let batches = Arc::new(Mutex::new(Vec::<Vec<u32>>::new()));
        let (release, released) = tokio::sync::watch::channel(false);
        let seen = batches.clone();
        let writer = ResultBatches::start(move |batch: Vec<Completion>| {
            let pids: Vec<u32> = batch.iter().map(|c| c.record.pid).collect();
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(pids.clone());
            let mut released = released.clone();
            async move {
                // The first batch is held until released, so the next results queue up.
                let _ = released.wait_for(|r| *r).await;
                // Answers in order; pid 4 is left unanswered.
                pids.iter()
                    .filter(|&&p| p != 4)
                    .map(|&p| {
                        if p % 2 == 0 {
                            Ack::NotOurs
                        } else {
                            Ack::Recorded
                        }
                    })
                    .collect()
            }
        });
        let first = tokio::spawn({
            let w = writer.clone();
            async move { w.store(completion(1)).await }
        });
        while batches.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = [2, 3, 4]
            .into_iter()
            .map(|pid| {
                let w = writer.clone();
                tokio::spawn(async move { w.store(completion(pid)).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let _ = release.send(true);
        assert_eq!(first.await.ok(), Some(Ack::Recorded));
        let mut answers = Vec::new();
        for r in rest {
            answers.push(r.await.ok());
        }
        assert_eq!(
            answers,
            [
                Some(Ack::NotOurs),
                Some(Ack::Recorded),
                Some(Ack::RecordYourself)
            ],
            "in order, and the one left unanswered stores its own"
        );
        let batches = batches.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(batches, [vec![1], vec![2, 3, 4]]);
    }
}
