//! Flow limits across nodes: key slots, rate windows and the flow view the claimer reads.

domain_handle!(
    /// Flow limits: key slots, rate windows and the flow view the claimer and the console read.
    LimitStore,
    limits
);

pub(crate) mod flow_view;
pub(crate) mod key_slots;
pub(crate) mod rate_limits;

use bson::Document;
use disbatch_model::held::Held;
use disbatch_model::schema::task;

use crate::error::{Error, Result};
use crate::StatusGroup;

impl LimitStore<'_> {
    /// Why task `t` waits on its queue's flow limits now, or None: not queued, no limit
    /// holding claims, or a queue that cannot be read (a node skips it anyway).
    pub async fn why_held(self, t: &Document) -> Result<Option<Held>> {
        let queued = StatusGroup::of(t.get(task::STATUS)) == StatusGroup::Queued;
        let Ok(queue) = t.get_object_id(task::QUEUE) else {
            return Ok(None);
        };
        if !queued {
            return Ok(None);
        }
        let limits = match self.queues().queue_by_id(queue).await {
            Ok(Some(q)) => q.limits,
            Ok(None) | Err(Error::BadDocument { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.task_held(t, &limits, disbatch_model::fleet_time::now())
            .await
    }
}
