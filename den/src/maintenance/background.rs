//! A chore's work in the background (the count and stats keepers, the pruner): at most one
//! run at a time, each started on a maintenance pass once its period since the last start has
//! passed, so a slow run never holds up a pass and never overlaps the next.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

#[derive(Default)]
pub struct Background {
    running: Option<JoinHandle<()>>,
    next: Option<Instant>,
}

impl Background {
    /// Starts `run()` when none is running and `every` has passed since the last start; the
    /// first call starts one at once. True when it started one.
    pub fn start_if_due<F>(&mut self, every: Duration, run: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.running.as_ref().is_some_and(|h| !h.is_finished()) {
            return false;
        }
        if self.next.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        self.next = Some(Instant::now() + every);
        self.running = Some(tokio::spawn(run()));
        true
    }

    /// For a node that stops leading or stops: a run in flight is dropped, and the next
    /// call to `start_if_due` starts one at once.
    pub fn stop(&mut self) {
        if let Some(h) = self.running.take() {
            h.abort();
        }
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_chore_runs_once_at_a_time_and_not_before_its_period() {
        let mut chore = Background::default();
        let (release, released) = tokio::sync::watch::channel(false);
        let slow = move || {
            let mut released = released.clone();
            async move {
                let _ = released.wait_for(|r| *r).await;
            }
        };
        assert!(
            chore.start_if_due(Duration::ZERO, slow.clone()),
            "first call"
        );
        assert!(
            !chore.start_if_due(Duration::ZERO, slow.clone()),
            "one at a time"
        );
        let _ = release.send(true);
        while chore.running.as_ref().is_some_and(|h| !h.is_finished()) {
            tokio::task::yield_now().await;
        }
        assert!(chore.start_if_due(Duration::from_secs(3600), slow.clone()));
        while chore.running.as_ref().is_some_and(|h| !h.is_finished()) {
            tokio::task::yield_now().await;
        }
        assert!(
            !chore.start_if_due(Duration::ZERO, slow.clone()),
            "an hour has not passed since the last start"
        );
        chore.stop();
        assert!(
            chore.start_if_due(Duration::ZERO, slow),
            "stopped: due at once"
        );
    }
}
