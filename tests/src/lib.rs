//! Integration-test harness: a real MongoDB-wire server, one database per test, real binaries.
//!
//! `harness` holds the fixtures; the load generators, hostile inputs, injected faults and
//! outside peers live beside it. The harness is re-exported at the root, so a test names
//! `disbatch_tests::TestDb` or `disbatch_tests::restartable` wherever its file sits.

pub mod bench;
// At the root because den's unit tests include this file by its path (`#[path]`).
pub mod exposition;
pub mod faults;
pub mod harness;
pub mod hostile;
pub mod peers;

pub use harness::*;
