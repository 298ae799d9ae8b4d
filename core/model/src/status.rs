//! Disbatch 4 task status codes. Positive means finished; only `QUEUED` is claimable.

pub const ORPHANED: i32 = -6;
pub const CANCELLED: i32 = -5;
pub const BLOCKED: i32 = -4;
pub const TERMINATED: i32 = -3;
pub const QUEUED: i32 = -2;
pub const CLAIMED: i32 = -1;
pub const RUNNING: i32 = 0;
pub const SUCCEEDED: i32 = 1;
pub const FAILED: i32 = 2;
