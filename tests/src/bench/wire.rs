//! An incremental parser of the client→server MongoDB wire stream: one `Request` per message,
//! named by its command, without buffering more of a message than its first bytes.

/// OP_MSG, the only op code current drivers send.
pub const OP_MSG: i32 = 2013;
/// Legacy OP_QUERY: old drivers' handshake and commands on `<db>.$cmd`.
pub const OP_QUERY: i32 = 2004;
pub const OP_COMPRESSED: i32 = 2012;

const HEADER: usize = 16;
/// How much of a message is kept for parsing: the header, the flags, the first section's
/// command name and collection, and a handshake's client metadata. The rest is skipped.
const PREFIX_MAX: usize = 4096;
/// Larger than any message a server accepts (48 MB); a longer length means the stream is not
/// the wire protocol (or we lost our place), so parsing stops instead of guessing.
const MESSAGE_MAX: usize = 64 * 1024 * 1024;

/// One client→server message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub length: usize,
    pub request_id: i32,
    pub response_to: i32,
    pub op_code: i32,
    /// The body's first key (`find`, `findAndModify`, `hello`…); for other op codes a label
    /// such as `OP_COMPRESSED`, or `?` when the prefix was not enough to read it.
    pub command: String,
    /// The first key's value when it is a string: the collection a command works on.
    pub collection: Option<String>,
    /// `client.application.name` of a handshake (`hello`/`isMaster` with client metadata).
    pub app_name: Option<String>,
}

/// Feed it the bytes a client sent, in whatever pieces they arrive.
#[derive(Debug, Default)]
pub struct WireParser {
    /// The current message's first bytes (up to PREFIX_MAX).
    prefix: Vec<u8>,
    /// The current message's length once its header is in, else 0.
    length: usize,
    /// Bytes of the current message received so far.
    received: usize,
    /// Set when a header made no sense: later bytes are counted but not parsed.
    broken: Option<String>,
}

impl WireParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Why parsing stopped, if it did.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Consumes `data`, calling `out` once per message completed by it.
    pub fn feed(&mut self, mut data: &[u8], out: &mut impl FnMut(Request)) {
        while !data.is_empty() && self.broken.is_none() {
            if self.length == 0 {
                let take = (HEADER - self.prefix.len()).min(data.len());
                self.prefix.extend_from_slice(&data[..take]);
                self.received += take;
                data = &data[take..];
                if self.prefix.len() < HEADER {
                    return;
                }
                let length = i32_at(&self.prefix, 0).unwrap_or(0);
                if length < HEADER as i32 || length as usize > MESSAGE_MAX {
                    self.broken = Some(format!("message length {length} is not plausible"));
                    return;
                }
                self.length = length as usize;
            }
            let keep = PREFIX_MAX
                .min(self.length)
                .saturating_sub(self.prefix.len());
            let want = (self.length - self.received).min(data.len());
            let kept = keep.min(want);
            self.prefix.extend_from_slice(&data[..kept]);
            self.received += want;
            data = &data[want..];
            if self.received == self.length {
                out(parse_request(&self.prefix, self.length));
                self.prefix.clear();
                self.length = 0;
                self.received = 0;
            }
        }
    }
}

fn i32_at(buf: &[u8], at: usize) -> Option<i32> {
    let bytes = buf.get(at..at.checked_add(4)?)?;
    Some(i32::from_le_bytes(bytes.try_into().ok()?))
}

/// A NUL-terminated string starting at `at`, and the offset just past its NUL.
fn cstr_at(buf: &[u8], at: usize) -> Option<(&str, usize)> {
    let rest = buf.get(at..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    let text = std::str::from_utf8(&rest[..end]).ok()?;
    Some((text, at + end + 1))
}

fn parse_request(prefix: &[u8], length: usize) -> Request {
    let op_code = i32_at(prefix, 12).unwrap_or(0);
    let mut request = Request {
        length,
        request_id: i32_at(prefix, 4).unwrap_or(0),
        response_to: i32_at(prefix, 8).unwrap_or(0),
        op_code,
        command: "?".to_string(),
        collection: None,
        app_name: None,
    };
    let body = match op_code {
        OP_MSG => msg_body_start(prefix),
        OP_QUERY => query_body_start(prefix, &mut request),
        OP_COMPRESSED => {
            request.command = "OP_COMPRESSED".into();
            None
        }
        other => {
            request.command = format!("op{other}");
            None
        }
    };
    if let Some(at) = body {
        read_body(prefix, at, &mut request);
    }
    request
}

/// OP_MSG: flags, then sections; the command is the body (kind 0) section's document.
fn msg_body_start(prefix: &[u8]) -> Option<usize> {
    let mut at = HEADER + 4;
    loop {
        match *prefix.get(at)? {
            0 => return Some(at + 1),
            // A document sequence: int32 size (which counts itself), then its documents.
            1 => {
                let size = i32_at(prefix, at + 1)?;
                at = at
                    .checked_add(1)?
                    .checked_add(usize::try_from(size).ok()?)?;
            }
            _ => return None,
        }
    }
}

/// OP_QUERY: flags, collection name, skip, return, then the query document.
fn query_body_start(prefix: &[u8], request: &mut Request) -> Option<usize> {
    let (namespace, after) = cstr_at(prefix, HEADER + 4)?;
    if !namespace.ends_with(".$cmd") {
        // A legacy query, not a command: its body's first key is a filter field.
        request.command = "OP_QUERY".into();
        request.collection = namespace.split_once('.').map(|(_, c)| c.to_string());
        return None;
    }
    Some(after + 8)
}

/// Reads the command name (the document's first key), a string value after it, and the
/// handshake's application name when the whole document is in the prefix.
fn read_body(prefix: &[u8], doc: usize, request: &mut Request) {
    let Some(&kind) = prefix.get(doc + 4) else {
        return;
    };
    let Some((name, value)) = cstr_at(prefix, doc + 5) else {
        return;
    };
    if kind == 0x02 {
        if let Some(len) = i32_at(prefix, value).and_then(|n| usize::try_from(n).ok()) {
            let text = prefix.get(value + 4..(value + 4 + len).saturating_sub(1));
            request.collection = text
                .and_then(|t| std::str::from_utf8(t).ok())
                .map(str::to_string);
        }
    }
    if is_monitoring_command(name) {
        request.app_name = app_name(prefix, doc);
    }
    request.command = name.to_string();
}

fn app_name(prefix: &[u8], doc: usize) -> Option<String> {
    let len = usize::try_from(i32_at(prefix, doc)?).ok()?;
    let bytes = prefix.get(doc..doc.checked_add(len)?)?;
    let document = bson::Document::from_reader(bytes).ok()?;
    let client = document.get_document("client").ok()?;
    let app = client.get_document("application").ok()?;
    app.get_str("name").ok().map(str::to_string)
}

/// The commands a driver's server monitors send: on a connection that sends nothing else they
/// are monitoring, not work (on a pooled connection, `hello` is its handshake).
pub fn is_monitoring_command(name: &str) -> bool {
    matches!(name, "hello" | "isMaster" | "ismaster" | "ping")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Document};

    fn frame(op_code: i32, request_id: i32, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((HEADER + body.len()) as i32).to_le_bytes());
        out.extend_from_slice(&request_id.to_le_bytes());
        out.extend_from_slice(&0i32.to_le_bytes());
        out.extend_from_slice(&op_code.to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    fn bson_bytes(d: &Document) -> Vec<u8> {
        let mut out = Vec::new();
        d.to_writer(&mut out).expect("serialize");
        out
    }

    fn op_msg(request_id: i32, command: &Document) -> Vec<u8> {
        let mut body = 0u32.to_le_bytes().to_vec();
        body.push(0);
        body.extend(bson_bytes(command));
        frame(OP_MSG, request_id, &body)
    }

    fn parse_all(stream: &[u8], piece: usize) -> Vec<Request> {
        let mut parser = WireParser::new();
        let mut got = Vec::new();
        for chunk in stream.chunks(piece.max(1)) {
            parser.feed(chunk, &mut |r| got.push(r));
        }
        assert!(parser.broken().is_none(), "{:?}", parser.broken());
        got
    }

    #[test]
    fn names_commands_and_collections_whatever_the_read_sizes() {
        let mut stream = op_msg(1, &doc! {"findAndModify": "tasks", "query": {"status": -2}});
        stream.extend(op_msg(2, &doc! {"hello": 1, "$db": "admin"}));
        stream.extend(op_msg(3, &doc! {"insert": "attempts", "documents": []}));
        for piece in [1, 2, 3, 7, 16, 17, 64, stream.len()] {
            let got = parse_all(&stream, piece);
            let names: Vec<_> = got.iter().map(|r| r.command.as_str()).collect();
            assert_eq!(
                names,
                ["findAndModify", "hello", "insert"],
                "pieces of {piece}"
            );
            assert_eq!(got[0].collection.as_deref(), Some("tasks"));
            assert_eq!(got[1].collection, None);
            assert_eq!(got[2].collection.as_deref(), Some("attempts"));
            assert_eq!(
                got.iter().map(|r| r.request_id).collect::<Vec<_>>(),
                [1, 2, 3]
            );
            assert!(got.iter().all(|r| r.op_code == OP_MSG));
        }
    }

    #[test]
    fn a_large_message_is_skipped_not_buffered_and_the_next_one_is_read() {
        let big = "x".repeat(3 * PREFIX_MAX);
        let mut stream = op_msg(7, &doc! {"insert": "tasks", "documents": [{"p": big}]});
        let big_len = stream.len();
        stream.extend(op_msg(8, &doc! {"ping": 1}));
        let mut parser = WireParser::new();
        let mut got = Vec::new();
        for chunk in stream.chunks(1000) {
            parser.feed(chunk, &mut |r| got.push(r));
            assert!(parser.prefix.len() <= PREFIX_MAX);
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].command, "insert");
        assert_eq!(got[0].length, big_len);
        assert_eq!(got[1].command, "ping");
    }

    #[test]
    fn a_document_sequence_before_the_body_is_skipped() {
        let mut body = 0u32.to_le_bytes().to_vec();
        let seq_doc = bson_bytes(&doc! {"a": 1});
        body.push(1);
        let ident = b"documents\0";
        body.extend_from_slice(&((4 + ident.len() + seq_doc.len()) as i32).to_le_bytes());
        body.extend_from_slice(ident);
        body.extend(&seq_doc);
        body.push(0);
        body.extend(bson_bytes(&doc! {"insert": "tasks"}));
        let got = parse_all(&frame(OP_MSG, 5, &body), 5);
        assert_eq!(got[0].command, "insert");
        assert_eq!(got[0].collection.as_deref(), Some("tasks"));
    }

    #[test]
    fn handshake_metadata_gives_the_application_name() {
        let hello = doc! {"hello": 1, "client": {"application": {"name": "disbatch-rs/disbatchd"},
        "driver": {"name": "mongo-rust-driver"}}, "$db": "admin"};
        let got = parse_all(&op_msg(9, &hello), 3);
        assert_eq!(got[0].app_name.as_deref(), Some("disbatch-rs/disbatchd"));
        let find = op_msg(
            10,
            &doc! {"find": "x", "client": {"application": {"name": "n"}}},
        );
        assert_eq!(parse_all(&find, 4)[0].app_name, None);
    }

    #[test]
    fn legacy_query_commands_and_other_op_codes() {
        let mut body = 0i32.to_le_bytes().to_vec();
        body.extend_from_slice(b"admin.$cmd\0");
        body.extend_from_slice(&0i32.to_le_bytes());
        body.extend_from_slice(&(-1i32).to_le_bytes());
        body.extend(bson_bytes(&doc! {"isMaster": 1}));
        let mut stream = frame(OP_QUERY, 1, &body);
        stream.extend(frame(OP_COMPRESSED, 2, &[0; 9]));
        stream.extend(frame(2010, 3, &[]));
        let got = parse_all(&stream, 6);
        let names: Vec<_> = got.iter().map(|r| r.command.as_str()).collect();
        assert_eq!(names, ["isMaster", "OP_COMPRESSED", "op2010"]);
    }

    #[test]
    fn a_nonsense_length_stops_parsing_without_panicking() {
        let mut parser = WireParser::new();
        let mut n = 0;
        parser.feed(
            &[3, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
            &mut |_| n += 1,
        );
        assert_eq!(n, 0);
        assert!(parser.broken().is_some());
        parser.feed(&op_msg(1, &doc! {"ping": 1}), &mut |_| n += 1);
        assert_eq!(n, 0, "a broken stream stays unparsed");
    }

    #[test]
    fn truncated_bodies_give_a_question_mark_not_a_panic() {
        // A message whose declared document runs past its end.
        let mut body = 0u32.to_le_bytes().to_vec();
        body.extend_from_slice(&[0, 200, 0, 0, 0, 2, b'f']);
        let got = parse_all(&frame(OP_MSG, 1, &body), 2);
        assert_eq!(got[0].command, "?");
        let empty = parse_all(&frame(OP_MSG, 2, &[]), 1);
        assert_eq!(empty[0].command, "?");
    }
}
