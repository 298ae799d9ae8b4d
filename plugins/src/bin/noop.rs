//! Disbatch no-op plugin: reads nothing and exits 0 at once, so a benchmark measures only
//! Disbatch's own cost per task (claim, runner, records), not a plugin's.

fn main() {}
