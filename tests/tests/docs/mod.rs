//! The book and the shipped examples, checked against the code they describe.

mod book;
mod example_config;
mod getting_started;
mod plugin_examples;
mod reference;
