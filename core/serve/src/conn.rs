//! One accepted connection: its TLS handshake, HTTP/1.1 or HTTP/2 through hyper, and the
//! watchdog that closes it when a timeout of its `Activity` passes.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;

use super::activity::{Activity, Timeouts};
use super::slots::Slot;

/// Serves one connection until its client closes it, a timeout passes, or the server stops.
pub(super) async fn run(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    app: Router,
    slot: Slot,
    timeouts: Timeouts,
    mut stop: watch::Receiver<bool>,
) {
    let activity = slot.activity.clone();
    match tls {
        None => serve_io(stream, app, &activity, timeouts, stop).await,
        Some(acceptor) => {
            // The handshake counts against the first request's header timeout.
            let stream = tokio::select! {
                r = acceptor.accept(stream) => match r {
                    Ok(stream) => stream,
                    Err(e) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                },
                why = activity.expired(timeouts, false) => {
                    tracing::debug!(?why, "connection closed during its TLS handshake");
                    return;
                }
                _ = stop.wait_for(|stopping| *stopping) => return,
            };
            serve_io(stream, app, &activity, timeouts, stop).await;
        }
    }
    drop(slot);
}

async fn serve_io<I>(
    io: I,
    app: Router,
    activity: &Arc<Activity>,
    timeouts: Timeouts,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(Watched {
        io,
        activity: activity.clone(),
        stalled: false,
    });
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let in_flight = requests.request_started();
        let app = app.clone();
        async move {
            // A body that stops arriving fails its request instead of holding the connection.
            let req = req.map(|body| Body::new(TimeoutBody::new(timeouts.header, body)));
            let response = app.oneshot(req).await?;
            // The request stays in flight until its response body has been sent (or dropped).
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &in_flight;
                    frame
                }))
            }))
        }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            why = activity.expired(timeouts, closing) => {
                // Nothing is in flight (or the client stopped reading): nothing to finish.
                tracing::debug!(?why, "closing the connection");
                return;
            }
            _ = stop.wait_for(|stopping| *stopping), if !closing => {
                // Requests in flight finish; the connection closes after them.
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// The connection's I/O, reporting bytes read and writes the client does not take.
struct Watched<I> {
    io: I,
    activity: Arc<Activity>,
    /// Whether the last write waited: the activity is told only of changes.
    stalled: bool,
}

impl<I> Watched<I> {
    fn note_write<T>(&mut self, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        let stalled = poll.is_pending();
        if stalled != self.stalled {
            self.stalled = stalled;
            self.activity.write_stalled(stalled);
        }
        poll
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.bytes_read();
        }
        poll
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.note_write(poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.note_write(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.note_write(poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
