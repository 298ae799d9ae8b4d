//! The fleet's upkeep: the maintenance lease and the chores its holder (or every node) runs.

pub mod background;
pub mod balancer;
pub mod chores;
pub mod continuous;
pub mod count_keeper;
pub mod elector;
pub mod outside_inserts;
pub mod pruner;
pub mod reaper;
pub mod schedules;
pub mod stats_keeper;
