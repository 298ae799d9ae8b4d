"""Task statuses, as the fleet stores them (docs/src/concepts.md)."""

QUEUED = -2
BLOCKED = -4
CLAIMED = -1
RUNNING = 0
SUCCEEDED = 1
FAILED = 2
TERMINATED = -3
CANCELLED = -5
ORPHANED = -6

#: Statuses no node moves a task out of by itself (a retry policy requeues from 0, never from these).
FINAL = frozenset({SUCCEEDED, TERMINATED, CANCELLED, ORPHANED})

#: The names a queue's `unique.states` takes, as in core/src/limits.rs.
STATE_NAMES = {
    "queued": (QUEUED,),
    "running": (CLAIMED, RUNNING),
    "succeeded": (SUCCEEDED,),
    "failed": (FAILED,),
    "cancelled": (CANCELLED,),
    "terminated": (TERMINATED,),
    "blocked": (BLOCKED,),
    "orphaned": (ORPHANED,),
}


def is_final(status: object) -> bool:
    """Whether a task of this status has ended: succeeded, failed (any status ≥ 2), terminated, cancelled, orphaned."""
    if isinstance(status, bool) or not isinstance(status, (int, float)):
        return False
    return status >= FAILED or int(status) in FINAL
