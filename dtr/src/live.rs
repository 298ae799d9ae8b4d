//! Live output: while the plugin runs, its stdout and stderr so far are copied to the task
//! about once a second (only when they grew, the last `LIVE_TAIL` bytes of each), so a
//! console or `disbatch stdout --follow` can show them. The spool files stay the output;
//! the result's write replaces the copy with the output itself.

use std::io::SeekFrom;
use std::path::Path;
use std::time::Duration;

use bson::oid::ObjectId;
use disbatch_model::output::MAX_DOCUMENT_SIZE;
use disbatch_model::wire::relay::LiveCopy;
use disbatch_store::{LiveOutput, LiveStream, LiveWrite, LIVE_TAIL};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::connection::LazyStore;
use crate::node_link::LiveRelay;
use crate::spool::{open_read, SpoolPaths};

/// How often the spool files are looked at: the live view runs at most this far behind
/// (plus one write), and a plugin printing continuously costs one write per interval.
pub const LIVE_EVERY: Duration = Duration::from_secs(1);

/// Room left for the copy's own fields besides the two tails.
const COPY_OVERHEAD: u64 = 1024;

/// Whether a task document of `doc_len` bytes has room for a live copy; one that has not
/// is never given one (the server would refuse it anyway).
pub fn has_room(doc_len: u64) -> bool {
    doc_len + 2 * LIVE_TAIL + COPY_OVERHEAD <= MAX_DOCUMENT_SIZE
}

/// Copies the output to the task every `LIVE_EVERY` until the task is no longer this
/// attempt's or the server refuses the copy; the caller stops it when the plugin ends.
/// With `relay` the copies go to the node, which is connected already: this runner connects
/// for them only if the node stops listening.
pub async fn keep_live(
    store: LazyStore,
    mut relay: Option<LiveRelay>,
    task: ObjectId,
    attempt: ObjectId,
    paths: SpoolPaths,
) {
    let mut tick = tokio::time::interval(LIVE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is at once; nothing is written yet
    let mut copy = LiveOutput {
        attempt,
        stdout: LiveStream::default(),
        stderr: LiveStream::default(),
    };
    // The lengths the task's copy shows; None when unknown.
    let mut written = Some((0, 0));
    loop {
        tick.tick().await;
        if relay.as_ref().is_some_and(LiveRelay::is_closed) {
            // The node went away after taking the last copy, which it may never have written:
            // from now on this runner writes the copies, the next one even if nothing grew.
            tracing::debug!(task = %task, "the node stopped taking live output; writing it here");
            relay = None;
            written = None;
        }
        let lens = (file_len(&paths.stdout).await, file_len(&paths.stderr).await);
        if written == Some(lens) {
            continue;
        }
        if written.is_none_or(|w| w.0 != lens.0) {
            if let Some(s) = read_tail(&paths.stdout).await {
                copy.stdout = s;
            }
        }
        if written.is_none_or(|w| w.1 != lens.1) {
            if let Some(s) = read_tail(&paths.stderr).await {
                copy.stderr = s;
            }
        }
        if let Some(r) = &relay {
            let sent = r.send(&LiveCopy {
                task,
                output: copy.clone(),
            });
            if sent {
                written = Some(lens);
                continue;
            }
            tracing::debug!(task = %task, "the node stopped taking live output; writing it here");
            relay = None;
        }
        let wrote = match store.get().await {
            Ok(db) => db.results().write_live_output(task, &copy).await,
            Err(e) => Err(e),
        };
        match wrote {
            Ok(LiveWrite::Written) => written = Some(lens),
            // The lease keeper learns the same and stops the plugin.
            Ok(LiveWrite::NotOurs) => return,
            Ok(LiveWrite::TooLarge) => {
                tracing::warn!(task = %task, "the task document has no room for live output; none is written");
                return;
            }
            // Next time: the output is stored at the end whatever becomes of its copies.
            Err(e) => tracing::debug!(task = %task, error = %e, "could not write live output"),
        }
    }
}

async fn file_len(path: &Path) -> u64 {
    match open_read(path).await {
        Ok(f) => f.metadata().await.map_or(0, |m| m.len()),
        Err(_) => 0,
    }
}

/// The last `LIVE_TAIL` bytes of a spool file, on character boundaries.
async fn read_tail(path: &Path) -> Option<LiveStream> {
    let mut file = open_read(path).await.ok()?;
    let len = file.metadata().await.ok()?.len();
    let from = len.saturating_sub(LIVE_TAIL);
    file.seek(SeekFrom::Start(from)).await.ok()?;
    let mut bytes = Vec::with_capacity((len - from) as usize);
    file.take(len - from).read_to_end(&mut bytes).await.ok()?;
    Some(tail_text(&bytes, from))
}

/// `bytes`, which start at byte `from` of a stream, as text: continuation bytes at the start
/// (a character cut by the tail) are left out, and so is a character not yet complete at the
/// end (the plugin is still writing it). Other invalid bytes become U+FFFD, as in the result.
pub fn tail_text(bytes: &[u8], from: u64) -> LiveStream {
    let mut start = 0;
    if from > 0 {
        while start < bytes.len().min(3) && (bytes[start] & 0xC0) == 0x80 {
            start += 1;
        }
    }
    let mut end = bytes.len();
    // The last lead byte within three of the end, and whether its character is whole.
    for back in 1..=3.min(end - start) {
        let b = bytes[end - back];
        let want = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            0x80..=0xBF => continue,
            _ => break,
        };
        if want > back {
            end -= back;
        }
        break;
    }
    // Each invalid byte becomes a 3-byte U+FFFD: the text may outgrow the tail that was read,
    // and a node refuses a copy over `LIVE_TAIL`. Whole characters are dropped from the front
    // until it fits, so the copy still shows the newest output.
    let mut text = String::from_utf8_lossy(&bytes[start..end]);
    while text.len() as u64 > LIVE_TAIL {
        let excess = text.len() - LIVE_TAIL as usize;
        // Each byte left out shortens the text by one to three bytes.
        start = (start + excess.div_ceil(3)).min(end);
        // Not into the middle of a character: its rest would show as U+FFFDs.
        let mut skipped = 0;
        while start < end && skipped < 3 && (bytes[start] & 0xC0) == 0x80 {
            start += 1;
            skipped += 1;
        }
        text = String::from_utf8_lossy(&bytes[start..end]);
    }
    LiveStream {
        text: text.into_owned(),
        from: from + start as u64,
        bytes: from + end as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_keeps_to_whole_characters() {
        let s = tail_text("héllo\n".as_bytes(), 0);
        assert_eq!((s.text.as_str(), s.from, s.bytes), ("héllo\n", 0, 7));
        // Cut inside "é" at the start: its second byte is left out.
        let s = tail_text(&"héllo".as_bytes()[2..], 2);
        assert_eq!((s.text.as_str(), s.from, s.bytes), ("llo", 3, 6));
        // "€" (3 bytes) half written: it waits for the next copy.
        let mut b = b"ab".to_vec();
        b.extend_from_slice(&"€".as_bytes()[..2]);
        let s = tail_text(&b, 10);
        assert_eq!((s.text.as_str(), s.from, s.bytes), ("ab", 10, 12));
        // Whole at the end: kept.
        let s = tail_text("a€".as_bytes(), 0);
        assert_eq!((s.text.as_str(), s.bytes), ("a€", 4));
        // Invalid bytes are not held back forever.
        let s = tail_text(b"x\xff\xfe", 0);
        assert_eq!((s.text.as_str(), s.bytes), ("x\u{fffd}\u{fffd}", 3));
        assert_eq!(tail_text(b"", 0), LiveStream::default());
    }

    #[test]
    fn a_tail_of_invalid_bytes_stays_within_the_copy_limit_and_keeps_the_newest() {
        let tail = LIVE_TAIL as usize;
        // All invalid: each byte would become 3 bytes of U+FFFD.
        let mut bytes = vec![0xFF_u8; tail];
        bytes.extend_from_slice(b"newest");
        let s = tail_text(&bytes[bytes.len() - tail..], 1000);
        assert!(s.text.len() as u64 <= LIVE_TAIL, "{} bytes", s.text.len());
        assert!(
            s.text.len() as u64 > LIVE_TAIL - 3,
            "{} bytes",
            s.text.len()
        );
        assert!(s.text.ends_with("\u{fffd}newest"));
        let end = 1000 + tail as u64;
        assert_eq!(s.bytes, end);
        // `from..bytes` is exactly what the text shows.
        let shown = &bytes[bytes.len() - tail..][(s.from - 1000) as usize..];
        assert_eq!(String::from_utf8_lossy(shown), s.text);
        // Mixed with multi-byte characters: never cut inside one.
        let mut mixed = Vec::new();
        while mixed.len() < tail {
            mixed.extend_from_slice("é\u{ff}€".as_bytes());
            mixed.push(0xFE);
        }
        mixed.truncate(tail);
        let s = tail_text(&mixed, 5);
        assert!(s.text.len() as u64 <= LIVE_TAIL, "{} bytes", s.text.len());
        let shown = &mixed[(s.from - 5) as usize..(s.bytes - 5) as usize];
        assert_eq!(String::from_utf8_lossy(shown), s.text);
        assert!(
            !s.text.starts_with('\u{fffd}') || shown[0] == 0xFE,
            "{:?}",
            &shown[..4]
        );
    }

    #[test]
    fn a_full_document_gets_no_live_copy() {
        assert!(has_room(1024));
        assert!(!has_room(MAX_DOCUMENT_SIZE - LIVE_TAIL));
    }
}
