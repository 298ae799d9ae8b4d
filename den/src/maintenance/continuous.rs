//! The continuous-unit maker: a synthetic task for each continuous queue that is due and idle.

use bson::oid::ObjectId;
use bson::{DateTime, Document};
use disbatch_model::fleet_time;
use disbatch_store::Result;
use disbatch_store::{OnConflict, Store, Unit};

/// A continuous queue.
pub struct ContinuousQueue {
    pub id: ObjectId,
    pub interval: std::time::Duration,
}

/// The queues due synthetic tasks when idle: continuous, with threads, not paused. All of
/// the fleet's, whichever nodes serve them: the maintenance leader makes them for everyone,
/// once a pass, beside the claimers that make one when they pick an idle queue.
pub fn continuous_queues(queues: &[disbatch_model::Queue]) -> Vec<ContinuousQueue> {
    queues
        .iter()
        .filter(|q| q.spec.continuous && !q.spec.paused && q.threads.as_ref().is_ok_and(|t| *t > 0))
        .map(|q| ContinuousQueue {
            id: q.id,
            interval: q.spec.interval,
        })
        .collect()
}

/// What one round of the maker did.
#[derive(Debug, Default)]
pub struct ContinuousReport {
    pub made: u32,
    /// Queues whose turn or task the server refused (their documents hold what it cannot
    /// update), with its reason: the other queues still got theirs.
    pub refused: Vec<(ObjectId, String)>,
}

/// Makes the due synthetic tasks. A queue that still has a claimable or running task gets
/// none, and the turn is taken in the database first, so of all the nodes asking, one makes
/// the task and the others make nothing.
pub async fn make_continuous_units(
    store: &Store,
    queues: &[ContinuousQueue],
) -> Result<ContinuousReport> {
    let mut report = ContinuousReport::default();
    for q in queues {
        match take_turn(store, q).await {
            Ok(Turn::Made(made)) => report.made += made,
            Ok(Turn::Live | Turn::NotYours) => {}
            Err(e) => match e.refusal() {
                Some(why) => report.refused.push((q.id, why)),
                None => return Err(e),
            },
        }
    }
    if report.made > 0 {
        tracing::debug!(made = report.made, "made continuous tasks");
    }
    Ok(report)
}

/// What asking for a continuous queue's turn came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// It has a claimable or running task: none is due, whatever the interval.
    Live,
    /// Another caller took this interval's turn.
    NotYours,
    /// This caller's turn, with the units it made (0 when one of that name exists already).
    Made(u32),
}

/// Makes the queue's synthetic task if it is idle and its turn is free. Called by the leader
/// once a maintenance pass and by a claimer that picks the queue and finds it empty (which
/// ones: claimer/continuous.rs); the turn, taken in the database, keeps that to one task per
/// interval across the fleet.
pub async fn take_turn(store: &Store, q: &ContinuousQueue) -> Result<Turn> {
    if store.tasks().has_live_task(q.id).await? {
        return Ok(Turn::Live);
    }
    if !store
        .queues()
        .take_continuous_turn(q.id, q.interval)
        .await?
    {
        return Ok(Turn::NotYours);
    }
    let unit = Unit {
        key: unit_name(fleet_time::now()),
        params: Document::new(),
        priority: None,
        not_before: None,
    };
    let out = store
        .workflows()
        .add_units(q.id, vec![unit], OnConflict::Reject)
        .await?;
    Ok(Turn::Made(out.inserted.len() as u32))
}

/// Coordinate names a continuous unit by Unix time: `<seconds>.<milliseconds>`.
pub fn unit_name(now: DateTime) -> String {
    let ms = now.timestamp_millis();
    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_named_by_unix_time_with_milliseconds() {
        assert_eq!(
            unit_name(DateTime::from_millis(1_700_000_000_123)),
            "1700000000.123"
        );
        assert_eq!(
            unit_name(DateTime::from_millis(1_700_000_000_005)),
            "1700000000.005"
        );
    }
}
