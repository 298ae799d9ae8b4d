//! Tasks that wait on others or on the clock: dependencies, batches, chaining and schedules.

mod batches;
mod chaining;
mod dependencies;
mod long_waits;
mod schedule_ticks;
mod schedules;
mod schedules_dst;
mod settling;
