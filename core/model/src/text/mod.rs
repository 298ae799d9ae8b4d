//! Bytes and text: what is safe to show, store and log (printable, redaction, UTF-8, client JSON, raw documents).

pub mod client_json;
pub mod printable;
pub mod raw_doc;
pub mod redact;
pub mod utf8;
