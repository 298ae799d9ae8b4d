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
