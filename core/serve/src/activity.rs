//! What one connection is doing (requests in flight, a head being sent, a stalled write) and
//! when, by the listener's timeouts, it must be closed.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Why a connection is closed by the server rather than by its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// A request's head (or the TLS handshake) did not arrive in time.
    HeaderTimeout,
    /// No request and no byte of one for the idle timeout.
    Idle,
    /// The client did not read what it was sent for the idle timeout.
    WriteStalled,
    /// Its slot went to a new connection: the listener was full and this one waited longest.
    Evicted,
    /// The server is stopping and this connection has nothing in flight.
    Closing,
}

/// The two timeouts that decide when a connection expires.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    pub header: Duration,
    pub idle: Duration,
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    /// Since when nothing has been in flight (the accept, or the end of the last response).
    free_since: Instant,
    /// Since when a request head has been arriving (the accept for the first request).
    head_since: Option<Instant>,
    /// Since when a write to the client has been waiting for it to read.
    write_stalled_since: Option<Instant>,
    evicted: bool,
}

impl State {
    /// The next moment this connection expires, and why; None while a request is in flight
    /// and its writes move. Pure, so the rules are tested without clocks or sockets.
    fn deadline(&self, t: Timeouts, closing: bool) -> Option<(Instant, Expiry)> {
        if let Some(since) = self.write_stalled_since {
            return Some((since + t.idle, Expiry::WriteStalled));
        }
        if self.in_flight > 0 {
            return None;
        }
        if self.evicted {
            return Some((self.free_since, Expiry::Evicted));
        }
        if closing {
            return Some((self.free_since, Expiry::Closing));
        }
        Some(match self.head_since {
            Some(since) => (since + t.header, Expiry::HeaderTimeout),
            None => (self.free_since + t.idle, Expiry::Idle),
        })
    }
}

/// Shared by the connection's task, its I/O wrapper, its requests and the listener's slots.
#[derive(Debug)]
pub(super) struct Activity {
    state: Mutex<State>,
    /// Wakes the watchdog when a change may bring its deadline nearer.
    wake: Notify,
}

impl Activity {
    /// A connection just accepted: its first request's head is due within the header timeout.
    pub fn new() -> Self {
        let now = Instant::now();
        Activity {
            state: Mutex::new(State {
                in_flight: 0,
                free_since: now,
                head_since: Some(now),
                write_stalled_since: None,
                evicted: false,
            }),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever a panicking holder did: every update is one store.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request's head is complete and its handler starts; the guard ends it when dropped
    /// (after the last byte of its response body, or when the connection dies).
    pub fn request_started(self: &Arc<Self>) -> InFlight {
        let mut s = self.lock();
        s.in_flight += 1;
        s.head_since = None;
        InFlight(self.clone())
    }

    /// Bytes came in: with nothing in flight they are the start of the next request's head.
    pub fn bytes_read(&self) {
        let mut s = self.lock();
        if s.in_flight == 0 && s.head_since.is_none() {
            s.head_since = Some(Instant::now());
            drop(s);
            self.wake.notify_one();
        }
    }

    /// A write could not go out (`stalled`) or went out after all.
    pub fn write_stalled(&self, stalled: bool) {
        let mut s = self.lock();
        match (stalled, s.write_stalled_since) {
            (true, None) => {
                s.write_stalled_since = Some(Instant::now());
                drop(s);
                self.wake.notify_one();
            }
            (false, Some(_)) => s.write_stalled_since = None,
            _ => {}
        }
    }

    /// Since when the connection has waited with nothing in flight; None when it is busy or
    /// already given up. The listener evicts the one that has waited longest.
    pub fn waiting_since(&self) -> Option<Instant> {
        let s = self.lock();
        (s.in_flight == 0 && !s.evicted).then_some(s.free_since)
    }

    pub fn evict(&self) {
        self.lock().evicted = true;
        self.wake.notify_one();
    }

    /// Resolves when the connection must be closed; never while a request is in flight and
    /// its response is being read.
    pub async fn expired(&self, t: Timeouts, closing: bool) -> Expiry {
        loop {
            let next = self.lock().deadline(t, closing);
            match next {
                None => self.wake.notified().await,
                Some((at, why)) if at <= Instant::now() => return why,
                Some((at, _)) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = self.wake.notified() => {}
                    }
                }
            }
        }
    }
}

/// One request in flight on the connection.
#[derive(Debug)]
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            s.free_since = Instant::now();
        }
        drop(s);
        self.0.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        header: Duration::from_secs(10),
        idle: Duration::from_secs(30),
    };

    fn state(at: Instant) -> State {
        State {
            in_flight: 0,
            free_since: at,
            head_since: Some(at),
            write_stalled_since: None,
            evicted: false,
        }
    }

    #[test]
    fn a_new_connection_owes_its_first_head_within_the_header_timeout() {
        let t0 = Instant::now();
        let s = state(t0);
        assert_eq!(
            s.deadline(T, false),
            Some((t0 + T.header, Expiry::HeaderTimeout))
        );
        assert_eq!(s.deadline(T, true), Some((t0, Expiry::Closing)));
    }

    #[test]
    fn in_flight_requests_hold_off_every_timeout_but_a_stalled_write() {
        let t0 = Instant::now();
        let mut s = state(t0);
        s.in_flight = 1;
        s.head_since = None;
        s.evicted = true;
        assert_eq!(s.deadline(T, true), None);
        let stalled = t0 + Duration::from_secs(5);
        s.write_stalled_since = Some(stalled);
        assert_eq!(
            s.deadline(T, false),
            Some((stalled + T.idle, Expiry::WriteStalled))
        );
    }

    #[test]
    fn between_requests_the_idle_timeout_runs_until_a_byte_arrives() {
        let t0 = Instant::now();
        let mut s = state(t0);
        s.head_since = None;
        assert_eq!(s.deadline(T, false), Some((t0 + T.idle, Expiry::Idle)));
        let byte = t0 + Duration::from_secs(25);
        s.head_since = Some(byte);
        assert_eq!(
            s.deadline(T, false),
            Some((byte + T.header, Expiry::HeaderTimeout))
        );
        s.evicted = true;
        assert_eq!(s.deadline(T, false), Some((t0, Expiry::Evicted)));
    }

    /// Real time, short timeouts: each expiry must come after its timeout and not much later.
    #[tokio::test]
    async fn the_watchdog_follows_requests_and_bytes() {
        const SHORT: Timeouts = Timeouts {
            header: Duration::from_millis(60),
            idle: Duration::from_millis(150),
        };
        // Never early: each `since` is taken before the event that starts the connection's
        // clock, so the time waited is at least the timeout however slow the machine. How
        // late it may be is not asserted (a loaded machine decides that, not the watchdog).
        let not_early = |since: Instant, timeout: Duration| {
            let took = since.elapsed();
            assert!(
                took >= timeout,
                "expired after {took:?}, timeout {timeout:?}"
            );
        };
        let started = Instant::now();
        let a = Arc::new(Activity::new());
        assert_eq!(a.expired(SHORT, false).await, Expiry::HeaderTimeout);
        not_early(started, SHORT.header);

        let a = Arc::new(Activity::new());
        let request = a.request_started();
        assert_eq!(a.waiting_since(), None);
        let watch = {
            let a = a.clone();
            tokio::spawn(async move { a.expired(SHORT, false).await })
        };
        tokio::time::sleep(SHORT.idle * 3).await;
        assert!(
            !watch.is_finished(),
            "no timeout while a request is in flight"
        );
        let ended = Instant::now();
        drop(request);
        assert_eq!(watch.await.ok(), Some(Expiry::Idle));
        not_early(ended, SHORT.idle);

        let a = Arc::new(Activity::new());
        drop(a.request_started());
        tokio::time::sleep(Duration::from_millis(20)).await;
        let head = Instant::now();
        a.bytes_read();
        assert_eq!(a.expired(SHORT, false).await, Expiry::HeaderTimeout);
        not_early(head, SHORT.header);
    }
}
