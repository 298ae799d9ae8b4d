//! The accept loop against real sockets on loopback: timeouts, eviction and shutdown.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::*;

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
/// More than loopback's socket buffers hold, so a client that does not read stalls the server.
const BIG: usize = 64 << 20;

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
}

/// Streamed a MiB at a time, so the response stays in flight while the client does not read.
fn big_stream() -> axum::body::Body {
    let chunks = (0..BIG >> 20)
        .map(|_| Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(vec![b'x'; 1 << 20])));
    axum::body::Body::from_stream(futures::stream::iter(chunks))
}

async fn start(limits: Limits) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(400)).await;
                "slow"
            }),
        )
        .route("/big", get(|| async { big_stream() }))
        .route(
            "/echo",
            axum::routing::post(|body: String| async move { body }),
        );
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(serve(listener, app, limits, None, async {
        let _ = stopped.await;
    }));
    Server {
        addr,
        stop: Some(stop),
        done,
    }
}

fn limits(max: usize, header_ms: u64, idle_ms: u64) -> Limits {
    Limits {
        max_connections: max,
        header_timeout: Duration::from_millis(header_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        shutdown_grace: Duration::from_secs(5),
    }
}

/// Reads one response with a Content-Length body; its status line and body.
async fn response(s: &mut TcpStream) -> (String, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("a response within 10 s")
            .expect("read");
        assert!(
            n > 0,
            "closed before a response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap_or(0))
                })
                .unwrap_or(0);
            if body.len() >= len {
                let status = head.lines().next().unwrap_or_default().to_string();
                return (status, body.to_string());
            }
        }
    }
}

/// Waits for the server to close `s`; how long that took from `since`.
async fn closed_after(s: &mut TcpStream, since: Instant) -> Duration {
    let mut byte = [0u8; 1];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return since.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the server kept the connection open for 10 s"),
        }
    }
}

fn assert_near(took: Duration, expected: Duration, what: &str) {
    assert!(
        took >= expected && took < expected + Duration::from_millis(700),
        "{what}: closed after {took:?}, expected {expected:?}"
    );
}

#[tokio::test]
async fn silent_slow_and_idle_connections_are_closed_on_time() {
    let server = start(limits(16, 300, 900)).await;
    let t0 = Instant::now();
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    let mut slow = TcpStream::connect(server.addr).await.expect("connect");
    let mut kept = TcpStream::connect(server.addr).await.expect("connect");
    kept.write_all(GET).await.expect("send");
    assert_eq!(response(&mut kept).await.1, "hello");
    let answered = Instant::now();
    let dribble = tokio::spawn(async move {
        for b in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ".iter().cycle() {
            if slow.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        t0.elapsed()
    });
    assert_near(
        closed_after(&mut silent, t0).await,
        Duration::from_millis(300),
        "silent",
    );
    let slow_took = dribble.await.expect("dribble");
    assert!(
        slow_took < Duration::from_millis(300 + 700),
        "slowloris closed after {slow_took:?}"
    );
    // A kept-alive connection waits the idle timeout for its next request, not the header's.
    assert_near(
        closed_after(&mut kept, answered).await,
        Duration::from_millis(900),
        "idle",
    );
    // A request's head, once its first byte is in, is due within the header timeout.
    let mut late = TcpStream::connect(server.addr).await.expect("connect");
    late.write_all(GET).await.expect("send");
    response(&mut late).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    late.write_all(b"GET / HT").await.expect("send");
    let started = Instant::now();
    assert_near(
        closed_after(&mut late, started).await,
        Duration::from_millis(300),
        "partial head",
    );
    drop(server.stop);
}

#[tokio::test]
async fn a_full_listener_serves_a_new_client_by_closing_the_connection_waiting_longest() {
    let server = start(limits(8, 10_000, 10_000)).await;
    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.push(TcpStream::connect(server.addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Instant::now();
    let mut client = TcpStream::connect(server.addr).await.expect("connect");
    client.write_all(GET).await.expect("send");
    let (status, body) = response(&mut client).await;
    let took = asked.elapsed();
    assert!(status.contains("200") && body == "hello", "{status} {body}");
    assert!(
        took < Duration::from_secs(1),
        "served after {took:?} with the flood held"
    );
    // At most `max` connections stayed open: the oldest were closed to make room.
    let mut open = 0;
    for s in &mut flood {
        let mut byte = [0u8; 1];
        if tokio::time::timeout(Duration::from_millis(20), s.read(&mut byte))
            .await
            .is_err()
        {
            open += 1;
        }
    }
    assert!(
        open <= 7,
        "{open} flood connections still open beside the client"
    );
    drop(server.stop);
}

#[tokio::test]
async fn shutdown_finishes_requests_in_flight_and_closes_idle_connections_at_once() {
    let mut server = start(limits(16, 10_000, 10_000)).await;
    let mut idle = TcpStream::connect(server.addr).await.expect("connect");
    idle.write_all(GET).await.expect("send");
    response(&mut idle).await;
    let mut busy = TcpStream::connect(server.addr).await.expect("connect");
    busy.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = Instant::now();
    let _ = server.stop.take().map(|s| s.send(()));
    let idle_took = closed_after(&mut idle, stopping).await;
    assert!(
        idle_took < Duration::from_millis(200),
        "idle connection closed after {idle_took:?}"
    );
    let (status, body) = response(&mut busy).await;
    assert!(status.contains("200") && body == "slow", "{status} {body}");
    tokio::time::timeout(Duration::from_secs(5), server.done)
        .await
        .expect("serve returns once drained")
        .expect("join");
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "the listener is closed"
    );
}

#[tokio::test]
async fn a_stalled_body_fails_its_request_and_an_unread_response_is_cut() {
    let server = start(limits(16, 300, 600)).await;
    let mut upload = TcpStream::connect(server.addr).await.expect("connect");
    upload
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten b")
        .await
        .expect("send");
    let sent = Instant::now();
    let (status, _) = response(&mut upload).await;
    assert!(status.contains("400"), "{status}");
    assert_near(sent.elapsed(), Duration::from_millis(300), "stalled body");

    let mut reader = TcpStream::connect(server.addr).await.expect("connect");
    reader
        .write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(600 + 1500)).await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut got)).await;
    assert!(
        got.len() < BIG,
        "a response nobody read for the idle timeout was sent whole ({} bytes)",
        got.len()
    );
    drop(server.stop);
}
