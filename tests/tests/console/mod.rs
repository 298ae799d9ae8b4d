//! The operator console in headless Chromium, with a real DCI, DEN and server.

mod flow_limits;
mod pages;
mod tasks;
mod workflows;
