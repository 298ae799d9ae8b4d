//! What wakes a node before its next pass: change streams on queues and tasks, and the leader's fan-out of work signals.

pub mod fanout;
pub mod notifier;
