//! A TCP proxy in front of the test server that cuts every connection right after the server
//! has applied one chosen command: the command goes through, its reply never comes back, and
//! the client is cut off. So a test can stop a process between two writes it sends one after
//! the other, deterministically: the first is in the database, the second never left.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bson::Document;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::bench::proxy::HostUri;

const HEADER: usize = 16;
const OP_MSG: i32 = 2013;
/// Larger than any message a server accepts; a longer length means the stream is lost.
const MESSAGE_MAX: usize = 64 * 1024 * 1024;

/// What the proxy does once it has cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Forwards new connections again at once: the client reconnects, as after a network
    /// failure or a server restart.
    Reconnect,
    /// Closes every new connection until `release`: the client can send nothing more, so a
    /// test can kill it with its second write unsent.
    Hold,
}

type Matcher = Box<dyn Fn(&Document) -> bool + Send + Sync>;

struct Armed {
    matches: Matcher,
    after: After,
}

struct Shared {
    armed: Mutex<Option<Armed>>,
    holding: AtomicBool,
    /// The command that was cut after, once it was.
    cut_after: watch::Sender<Option<Document>>,
    /// Bumped to close every open connection.
    generation: watch::Sender<u64>,
}

/// The proxy; stops accepting and closes every connection when dropped. It runs on a runtime
/// of its own, so a test that blocks its own thread (`Den::start` waits for a ready node)
/// never stalls the connections of the node it waits for.
pub struct CuttingProxy {
    /// A URI for the test server through the proxy.
    pub uri: String,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl CuttingProxy {
    /// Proxies the server at `uri` (a single-host `mongodb://` URI), forwarding everything
    /// until `arm` is called.
    pub fn start(uri: &str) -> CuttingProxy {
        let parsed = HostUri::parse(uri).expect("a proxiable URI");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("proxy address");
        let upstream = parsed.host.clone();
        let shared = Arc::new(Shared {
            armed: Mutex::new(None),
            holding: AtomicBool::new(false),
            cut_after: watch::channel(None).0,
            generation: watch::channel(0).0,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("proxy runtime");
        let accepting = shared.clone();
        runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("proxy listener");
            while let Ok((client, _)) = listener.accept().await {
                if accepting.holding.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                let shared = accepting.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, shared).await;
                    }
                });
            }
        });
        CuttingProxy {
            uri: parsed.with_host(&addr.to_string()),
            shared,
            runtime: Some(runtime),
        }
    }

    /// Cuts once, after the first command (an OP_MSG body, with its document sequences
    /// added as arrays under their names) that `matches`.
    pub fn arm(&self, matches: impl Fn(&Document) -> bool + Send + Sync + 'static, after: After) {
        *self.shared.armed.lock().expect("lock") = Some(Armed {
            matches: Box::new(matches),
            after,
        });
    }

    /// Waits until the proxy has cut, and returns the command the server applied just before.
    pub async fn wait_cut(&self) -> Document {
        let mut rx = self.shared.cut_after.subscribe();
        let cut = rx
            .wait_for(Option::is_some)
            .await
            .expect("the proxy is alive");
        cut.clone().expect("waited for it")
    }

    /// Forwards new connections again after a cut with `After::Hold`.
    pub fn release(&self) {
        self.shared.holding.store(false, Ordering::SeqCst);
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.shared.generation.send_modify(|g| *g += 1);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The next whole wire message, or None at the end of the stream.
async fn read_message(from: &mut (impl AsyncRead + Unpin)) -> Option<Vec<u8>> {
    let mut header = [0u8; HEADER];
    from.read_exact(&mut header).await.ok()?;
    let len = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let len = usize::try_from(len)
        .ok()
        .filter(|l| (HEADER..=MESSAGE_MAX).contains(l))?;
    let mut message = header.to_vec();
    message.resize(len, 0);
    from.read_exact(&mut message[HEADER..]).await.ok()?;
    Some(message)
}

fn i32_at(m: &[u8], at: usize) -> i32 {
    m.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, i32::from_le_bytes)
}

/// An OP_MSG's command: its body, with each document sequence added as an array.
fn command_of(message: &[u8]) -> Option<Document> {
    if i32_at(message, 12) != OP_MSG {
        return None;
    }
    let mut at = HEADER + 4;
    let mut body: Option<Document> = None;
    let mut sequences: Vec<(String, Vec<bson::Bson>)> = Vec::new();
    while at < message.len() {
        match message[at] {
            0 => {
                let len = usize::try_from(i32_at(message, at + 1)).ok()?;
                let doc = Document::from_reader(message.get(at + 1..at + 1 + len)?).ok()?;
                body = Some(doc);
                at += 1 + len;
            }
            1 => {
                let size = usize::try_from(i32_at(message, at + 1)).ok()?;
                let section = message.get(at + 5..at + 1 + size)?;
                let nul = section.iter().position(|b| *b == 0)?;
                let name = std::str::from_utf8(&section[..nul]).ok()?.to_string();
                let mut docs = Vec::new();
                let mut rest = &section[nul + 1..];
                while rest.len() >= 4 {
                    let len = usize::try_from(i32_at(rest, 0)).ok()?;
                    docs.push(Document::from_reader(rest.get(..len)?).ok()?.into());
                    rest = &rest[len..];
                }
                sequences.push((name, docs));
                at += 1 + size;
            }
            // The optional checksum, or something this parser does not know: stop here.
            _ => break,
        }
    }
    let mut body = body?;
    for (name, docs) in sequences {
        body.insert(name, docs);
    }
    Some(body)
}

async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut generation = shared.generation.subscribe();
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    // The request id of the command to cut after, once this connection has sent it.
    let (cut_on_reply, mut reply_awaited) = watch::channel::<Option<(i32, Document)>>(None);
    let up = async {
        while let Some(message) = read_message(&mut client_rd).await {
            let hit = {
                let mut armed = shared.armed.lock().expect("lock");
                let hit = armed
                    .as_ref()
                    .is_some_and(|a| command_of(&message).is_some_and(|c| (a.matches)(&c)));
                if hit {
                    armed.take()
                } else {
                    None
                }
            };
            if let Some(a) = hit {
                if a.after == After::Hold {
                    shared.holding.store(true, Ordering::SeqCst);
                }
                let command = command_of(&message).unwrap_or_default();
                let _ = cut_on_reply.send(Some((i32_at(&message, 4), command)));
            }
            if server_wr.write_all(&message).await.is_err() {
                break;
            }
        }
    };
    let down = async {
        while let Some(message) = read_message(&mut server_rd).await {
            let awaited = reply_awaited.borrow_and_update().clone();
            if let Some((request, command)) = awaited {
                if i32_at(&message, 8) == request {
                    // Applied by the server; its client never hears of it.
                    shared.cut_after.send_replace(Some(command));
                    shared.generation.send_modify(|g| *g += 1);
                    return;
                }
            }
            if client_wr.write_all(&message).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = generation.changed() => {}
    }
    // Dropping both halves of both sockets closes the connection on each side.
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn a_command_is_read_with_its_document_sequences() {
        let body = bson::to_vec(&doc! {"update": "tasks", "$db": "d"}).expect("bson");
        let stmt = bson::to_vec(&doc! {"q": {"_id": 1}, "u": {"$set": {"a": 1}}}).expect("bson");
        let mut seq = Vec::new();
        seq.extend_from_slice(b"updates\0");
        seq.extend_from_slice(&stmt);
        let mut m = vec![0u8; HEADER];
        m[12..16].copy_from_slice(&OP_MSG.to_le_bytes());
        m.extend_from_slice(&0u32.to_le_bytes());
        m.push(0);
        m.extend_from_slice(&body);
        m.push(1);
        m.extend_from_slice(&((seq.len() + 4) as i32).to_le_bytes());
        m.extend_from_slice(&seq);
        let len = m.len() as i32;
        m[0..4].copy_from_slice(&len.to_le_bytes());
        let c = command_of(&m).expect("parsed");
        assert_eq!(c.get_str("update").ok(), Some("tasks"));
        let updates = c.get_array("updates").expect("sequence");
        assert_eq!(
            updates[0]
                .as_document()
                .and_then(|u| u.get_document("q").ok()),
            Some(&doc! {"_id": 1})
        );
    }
}
