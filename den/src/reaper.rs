//! The reaper: recovers tasks whose lease passed, on any node, and keeps Disbatch's orphan
//! rule for lease-less claims (tasks claimed by Perl nodes).

use std::collections::HashMap;
use std::time::Duration;

use bson::oid::ObjectId;
use disbatch_core::model::status;
use disbatch_core::run_policy::{OnLost, RunPolicy};
use disbatch_core::store::{ExpiredTask, Recovery, Store};
use disbatch_core::Result;

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
    /// Expired, but left alone: this node has not been connected for a whole lease.
    pub deferred: u64,
}

/// The recovery policy of one queue, as the reaper needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LostPolicy {
    pub run: RunPolicy,
    pub max_retries: Option<u32>,
}

/// Where an expired task goes: an operator's cancel wins; a claim that never started is
/// queued again; a started one follows its queue's `on_lost` within `max_retries`.
pub fn recovery_for(t: &ExpiredTask, policy: Option<&LostPolicy>) -> Recovery {
    if t.cancel_requested {
        return Recovery::Cancel;
    }
    if t.status == status::CLAIMED {
        return Recovery::Requeue;
    }
    match policy {
        Some(p) if p.run.on_lost == OnLost::Requeue => match p.max_retries {
            Some(max) if t.attempts >= max as i64 => Recovery::Orphan,
            _ => Recovery::Requeue,
        },
        _ => Recovery::Orphan,
    }
}

/// One reaper pass. `connected_for` is how long this node has reached the database without
/// a failure: after an outage (or its own start), runners get a lease and RECONNECT_SLACK to
/// renew before their tasks may be taken from them.
pub async fn reap(store: &Store, node: &str, connected_for: Duration) -> Result<ReapReport> {
    let mut report = ReapReport {
        orphaned: store.reap_orphans(node, ORPHAN_AGE).await?,
        ..ReapReport::default()
    };
    if report.orphaned > 0 {
        tracing::warn!(
            tasks = report.orphaned,
            "lease-less claims that never started were marked orphaned (-6)"
        );
    }
    let expired = store.expired_leases(RECOVER_PER_PASS).await?;
    let mut policies: HashMap<ObjectId, Option<LostPolicy>> = HashMap::new();
    for t in &expired {
        let policy = match t.queue {
            Some(q) => match policies.get(&q) {
                Some(p) => *p,
                None => {
                    let queue = match store.queue_by_id(q).await {
                        Ok(queue) => queue,
                        // Reported where it was read; its tasks are recovered by the defaults.
                        Err(disbatch_core::Error::BadDocument { .. }) => None,
                        Err(e) => return Err(e),
                    };
                    let p = queue.map(|q| LostPolicy {
                        run: q.run,
                        max_retries: q.spec.max_retries,
                    });
                    policies.insert(q, p);
                    p
                }
            },
            None => None,
        };
        let lease = policy.map_or(disbatch_core::run_policy::DEFAULT_LEASE, |p| p.run.lease);
        if connected_for < lease + RECONNECT_SLACK {
            report.deferred += 1;
            continue;
        }
        let how = recovery_for(t, policy.as_ref());
        if !store.recover_task(t, how).await? {
            continue; // renewed, finished or recovered by another node meanwhile
        }
        let late_ms = disbatch_core::store::deadline(Duration::ZERO)
            .timestamp_millis()
            .saturating_sub(t.lease_until.timestamp_millis());
        tracing::warn!(
            task = %t.id, from_node = t.node.as_deref().unwrap_or("?"), status = t.status,
            recovery = ?how, lease_passed_ms = late_ms, "recovered a task whose lease passed"
        );
        match how {
            Recovery::Requeue => report.requeued += 1,
            Recovery::Orphan => report.orphaned += 1,
            Recovery::Cancel => report.cancelled += 1,
        }
    }
    Ok(report)
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
            lease_until: DateTime::now(),
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
        }
    }

    #[test]
    fn a_claim_that_never_started_is_always_requeued() {
        let t = expired(status::CLAIMED, 0);
        assert_eq!(recovery_for(&t, None), Recovery::Requeue);
        let orphaning = policy(OnLost::Orphan, None);
        assert_eq!(recovery_for(&t, Some(&orphaning)), Recovery::Requeue);
    }

    #[test]
    fn a_started_task_follows_on_lost_within_max_retries() {
        let t = expired(status::RUNNING, 2);
        assert_eq!(recovery_for(&t, None), Recovery::Orphan, "unknown queue");
        let orphan = policy(OnLost::Orphan, None);
        assert_eq!(recovery_for(&t, Some(&orphan)), Recovery::Orphan);
        let requeue = policy(OnLost::Requeue, None);
        assert_eq!(recovery_for(&t, Some(&requeue)), Recovery::Requeue);
        let room = policy(OnLost::Requeue, Some(3));
        assert_eq!(recovery_for(&t, Some(&room)), Recovery::Requeue);
        let spent = policy(OnLost::Requeue, Some(2));
        assert_eq!(recovery_for(&t, Some(&spent)), Recovery::Orphan);
    }

    #[test]
    fn a_requested_cancel_wins() {
        let mut t = expired(status::RUNNING, 1);
        t.cancel_requested = true;
        let requeue = policy(OnLost::Requeue, None);
        assert_eq!(recovery_for(&t, Some(&requeue)), Recovery::Cancel);
    }
}
