//! Hostile inputs: malformed requests, documents, configs, plugins and floods, and no crash.

mod api;
mod big;
mod chaining;
mod config;
mod credentials;
mod display;
mod documents;
mod exact;
mod flood;
mod http;
mod plugins;
mod undecodable;
mod workers;
mod workflows;
