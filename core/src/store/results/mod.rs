//! What a run leaves: completions, attempt records, GridFS output and live output.

pub(in crate::store) mod attempts;
pub(in crate::store) mod completions;
pub(in crate::store) mod finish;
pub(in crate::store) mod gridfs;
pub(in crate::store) mod live_output;
