//! What a node hands the task runner it starts, on the runner's stdin: the claimed task, its
//! attempt and its queue, as one BSON document, so the runner need not read them again. The
//! pipe stays open when the node relays the runner's result (`relay`).

use bson::oid::ObjectId;
use bson::{doc, Document};

use crate::fleet_time::Anchor;
use crate::task::ClaimedTask;

/// The handoff's field for the node's reading of the server's clock (`clock_document`).
pub const CLOCK: &str = "clock";

/// What a node and its worker host (the runner in `--worker-host` mode) send each other
/// besides handoffs, each a BSON frame on the host's stdin or stdout.
pub mod host_frame {
    /// Node → host, `{"wake": <task id>}`: renew that task's lease now (a cancel request was
    /// seen).
    pub const WAKE: &str = "wake";
    /// Host → node, `{"ended": <task id>, "attempt": <id>, "outcome": <name>}`: the task is
    /// over and its result written (or given up); its slot is free.
    pub const ENDED: &str = "ended";

    use bson::oid::ObjectId;
    use bson::{doc, Bson, DateTime, Document};

    use crate::task::Outcome;

    /// An `ended` report: the one shape the host writes and the node reads.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Ended {
        pub task: ObjectId,
        pub attempt: ObjectId,
        /// None when the host could not learn it (written as `unknown`).
        pub outcome: Option<Outcome>,
        pub task_discarded: bool,
        pub retry_at: Option<DateTime>,
    }

    impl Ended {
        pub fn to_document(&self) -> Document {
            doc! {
                ENDED: self.task, "attempt": self.attempt, "outcome": Outcome::label(self.outcome),
                "task_discarded": self.task_discarded,
                "retry_at": self.retry_at.map_or(Bson::Null, Bson::DateTime),
            }
        }

        /// The report in `d`; None when it names no task or attempt (a wake or other frame).
        pub fn from_document(d: &Document) -> Option<Ended> {
            Some(Ended {
                task: d.get_object_id(ENDED).ok()?,
                attempt: d.get_object_id("attempt").ok()?,
                outcome: d.get_str("outcome").ok().and_then(Outcome::parse),
                task_discarded: d.get_bool("task_discarded").unwrap_or(false),
                retry_at: d.get_datetime("retry_at").ok().copied(),
            })
        }
    }
}

/// A claimed task ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Handoff {
    /// The task as the claim returned it.
    pub task: ClaimedTask,
    /// The attempt the claim started: the runner's fencing token.
    pub attempt: ObjectId,
    /// The queue document as the node read it.
    pub queue: Document,
    /// The node takes the runner's completion on stdout and answers on stdin (see `relay`).
    pub relay: bool,
    /// With `relay`: the node also takes the running task's live output copies on stdout
    /// (`relay::LiveCopy`) and writes them, so the runner need not connect for them. A node
    /// that does not say so (an older one) leaves the runner to write its own.
    pub live: bool,
    /// When the queue's rate limit granted this attempt's start (the server's time): the
    /// attempt's record starts then, not when the runner got going, so the records show what
    /// the limit counted. None without a rate limit.
    pub started_at: Option<bson::DateTime>,
    /// The node's reading of the server's clock, pinned to the host's boot clock: the runner
    /// takes the fleet's time from it (`fleet_time::adopt`) instead of a round trip of its
    /// own. None from an older node, or one that has not read the server's clock yet.
    pub clock: Option<Anchor>,
}

/// A clock anchor as a handoff carries it.
pub fn clock_document(anchor: &Anchor) -> Document {
    doc! {"server": bson::DateTime::from_millis(anchor.server_ms), "boot_ns": anchor.boot_ns}
}

/// The clock anchor of a handoff frame, if it has a readable one.
pub fn clock_of(frame: &Document) -> Option<Anchor> {
    let c = frame.get_document(CLOCK).ok()?;
    Some(Anchor {
        server_ms: c.get_datetime("server").ok()?.timestamp_millis(),
        boot_ns: c.get_i64("boot_ns").ok()?,
    })
}

impl Handoff {
    pub fn task_id(&self) -> ObjectId {
        self.task.id
    }

    pub fn queue_id(&self) -> Option<ObjectId> {
        self.task.queue
    }

    /// The handoff as a document: what a runner reads on stdin (`encode`) and a worker host
    /// reads as a frame, the one shape both decode (`from_document`).
    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "task": &self.task.raw, "attempt": self.attempt, "queue": &self.queue, "relay": self.relay,
            "live": self.live,
        };
        if let Some(at) = self.started_at {
            d.insert("started_at", at);
        }
        if let Some(anchor) = &self.clock {
            d.insert(CLOCK, clock_document(anchor));
        }
        d
    }

    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        self.to_document()
            .to_writer(&mut out)
            .map_err(|e| format!("encoding the handoff: {e}"))?;
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Handoff, String> {
        let d = crate::text::raw_doc::from_bytes(bytes)
            .map_err(|e| format!("the handoff on stdin cannot be read: {e}"))?;
        Handoff::from_document(&d)
    }

    pub fn from_document(d: &Document) -> Result<Handoff, String> {
        let field = |k: &str| {
            d.get_document(k)
                .cloned()
                .map_err(|_| format!("the handoff has no `{k}` document"))
        };
        let (task, queue) = (field("task")?, field("queue")?);
        let attempt = d
            .get_object_id("attempt")
            .map_err(|_| "the handoff has no `attempt` id".to_string())?;
        Ok(Handoff {
            // Claims only return tasks with an ObjectId `_id` (`ClaimedTask`).
            task: ClaimedTask::from_document(task)
                .ok_or("the handoff's task has no ObjectId `_id`")?,
            queue,
            attempt,
            relay: d.get_bool("relay").unwrap_or(false),
            live: d.get_bool("live").unwrap_or(false),
            started_at: d.get_datetime("started_at").ok().copied(),
            clock: clock_of(d),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handoff_round_trips_exactly() {
        let h = Handoff {
            started_at: None,
            task: ClaimedTask::from_document(doc! {"_id": ObjectId::new(), "params": {"n": 1_i64, "when": bson::DateTime::now()}}).unwrap(),
            attempt: ObjectId::new(),
            queue: doc! {"name": "q", "threads": 3},
            relay: true,
            live: true,
            clock: Some(Anchor {
                server_ms: 1_700_000_000_123,
                boot_ns: 42_000_000_007,
            }),
        };
        let bytes = h.encode().unwrap();
        assert_eq!(Handoff::decode(&bytes).unwrap(), h);
    }

    #[test]
    fn a_handoff_from_an_older_node_has_no_live_relay() {
        let older = doc! {"task": {"_id": ObjectId::new()}, "queue": {}, "attempt": ObjectId::new(), "relay": true};
        let mut bytes = Vec::new();
        older.to_writer(&mut bytes).unwrap();
        let h = Handoff::decode(&bytes).unwrap();
        assert!(h.relay);
        assert!(!h.live, "the runner writes its own live copies");
        assert_eq!(h.clock, None, "the runner reads the server's clock itself");
    }

    #[test]
    fn an_ended_report_round_trips_and_an_unknown_outcome_stays_unknown() {
        use host_frame::Ended;
        let ended = Ended {
            task: ObjectId::new(),
            attempt: ObjectId::new(),
            outcome: Some(crate::task::Outcome::Retry),
            task_discarded: false,
            retry_at: Some(bson::DateTime::from_millis(1_700_000_000_000)),
        };
        assert_eq!(
            Ended::from_document(&ended.to_document()),
            Some(ended.clone())
        );
        let unknown = Ended {
            outcome: None,
            ..ended
        };
        let d = unknown.to_document();
        assert_eq!(d.get_str("outcome"), Ok("unknown"));
        assert_eq!(Ended::from_document(&d), Some(unknown));
        assert_eq!(Ended::from_document(&doc! {"wake": ObjectId::new()}), None);
    }

    #[test]
    fn garbage_is_a_clear_error() {
        assert!(Handoff::decode(b"not bson")
            .unwrap_err()
            .contains("not a BSON"));
        let no_attempt = doc! {"task": {}, "queue": {}};
        let mut bytes = Vec::new();
        no_attempt.to_writer(&mut bytes).unwrap();
        assert!(Handoff::decode(&bytes).unwrap_err().contains("attempt"));
        let no_task_id = doc! {"task": {"_id": "t1"}, "queue": {}, "attempt": ObjectId::new()};
        let mut bytes = Vec::new();
        no_task_id.to_writer(&mut bytes).unwrap();
        assert!(Handoff::decode(&bytes)
            .unwrap_err()
            .contains("task has no ObjectId"));
    }
}
