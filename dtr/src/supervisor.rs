//! Watches a running plugin (a process, or a persistent worker running the task): keeps the
//! task's lease, enforces the queue's timeout, and stops the plugin when an operator cancels
//! the task or the lease is lost.

use std::future::Future;
use std::time::Duration;

use bson::oid::ObjectId;
use disbatch_model::run_policy::RunPolicy;
use disbatch_store::LeaseState;
use tokio::signal::unix::Signal;
use tokio::sync::mpsc;

use crate::connection::LazyStore;
use crate::outcome::Exit;

/// What a supervisor can wait for and stop: a plugin process, or a worker running one task.
pub trait Supervised {
    /// Resolves when the run ends on its own. Cancel-safe: it races a timer in `select!`.
    fn wait(&mut self) -> impl Future<Output = std::io::Result<Exit>>;
    /// Stops the run now: SIGTERM to its process group, SIGKILL after `grace`.
    fn stop(&mut self, grace: Duration) -> impl Future<Output = std::io::Result<Exit>>;
}

/// What makes the lease keeper renew at once: SIGUSR1 for a runner of one task, a message from
/// the node for a worker host running many.
pub enum Wake {
    Signal(Signal),
    Channel(mpsc::Receiver<()>),
}

impl Wake {
    async fn recv(&mut self) -> Option<()> {
        match self {
            Wake::Signal(s) => s.recv().await,
            Wake::Channel(c) => c.recv().await,
        }
    }
}

/// Why the plugin stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It exited on its own.
    Exited(Exit),
    /// It ran past the queue's `timeout` and was stopped.
    TimedOut(Exit, Duration),
    /// An operator cancelled the task and the plugin was stopped.
    Cancelled(Exit),
    /// The task no longer runs as this attempt; the plugin was stopped and nothing is recorded.
    LeaseLost(Exit),
}

impl Stopped {
    /// How the plugin's process (or its worker) exited, however it was stopped.
    pub fn exit(self) -> Exit {
        match self {
            Stopped::Exited(e)
            | Stopped::TimedOut(e, _)
            | Stopped::Cancelled(e)
            | Stopped::LeaseLost(e) => e,
        }
    }
}

/// What the lease keeper learned from the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseNews {
    Cancel,
    Lost,
}

/// Runs the plugin to its end while renewing the lease every `policy.renew_every()` and at
/// once on `wake` (SIGUSR1 from the node, which saw a cancel request).
pub async fn supervise(
    store: &LazyStore,
    task: ObjectId,
    attempt: ObjectId,
    policy: RunPolicy,
    plugin: &mut impl Supervised,
    wake: Option<Wake>,
) -> std::io::Result<Stopped> {
    let (news_tx, mut news) = mpsc::channel(1);
    // Renewal runs beside the plugin: a slow or unreachable server must delay neither the
    // plugin's exit nor its timeout.
    let keeper = tokio::spawn(keep_lease(
        store.clone(),
        task,
        attempt,
        policy.lease,
        wake,
        news_tx,
    ));
    let deadline = policy.timeout.map(|t| tokio::time::Instant::now() + t);
    let stopped = tokio::select! {
        exit = plugin.wait() => Stopped::Exited(exit?),
        _ = sleep_until(deadline) => {
            let after = policy.timeout.unwrap_or_default();
            tracing::warn!(task = %task, ?after, "plugin timed out; stopping it");
            Stopped::TimedOut(plugin.stop(policy.kill_grace).await?, after)
        }
        Some(what) = news.recv() => match what {
            LeaseNews::Cancel => {
                tracing::info!(task = %task, "cancel requested; stopping the plugin");
                Stopped::Cancelled(plugin.stop(policy.kill_grace).await?)
            }
            LeaseNews::Lost => {
                tracing::warn!(task = %task, attempt = %attempt, "lease lost: the task was recovered elsewhere; stopping the plugin");
                Stopped::LeaseLost(plugin.stop(policy.kill_grace).await?)
            }
        },
    };
    keeper.abort();
    Ok(stopped)
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn keep_lease(
    store: LazyStore,
    task: ObjectId,
    attempt: ObjectId,
    lease: Duration,
    mut wake: Option<Wake>,
    news: mpsc::Sender<LeaseNews>,
) {
    let every = lease / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            Some(()) = recv(&mut wake) => {}
        }
        let renewed = match store.get().await {
            Ok(db) => db.recovery().renew_lease(task, attempt, lease).await,
            Err(e) => Err(e),
        };
        match renewed {
            Ok(LeaseState::Held {
                cancel_requested: false,
            }) => {}
            Ok(LeaseState::Held {
                cancel_requested: true,
            }) => {
                let _ = news.send(LeaseNews::Cancel).await;
                return;
            }
            Ok(LeaseState::Lost) => {
                let _ = news.send(LeaseNews::Lost).await;
                return;
            }
            // The plugin keeps running through an outage; nodes give a runner a whole lease
            // of their own connectivity to renew before they recover its task.
            Err(e) => {
                tracing::warn!(task = %task, error = %e, "could not renew the lease; will retry")
            }
        }
    }
}

async fn recv(wake: &mut Option<Wake>) -> Option<()> {
    match wake {
        Some(w) => w.recv().await,
        None => std::future::pending().await,
    }
}
