//! The `disbatch` CLI against a real DCI and DEN.

mod commands;
mod specs;
mod verbs;
mod workflows;
