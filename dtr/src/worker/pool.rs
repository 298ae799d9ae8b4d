//! A host's idle workers, by queue and executable: lent to one task at a time, given back
//! when its result is written, and stopped when idle too long, used up (`worker_max_tasks`),
//! too big (`worker_max_rss_mb`), dead, or the host drains.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use disbatch_model::worker_policy::WorkerPolicy;

use super::process::Worker;

/// Which workers may run a task: the queue's, started from the queue's executable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub queue: ObjectId,
    pub executable: PathBuf,
}

struct Idle {
    key: Key,
    worker: Worker,
    since: Instant,
    policy: WorkerPolicy,
    grace: Duration,
}

#[derive(Default)]
struct Inner {
    idle: Vec<Idle>,
    draining: bool,
    /// Workers started and stopped, for the host's log at exit.
    started: u64,
    retired: u64,
}

/// The idle workers; clones share them.
#[derive(Clone, Default)]
pub struct Pool(Arc<Mutex<Inner>>);

/// A worker lent to one task; given back to the pool (or retired) when dropped.
pub struct Lent {
    pool: Pool,
    key: Key,
    worker: Option<Worker>,
    policy: WorkerPolicy,
    grace: Duration,
}

impl Pool {
    /// An idle worker of `key` that is still alive, if there is one. Idle workers of the same
    /// queue started from another executable (its `plugin` changed) are retired on the way.
    pub fn take_idle(&self, key: &Key, policy: WorkerPolicy, grace: Duration) -> Option<Lent> {
        let mut stale = Vec::new();
        let found = {
            let mut inner = self.0.lock().ok()?;
            let mut found = None;
            let mut i = inner.idle.len();
            while i > 0 {
                i -= 1;
                let idle = &mut inner.idle[i];
                let other_plugin = idle.key.queue == key.queue && idle.key != *key;
                if other_plugin || idle.worker.exited() {
                    stale.push(inner.idle.swap_remove(i));
                } else if found.is_none() && idle.key == *key {
                    found = Some(inner.idle.swap_remove(i));
                }
            }
            inner.retired += stale.len() as u64;
            found
        };
        for idle in stale {
            tokio::spawn(idle.worker.retire(idle.grace));
        }
        found.map(|idle| Lent {
            pool: self.clone(),
            key: key.clone(),
            worker: Some(idle.worker),
            policy,
            grace,
        })
    }

    /// Lends a worker just started for `key`.
    pub fn lend_new(
        &self,
        key: &Key,
        worker: Worker,
        policy: WorkerPolicy,
        grace: Duration,
    ) -> Lent {
        if let Ok(mut inner) = self.0.lock() {
            inner.started += 1;
        }
        Lent {
            pool: self.clone(),
            key: key.clone(),
            worker: Some(worker),
            policy,
            grace,
        }
    }

    /// Stops the workers idle for longer than their queue's `worker_idle_s`, and forgets dead
    /// ones. Called about every second.
    pub fn stop_idle(&self) {
        let expired = {
            let Ok(mut inner) = self.0.lock() else { return };
            let (mut keep, mut expired) = (Vec::new(), Vec::new());
            for mut idle in inner.idle.drain(..) {
                if idle.since.elapsed() >= idle.policy.idle || idle.worker.exited() {
                    expired.push(idle);
                } else {
                    keep.push(idle);
                }
            }
            inner.idle = keep;
            inner.retired += expired.len() as u64;
            expired
        };
        for idle in expired {
            tracing::debug!(pid = idle.worker.pid, "stopping an idle worker");
            tokio::spawn(idle.worker.retire(idle.grace));
        }
    }

    /// Takes no worker back from now on and stops every idle one; resolves once they exited.
    pub async fn drain(&self) {
        let idle = match self.0.lock() {
            Ok(mut inner) => {
                inner.draining = true;
                inner.retired += inner.idle.len() as u64;
                std::mem::take(&mut inner.idle)
            }
            Err(_) => Vec::new(),
        };
        let stops: Vec<_> = idle
            .into_iter()
            .map(|i| tokio::spawn(i.worker.retire(i.grace)))
            .collect();
        for stop in stops {
            let _ = stop.await;
        }
    }

    /// (started, retired) so far.
    pub fn counts(&self) -> (u64, u64) {
        self.0.lock().map_or((0, 0), |i| (i.started, i.retired))
    }

    fn give_back(&self, key: Key, mut worker: Worker, policy: WorkerPolicy, grace: Duration) {
        let why = if worker.exited() {
            Some("it exited")
        } else if policy.max_tasks.is_some_and(|m| worker.tasks_done >= m) {
            Some("worker_max_tasks reached")
        } else if policy
            .max_rss_mb
            .is_some_and(|m| worker.rss_mb().is_some_and(|rss| rss > m))
        {
            Some("worker_max_rss_mb passed")
        } else {
            None
        };
        let Ok(mut inner) = self.0.lock() else { return };
        let why = why.or(inner.draining.then_some("the host drains"));
        match why {
            Some(why) => {
                inner.retired += 1;
                drop(inner);
                tracing::debug!(
                    pid = worker.pid,
                    tasks = worker.tasks_done,
                    "retiring a worker: {why}"
                );
                tokio::spawn(worker.retire(grace));
            }
            None => inner.idle.push(Idle {
                key,
                worker,
                since: Instant::now(),
                policy,
                grace,
            }),
        }
    }
}

impl Lent {
    pub fn worker(&mut self) -> Option<&mut Worker> {
        self.worker.as_mut()
    }

    /// Keeps the output directory on disk for an operator; the worker is retired.
    pub fn keep_output(mut self) -> PathBuf {
        match self.worker.as_mut() {
            Some(w) => w.keep_dir(),
            None => PathBuf::new(),
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            self.pool
                .give_back(self.key.clone(), worker, self.policy, self.grace);
        }
    }
}
