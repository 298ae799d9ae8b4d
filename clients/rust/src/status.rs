//! Task statuses as the fleet stores them (docs/src/concepts.md).

pub const QUEUED: i32 = -2;
pub const BLOCKED: i32 = -4;
pub const CLAIMED: i32 = -1;
pub const RUNNING: i32 = 0;
pub const SUCCEEDED: i32 = 1;
pub const FAILED: i32 = 2;
pub const TERMINATED: i32 = -3;
pub const CANCELLED: i32 = -5;
pub const ORPHANED: i32 = -6;

/// Whether a task of this status has ended: succeeded, failed (any status ≥ 2), terminated,
/// cancelled or orphaned. A retry policy requeues from running, never from these.
pub fn is_final(status: i64) -> bool {
    status >= i64::from(SUCCEEDED)
        || [TERMINATED, CANCELLED, ORPHANED]
            .iter()
            .any(|&s| i64::from(s) == status)
}

/// The statuses a name of a queue's `unique.states` stands for (as core/model/src/limits.rs).
pub(crate) fn state_name(name: &str) -> Option<&'static [i32]> {
    Some(match name {
        "queued" => &[QUEUED],
        "running" => &[CLAIMED, RUNNING],
        "succeeded" => &[SUCCEEDED],
        "failed" => &[FAILED],
        "cancelled" => &[CANCELLED],
        "terminated" => &[TERMINATED],
        "blocked" => &[BLOCKED],
        "orphaned" => &[ORPHANED],
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_statuses_are_the_ended_ones() {
        for s in [1, 2, 3, 255, -3, -5, -6] {
            assert!(is_final(s), "{s}");
        }
        for s in [-2, -4, -1, 0] {
            assert!(!is_final(s), "{s}");
        }
    }
}
