//! The reaper: recovers tasks whose lease passed, on any node, and keeps Disbatch's orphan
//! rule for lease-less claims (tasks claimed by Perl nodes), recovering them too once their
//! node has stopped heartbeating.

use std::collections::HashMap;
use std::time::Duration;

use bson::oid::ObjectId;
use disbatch_model::retry_policy::{FailureKind, RetryDecision};
use disbatch_model::run_policy::{OnLost, RunPolicy, MIN_LEASE};
use disbatch_model::status;
use disbatch_store::Result;
use disbatch_store::{ExpiredTask, Recovery, Store};

/// Disbatch's recommendation: a task still claimed after 5 minutes will not start.
pub const ORPHAN_AGE: Duration = Duration::from_secs(5 * 60);
/// Expired tasks handled per pass; the rest wait for the next pass.
const RECOVER_PER_PASS: i64 = 500;
/// Beyond a lease, how long a node waits after (re)connecting before it recovers tasks: a
/// runner's retries are at most 5 s apart, so it renews within this after an outage.
const RECONNECT_SLACK: Duration = Duration::from_secs(5);

/// What one pass of the reaper did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReapReport {
    pub orphaned: u64,
    pub requeued: u64,
    pub cancelled: u64,
    /// Failed with "too many retries": the lost attempt was the last one allowed.
    pub failed: u64,
    /// Discarded: the queue's retry policy covers lost attempts, and this was its last.
    pub discarded: u64,
    /// Expired, but left alone: this node has not been connected for a whole lease.
    pub deferred: u64,
    /// When a lease may next pass, from this pass's reading: no lease written after it ends
    /// sooner than the shortest lease after it, so none is missed by waiting.
    pub next_check_in: Duration,
}

/// A recovery's name in metrics and logs.
pub fn recovery_label(how: Recovery) -> &'static str {
    match how {
        Recovery::Requeue { .. } => "requeue",
        Recovery::Orphan => "orphan",
        Recovery::Cancel => "cancel",
        Recovery::Fail { .. } => "fail",
        Recovery::Discard { .. } => "discard",
    }
}

impl ReapReport {
    fn count(&mut self, how: Recovery) {
        match how {
            Recovery::Requeue { .. } => self.requeued += 1,
            Recovery::Orphan => self.orphaned += 1,
            Recovery::Cancel => self.cancelled += 1,
            Recovery::Fail { .. } => self.failed += 1,
            Recovery::Discard { .. } => self.discarded += 1,
        }
    }

    /// Recoveries by the name metrics give them.
    pub fn by_name(&self) -> [(&'static str, u64); 5] {
        [
            ("requeue", self.requeued),
            ("orphan", self.orphaned),
            ("cancel", self.cancelled),
            ("fail", self.failed),
            ("discard", self.discarded),
        ]
    }
}

/// The recovery policy of one queue, as the reaper needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LostPolicy {
    pub run: RunPolicy,
    pub max_retries: Option<u32>,
    /// Its per-key concurrency is `ordered`: a requeued task keeps its key slot.
    pub ordered_keys: bool,
}

/// Where a lost task goes: an operator's cancel wins; a claim that never started is queued
/// again; a started one follows its queue's retry policy when that names `lost` (requeued
/// until attempts run out, then discarded), else its `on_lost`, and a requeue that
/// `max_retries` no longer allows fails the task ("too many retries", as Coordinate does).
pub fn recovery_for(t: &ExpiredTask, policy: Option<&LostPolicy>) -> Recovery {
    let requeue = Recovery::Requeue {
        keep_key_slot: policy.is_some_and(|p| p.ordered_keys),
    };
    if t.cancel_requested {
        return Recovery::Cancel;
    }
    if t.status == status::CLAIMED {
        return requeue;
    }
    if let Some(retry) = policy.and_then(|p| p.run.retry) {
        match retry.decide(FailureKind::Lost, t.attempts, &t.id) {
            RetryDecision::Retry(_) => return requeue,
            RetryDecision::Discard => {
                return Recovery::Discard {
                    max_attempts: retry.max_attempts,
                }
            }
            RetryDecision::NotCovered => {}
        }
    }
    match policy {
        Some(p) if p.run.on_lost == OnLost::Requeue => match p.max_retries {
            Some(max) if t.attempts >= max as i64 => Recovery::Fail { max_retries: max },
            _ => requeue,
        },
        _ => Recovery::Orphan,
    }
}

/// How long a requeued lost task waits before it may be claimed again: its retry policy's
/// wait when that covers lost attempts, else none.
pub fn retry_wait(t: &ExpiredTask, policy: Option<&LostPolicy>) -> Duration {
    match policy.and_then(|p| p.run.retry) {
        Some(retry) if t.status != status::CLAIMED => {
            match retry.decide(FailureKind::Lost, t.attempts, &t.id) {
                RetryDecision::Retry(wait) => wait,
                _ => Duration::ZERO,
            }
        }
        _ => Duration::ZERO,
    }
}

/// Queue policies read once per pass.
#[derive(Default)]
struct Policies(HashMap<ObjectId, Option<LostPolicy>>);

impl Policies {
    async fn of(&mut self, store: &Store, queue: Option<ObjectId>) -> Result<Option<LostPolicy>> {
        let Some(q) = queue else {
            return Ok(None);
        };
        if let Some(p) = self.0.get(&q) {
            return Ok(*p);
        }
        let queue = match store.queues().queue_by_id(q).await {
            Ok(queue) => queue,
            // Reported where it was read; its tasks are recovered by the defaults.
            Err(disbatch_store::Error::BadDocument { .. }) => None,
            Err(e) => return Err(e),
        };
        let p = queue.map(|q| LostPolicy {
            run: q.run,
            max_retries: q.spec.max_retries,
            ordered_keys: q.limits.concurrency.as_ref().is_some_and(|c| c.ordered),
        });
        self.0.insert(q, p);
        Ok(p)
    }
}

/// Disbatch's orphan rule for this node's own lease-less claims (made by older versions):
/// still claimed after 5 minutes, they will not start. Returns how many were orphaned.
pub async fn reap_orphans(store: &Store, node: &str) -> Result<u64> {
    let orphaned = store.recovery().reap_orphans(node, ORPHAN_AGE).await?;
    if orphaned > 0 {
        tracing::warn!(
            tasks = orphaned,
            "lease-less claims that never started were marked orphaned (-6)"
        );
    }
    Ok(orphaned)
}

/// Recovers the fleet's tasks whose lease passed (the maintenance leader's job).
/// `connected_for` is how long this node has reached the database without a failure: after
/// an outage (or its own start), runners get a lease and RECONNECT_SLACK to renew before
/// their tasks may be taken from them.
/// `shortest_lease`: no lease written from now on is shorter (the fleet's queues' shortest,
/// at least `MIN_LEASE`); the report says when to look again.
pub async fn recover_expired_leases(
    store: &Store,
    connected_for: Duration,
    shortest_lease: Duration,
) -> Result<ReapReport> {
    let mut report = ReapReport::default();
    let shortest_lease = shortest_lease.max(MIN_LEASE);
    let now = disbatch_store::deadline(Duration::ZERO);
    let horizon = disbatch_store::deadline(shortest_lease);
    let ending = store
        .recovery()
        .leases_ending_before(horizon, RECOVER_PER_PASS)
        .await?;
    let (expired, later): (Vec<_>, Vec<_>) = ending
        .into_iter()
        .partition(|t| t.lease_until.is_some_and(|until| until < now));
    report.next_check_in = match later.first().and_then(|t| t.lease_until) {
        // The batch held only expired leases: more may wait behind it.
        None if expired.len() as i64 >= RECOVER_PER_PASS => Duration::ZERO,
        None => shortest_lease,
        Some(until) => Duration::from_millis(
            u64::try_from(
                until
                    .timestamp_millis()
                    .saturating_sub(now.timestamp_millis()),
            )
            .unwrap_or(0),
        ),
    };
    let mut policies = Policies::default();
    for t in &expired {
        let policy = policies.of(store, t.queue).await?;
        let lease = policy.map_or(disbatch_model::run_policy::DEFAULT_LEASE, |p| p.run.lease);
        if connected_for < lease + RECONNECT_SLACK {
            report.deferred += 1;
            report.next_check_in = Duration::ZERO;
            continue;
        }
        let how = recovery_for(t, policy.as_ref());
        let from = t.node.as_deref().unwrap_or("?");
        let why = format!("its lease passed on node {from}");
        let wait = retry_wait(t, policy.as_ref());
        if !store
            .recovery()
            .recover_task_after(t, how, &why, wait)
            .await?
        {
            continue; // renewed, finished or recovered by another node meanwhile
        }
        let late_ms = t.lease_until.map_or(0, |until| {
            disbatch_store::deadline(Duration::ZERO)
                .timestamp_millis()
                .saturating_sub(until.timestamp_millis())
        });
        tracing::warn!(
            task = %t.id, from_node = from, status = t.status,
            recovery = ?how, lease_passed_ms = late_ms, "recovered a task whose lease passed"
        );
        report.count(how);
    }
    Ok(report)
}

/// Writes the records of lost attempts that a recovery left unwritten (its node or the server
/// died between moving the task and writing the record; the leader's job). Returns how many
/// records it wrote or corrected.
pub async fn write_unrecorded_attempts(store: &Store) -> Result<u64> {
    let written = store.recovery().write_unrecorded_attempts().await?;
    for lost in &written {
        tracing::warn!(
            task = %lost.task, attempt = %lost.attempt, from_node = lost.node.as_deref().unwrap_or("?"),
            reason = %lost.reason,
            "wrote the record of a lost attempt that its recovery had left unwritten"
        );
    }
    Ok(written.len() as u64)
}

/// Recovers the lease-less claims (a Perl node's: it keeps no lease) of every node whose
/// heartbeat is older than `silent_for`: nothing else ever ends them, and they hold their
/// queue's threads. The node itself, should it come back, finds them gone, as after a
/// lease recovery.
pub async fn recover_silent_nodes(store: &Store, silent_for: Duration) -> Result<ReapReport> {
    let mut report = ReapReport::default();
    let nodes = store.recovery().silent_nodes(silent_for).await?;
    if nodes.is_empty() {
        return Ok(report);
    }
    let mut policies = Policies::default();
    for t in store
        .recovery()
        .lease_less_tasks_of(&nodes, RECOVER_PER_PASS)
        .await?
    {
        let policy = policies.of(store, t.queue).await?;
        let how = recovery_for(&t, policy.as_ref());
        let from = t.node.as_deref().unwrap_or("?");
        let why = format!(
            "its node {from} stopped heartbeating (silent for over {} s)",
            silent_for.as_secs()
        );
        let wait = retry_wait(&t, policy.as_ref());
        if !store
            .recovery()
            .recover_task_after(&t, how, &why, wait)
            .await?
        {
            continue;
        }
        tracing::warn!(
            task = %t.id, from_node = from, status = t.status, recovery = ?how,
            "recovered a lease-less task of a node that stopped heartbeating"
        );
        report.count(how);
    }
    Ok(report)
}

/// How long a task requeued after its runner died waits before it may be claimed again: a
/// runner that dies at every start (a broken install, a plugin that kills its parent) would
/// otherwise loop claim → death → requeue as fast as the database answers. 1 s after the
/// first death, doubling per attempt, at most a minute.
pub fn runner_death_delay(attempts: i64) -> Duration {
    let exp = attempts.clamp(1, 7) - 1;
    Duration::from_secs(1 << exp).min(Duration::from_secs(60))
}

/// Recovers at once the task of a runner this node saw exit while the task still runs as
/// its attempt: no one else will end it, and waiting for its lease would hold its slot for
/// a whole lease. Conditional on the attempt, so a result the runner (or this node for it)
/// stored first is never overwritten. Returns how it was recovered, if it was.
pub async fn recover_runner_death(
    store: &Store,
    task: ObjectId,
    attempt: ObjectId,
    exit: &str,
) -> Result<Option<Recovery>> {
    let Some(t) = store.recovery().running_attempt(task, attempt).await? else {
        return Ok(None);
    };
    let policy = Policies::default().of(store, t.queue).await?;
    let how = recovery_for(&t, policy.as_ref());
    let from = t.node.as_deref().unwrap_or("?");
    let why = format!("its task runner on node {from} exited without a result ({exit})");
    if !store
        .recovery()
        .recover_task_after(
            &t,
            how,
            &why,
            runner_death_delay(t.attempts).max(retry_wait(&t, policy.as_ref())),
        )
        .await?
    {
        return Ok(None);
    }
    tracing::warn!(task = %task, status = t.status, recovery = ?how, "{why}; recovered at once");
    Ok(Some(how))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::DateTime;

    fn expired(status: i32, attempts: i64) -> ExpiredTask {
        ExpiredTask {
            id: ObjectId::new(),
            queue: Some(ObjectId::new()),
            status,
            node: Some("n1".into()),
            attempt: Some(ObjectId::new()),
            attempts,
            cancel_requested: false,
            lease_until: Some(DateTime::now()),
            started: None,
        }
    }

    fn policy(on_lost: OnLost, max_retries: Option<u32>) -> LostPolicy {
        LostPolicy {
            run: RunPolicy {
                on_lost,
                ..RunPolicy::default()
            },
            max_retries,
            ordered_keys: false,
        }
    }

    #[test]
    fn a_claim_that_never_started_is_always_requeued() {
        let t = expired(status::CLAIMED, 0);
        assert_eq!(
            recovery_for(&t, None),
            Recovery::Requeue {
                keep_key_slot: false
            }
        );
        let orphaning = policy(OnLost::Orphan, None);
        assert_eq!(
            recovery_for(&t, Some(&orphaning)),
            Recovery::Requeue {
                keep_key_slot: false
            }
        );
    }

    #[test]
    fn a_started_task_follows_on_lost_within_max_retries() {
        let t = expired(status::RUNNING, 2);
        assert_eq!(recovery_for(&t, None), Recovery::Orphan, "unknown queue");
        let orphan = policy(OnLost::Orphan, None);
        assert_eq!(recovery_for(&t, Some(&orphan)), Recovery::Orphan);
        let requeue = policy(OnLost::Requeue, None);
        assert_eq!(
            recovery_for(&t, Some(&requeue)),
            Recovery::Requeue {
                keep_key_slot: false
            }
        );
        let room = policy(OnLost::Requeue, Some(3));
        assert_eq!(
            recovery_for(&t, Some(&room)),
            Recovery::Requeue {
                keep_key_slot: false
            }
        );
        // An ordered queue's task keeps its place among its key's tasks.
        let ordered = LostPolicy {
            ordered_keys: true,
            ..room
        };
        assert_eq!(
            recovery_for(&t, Some(&ordered)),
            Recovery::Requeue {
                keep_key_slot: true
            }
        );
        let spent = policy(OnLost::Requeue, Some(2));
        assert_eq!(
            recovery_for(&t, Some(&spent)),
            Recovery::Fail { max_retries: 2 },
            "retries used up by lost attempts fail the task, as Coordinate does"
        );
        let orphaning = policy(OnLost::Orphan, Some(2));
        assert_eq!(recovery_for(&t, Some(&orphaning)), Recovery::Orphan);
    }

    #[test]
    fn a_task_whose_runner_keeps_dying_waits_longer_each_time() {
        assert_eq!(runner_death_delay(0), Duration::from_secs(1));
        assert_eq!(runner_death_delay(1), Duration::from_secs(1));
        assert_eq!(runner_death_delay(2), Duration::from_secs(2));
        assert_eq!(runner_death_delay(6), Duration::from_secs(32));
        assert_eq!(runner_death_delay(7), Duration::from_secs(60));
        assert_eq!(runner_death_delay(i64::MAX), Duration::from_secs(60));
    }

    #[test]
    fn a_requested_cancel_wins() {
        let mut t = expired(status::RUNNING, 1);
        t.cancel_requested = true;
        let requeue = policy(OnLost::Requeue, None);
        assert_eq!(recovery_for(&t, Some(&requeue)), Recovery::Cancel);
    }
}
