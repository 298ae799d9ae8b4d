//! What a run leaves: completions, attempt records, GridFS output and live output.

domain_handle!(
    /// Results: completions, attempt records, GridFS output and live output.
    ResultStore,
    results
);

pub(crate) mod attempts;
pub(crate) mod completions;
pub(crate) mod finish;
pub(crate) mod gridfs;
pub(crate) mod live_output;
