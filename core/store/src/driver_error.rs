//! Driver errors as one line an operator can read: the server's code and message, or what
//! failed on the way, without the driver's `Kind: …, labels: {…}, source: …` debug dump.

use mongodb::error::{ErrorKind, WriteFailure};

/// Longest description kept: a server-selection error lists every server it tried.
const MOST: usize = 600;

/// What went wrong, in one line.
pub fn describe(e: &mongodb::error::Error) -> String {
    let text = match e.kind.as_ref() {
        ErrorKind::Command(c) => server_said(c.code, Some(&c.code_name), &c.message),
        ErrorKind::Write(WriteFailure::WriteError(w)) => {
            server_said(w.code, w.code_name.as_deref(), &w.message)
        }
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => format!(
            "write concern not satisfied: {}",
            server_said(w.code, Some(&w.code_name), &w.message)
        ),
        ErrorKind::InsertMany(m) => {
            let first = m.write_errors.iter().flatten().next();
            match (first, &m.write_concern_error) {
                (Some(w), _) => {
                    let more = m
                        .write_errors
                        .as_ref()
                        .map_or(0, Vec::len)
                        .saturating_sub(1);
                    let said = server_said(w.code, w.code_name.as_deref(), &w.message);
                    match more {
                        0 => format!("document {} refused: {said}", w.index),
                        n => format!("document {} refused: {said} (and {n} more)", w.index),
                    }
                }
                (None, Some(w)) => format!(
                    "write concern not satisfied: {}",
                    server_said(w.code, Some(&w.code_name), &w.message)
                ),
                (None, None) => "insert failed".to_string(),
            }
        }
        ErrorKind::BulkWrite(_) => "bulk write failed".to_string(),
        ErrorKind::GridFs(g) => format!("GridFS: {g:?}"),
        ErrorKind::Io(io) => format!("I/O error: {io}"),
        ErrorKind::ServerSelection { message, .. } => server_selection(message),
        ErrorKind::Authentication { message, .. } => format!("authentication failed: {message}"),
        other => other.to_string(),
    };
    one_line(&text)
}

/// The driver's server-selection message embeds each server's error in its debug form; keep
/// the reason and, per server, its address and its error's own text.
fn server_selection(message: &str) -> String {
    let (reason, topology) = message.split_once(" Topology: ").unwrap_or((message, ""));
    let mut servers = Vec::new();
    let mut rest = topology;
    while let Some(at) = rest.find("Address: ") {
        rest = &rest[at + "Address: ".len()..];
        let address = rest.split([',', ' ']).next().unwrap_or("");
        let next = rest.find("Address: ").unwrap_or(rest.len());
        let this = &rest[..next];
        let error = this.find("Error: ").map(|e| {
            let text = &this[e + "Error: ".len()..];
            let text = text.strip_prefix("Kind: ").unwrap_or(text);
            text.split(", labels:")
                .next()
                .unwrap_or(text)
                .trim_end_matches([' ', '}', ']'])
        });
        servers.push(match error {
            Some(error) => format!("{address}: {error}"),
            None => address.to_string(),
        });
    }
    match servers.is_empty() {
        true => format!("no server reachable: {}", reason.trim()),
        false => format!(
            "no server reachable: {} ({})",
            reason.trim(),
            servers.join("; ")
        ),
    }
}

fn server_said(code: i32, name: Option<&str>, message: &str) -> String {
    match name.filter(|n| !n.is_empty()) {
        Some(name) => format!("{message} ({name}, code {code})"),
        None => format!("{message} (code {code})"),
    }
}

/// Newlines folded and the length bounded, so one error is one log line.
fn one_line(text: &str) -> String {
    let folded: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    match folded.char_indices().nth(MOST) {
        Some((cut, _)) => format!("{}…", &folded[..cut]),
        None => folded,
    }
}

/// The server does not know `bulkWrite` (before 8.0: CommandNotFound), or will not let this
/// user run it (Unauthorized): callers then do the same work with older commands.
pub fn bulk_write_missing(err: &mongodb::error::Error) -> bool {
    use mongodb::error::ErrorKind;
    matches!(err.kind.as_ref(), ErrorKind::Command(e) if matches!(e.code, 59 | 13 | 115))
}

/// E11000: the write would break a unique index.
pub fn is_duplicate_key(err: &mongodb::error::Error) -> bool {
    use mongodb::error::{ErrorKind, WriteFailure};
    match err.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(e)) => e.code == 11000,
        ErrorKind::Command(e) => e.code == 11000,
        ErrorKind::InsertMany(e) => e
            .write_errors
            .as_ref()
            .is_some_and(|errs| errs.iter().any(|e| e.code == 11000)),
        _ => false,
    }
}

/// The server answered and refused the request itself (a filter, operator, namespace or
/// document it will not take), as opposed to being unreachable, busy or failing over: asking
/// again will not help, and the caller's input (or the document it touches) is what is wrong.
/// Returns the server's reason, short and on one line.
pub fn refusal(err: &mongodb::error::Error) -> Option<String> {
    use mongodb::error::{ErrorKind, WriteFailure};
    // Unreachable servers, timeouts and closed pools are other kinds than these.
    if err.contains_label(mongodb::error::RETRYABLE_WRITE_ERROR)
        || err.contains_label(mongodb::error::TRANSIENT_TRANSACTION_ERROR)
    {
        return None;
    }
    let (code, message) = match err.kind.as_ref() {
        ErrorKind::Command(e) => (e.code, e.message.as_str()),
        ErrorKind::Write(WriteFailure::WriteError(e)) => (e.code, e.message.as_str()),
        ErrorKind::InvalidArgument { message, .. } => (0, message.as_str()),
        _ => return None,
    };
    // Unauthorized and failed logins are the deployment's doing, not the request's.
    if is_transient_code(code) || matches!(code, 11000 | 13 | 18) {
        return None;
    }
    Some(short_message(message, code))
}

/// The server's own message for an error it answered with (a command or write error),
/// short and on one line; None for errors it did not answer with.
pub fn server_message(err: &mongodb::error::Error) -> Option<String> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match err.kind.as_ref() {
        ErrorKind::Command(e) => Some(short_message(&e.message, e.code)),
        ErrorKind::Write(WriteFailure::WriteError(e)) => Some(short_message(&e.message, e.code)),
        ErrorKind::InsertMany(e) => e
            .write_errors
            .as_ref()
            .and_then(|errs| errs.first())
            .map(|e| short_message(&e.message, e.code)),
        _ => None,
    }
}

/// A command sent whole reports a write concern it could not meet (a `wtimeout` passed, too
/// few members) in its reply, not as an error: the writes were made on the primary but may not
/// survive a failover, which the operator must hear of.
pub fn warn_write_concern_error(reply: &bson::Document, context: &str) {
    if let Ok(e) = reply.get_document("writeConcernError") {
        let code = e.get_i32("code").unwrap_or(0);
        let message = short_message(e.get_str("errmsg").unwrap_or("no reason given"), code);
        tracing::warn!(context, "write concern not met: {message}");
    }
}

/// Why the database could not serve a request, in words fit for a client: no address, no
/// server reply dump (the log has those).
pub fn unavailable_reason(err: &mongodb::error::Error) -> &'static str {
    use mongodb::error::{ErrorKind, WriteFailure};
    match err.kind.as_ref() {
        ErrorKind::ServerSelection { .. } => "no database server answered in time",
        ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. } => {
            "the connection to the database failed"
        }
        ErrorKind::Authentication { .. } => "this server could not log in to the database",
        ErrorKind::Command(e) if matches!(e.code, 13 | 18) => {
            "the database refused this server's user"
        }
        ErrorKind::Command(e) if is_transient_code(e.code) => {
            "the database is busy or changing primary; try again"
        }
        ErrorKind::Write(WriteFailure::WriteConcernError(_)) => {
            "the database could not confirm the write; try again"
        }
        _ => "the database failed",
    }
}

/// Server error codes that say "not now" (a failover, a shutdown, a timeout, a conflict)
/// rather than "never": MongoDB's retryable and transient codes.
pub fn is_transient_code(code: i32) -> bool {
    matches!(
        code,
        6 | 7
            | 24
            | 46
            | 50
            | 63
            | 89
            | 91
            | 112
            | 133
            | 150
            | 189
            | 234
            | 251
            | 262
            | 9001
            | 10107
            | 11600
            | 11602
            | 13388
            | 13435
            | 13436
    )
}

/// A server message fit for a log line or an API answer: one line, at most 300 characters,
/// with its code.
pub fn short_message(message: &str, code: i32) -> String {
    let one_line: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect();
    let cut = if message.chars().count() > 300 {
        "…"
    } else {
        ""
    };
    format!("{}{cut} (code {code})", one_line.trim_end())
}

/// The server's E11000 text alone ("E11000 duplicate key error collection: … dup key: { … }"),
/// one line, as Disbatch's `MongoDB::DuplicateKeyError` stringifies: no context, no code
/// suffix, never the driver's debug form of the error.
pub fn duplicate_key_message(err: &mongodb::error::Error) -> Option<String> {
    use mongodb::error::{ErrorKind, WriteFailure};
    let message = match err.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(e)) if e.code == 11000 => e.message.as_str(),
        ErrorKind::Command(e) if e.code == 11000 => e.message.as_str(),
        ErrorKind::InsertMany(e) => e
            .write_errors
            .as_ref()
            .and_then(|errs| errs.iter().find(|e| e.code == 11000))
            .map(|e| e.message.as_str())?,
        _ => return None,
    };
    let one_line: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect();
    Some(one_line.trim().to_string()).filter(|m| !m.is_empty())
}

/// The server (10334) or the driver refused a document over 16 MiB.
pub fn is_document_too_large(err: &mongodb::error::Error) -> bool {
    use mongodb::error::{ErrorKind, WriteFailure};
    match err.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(e)) => e.code == 10334 || e.code == 17419,
        ErrorKind::Command(e) => e.code == 10334 || e.code == 17419 || e.code == 10003,
        ErrorKind::InvalidArgument { .. } | ErrorKind::BsonSerialization(_) => true,
        _ => {
            let text = err.to_string();
            text.contains("too large") || text.contains("exceeded maximum size")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_read_as_io_errors() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = mongodb::error::Error::from(io);
        let text = describe(&e);
        assert_eq!(text, "I/O error: refused");
        assert!(!text.contains("Kind:") && !text.contains("labels"));
    }

    #[test]
    fn server_selection_names_each_server_and_its_error() {
        let message = "Server selection timeout: No available servers. Topology: { Type: Unknown, Servers: [ { Address: 127.0.0.1:1, Type: Unknown, Error: Kind: I/O error: Connection refused (os error 111), labels: {\"RetryableError\"}, source: None, server response: None }, { Address: db2:27017, Type: Unknown } ] }";
        assert_eq!(
            server_selection(message),
            "no server reachable: Server selection timeout: No available servers. (127.0.0.1:1: I/O error: Connection refused (os error 111); db2:27017)"
        );
        assert_eq!(
            server_selection("Server selection timeout: x"),
            "no server reachable: Server selection timeout: x"
        );
    }

    #[test]
    fn long_and_multi_line_text_stays_one_bounded_line() {
        let long = format!("a\nb{}", "x".repeat(2000));
        let text = one_line(&long);
        assert!(!text.contains('\n'));
        assert_eq!(text.chars().count(), MOST + 1);
        assert_eq!(server_said(11000, Some(""), "dup"), "dup (code 11000)");
        assert_eq!(
            server_said(13, Some("Unauthorized"), "not allowed"),
            "not allowed (Unauthorized, code 13)"
        );
    }
}
