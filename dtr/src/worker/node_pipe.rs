//! The worker host's stdin and stdout, the pipes its node holds the other ends of, read and
//! written by the runtime's own poller: `tokio::io::stdin`/`stdout` hand every read and write
//! to a blocking thread, two thread hops per frame on the host's busiest path. Anything but a
//! pipe (a host started by hand with a file) falls back to those.

use std::os::fd::AsFd;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

/// The host's stdin.
pub fn reader() -> Pin<Box<dyn AsyncRead + Send>> {
    let piped = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(pipe::Receiver::from_owned_fd);
    match piped {
        Ok(r) => Box::pin(r),
        Err(e) => {
            tracing::debug!(error = %e, "stdin is not a pipe; read through a blocking thread");
            Box::pin(tokio::io::stdin())
        }
    }
}

/// The host's stdout.
pub fn writer() -> Pin<Box<dyn AsyncWrite + Send>> {
    let piped = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .and_then(pipe::Sender::from_owned_fd);
    match piped {
        Ok(w) => Box::pin(w),
        Err(e) => {
            tracing::debug!(error = %e, "stdout is not a pipe; written through a blocking thread");
            Box::pin(tokio::io::stdout())
        }
    }
}
