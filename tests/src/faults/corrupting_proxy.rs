//! A TCP proxy in front of the test server that corrupts one marker in what the server sends
//! back: the marker's first byte becomes 0xFF (invalid UTF-8, same length, so framing holds),
//! which makes a document no BSON reader can decode. The server itself refuses such bytes, so
//! this is how tests meet documents a mongod written to by older tools may hand out.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::bench::proxy::HostUri;

/// Marks text to be corrupted on the way back from the server.
pub const MARKER: &str = "CORRUPT~ME";

/// The proxy; stops accepting when dropped.
pub struct CorruptingProxy {
    /// A URI for the test server through the proxy.
    pub uri: String,
    accept: JoinHandle<()>,
}

impl CorruptingProxy {
    /// Proxies the server at `uri` (a single-host `mongodb://` URI).
    pub async fn start(uri: &str) -> CorruptingProxy {
        let parsed = HostUri::parse(uri).expect("a proxiable URI");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let upstream = parsed.host.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server).await;
                    }
                });
            }
        });
        CorruptingProxy {
            uri: parsed.with_host(&addr.to_string()),
            accept,
        }
    }
}

impl Drop for CorruptingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn relay(client: TcpStream, server: TcpStream) {
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut client_rd, &mut server_wr).await;
        let _ = server_wr.shutdown().await;
    };
    let down = async {
        // Whole wire messages (each starts with its length), so a marker is never split
        // between two reads and nothing is held back once a reply is complete.
        let mut pending: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            while pending.len() >= 4 {
                let len = i32::from_le_bytes([pending[0], pending[1], pending[2], pending[3]]);
                let len = usize::try_from(len).unwrap_or(0).max(4);
                if pending.len() < len {
                    break;
                }
                let mut message: Vec<u8> = pending.drain(..len).collect();
                corrupt(&mut message, MARKER.as_bytes());
                if client_wr.write_all(&message).await.is_err() {
                    return;
                }
            }
        }
        let _ = client_wr.write_all(&pending).await;
        let _ = client_wr.shutdown().await;
    };
    tokio::join!(up, down);
}

/// Replaces the first byte of every whole marker in `bytes` with 0xFF.
fn corrupt(bytes: &mut [u8], marker: &[u8]) {
    let mut i = 0;
    while i + marker.len() <= bytes.len() {
        if &bytes[i..i + marker.len()] == marker {
            bytes[i] = 0xff;
            i += marker.len();
        } else {
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_marker_is_corrupted_in_place() {
        let mut b = format!("a{MARKER}b{MARKER}").into_bytes();
        let len = b.len();
        corrupt(&mut b, MARKER.as_bytes());
        assert_eq!(b.len(), len);
        assert_eq!(b.iter().filter(|c| **c == 0xff).count(), 2);
        assert!(String::from_utf8(b).is_err());
    }
}
