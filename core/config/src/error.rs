//! The config layer's errors: a config file that cannot be read or is wrong, and a value this
//! process cannot use. The store's error takes them whole (the same words).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config file could not be read, parsed or validated.
    #[error("config file {}: {message}", path.display())]
    Config { path: PathBuf, message: String },

    /// A value (the hostname for the node name, a plugin) is not usable.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
