//! Stored text made safe to show (names, node names, params): control, bidi and invisible
//! characters as visible escapes, absurdly long text cut with a marker.
//!
//! Names reach the database past any check (ops, older versions), so whatever prints them —
//! the CLI, Prometheus labels, HTML — escapes them here. The escapes are for reading only:
//! backslashes are not doubled, so `a\u{1b}` typed literally looks the same as an escaped
//! ESC; JSON output (`--json`) keeps the exact value.

use std::borrow::Cow;
use std::fmt::Write;

/// Longest text shown whole in a table cell or a metric label.
pub const MAX_SHOWN_CHARS: usize = 256;

/// Characters a terminal or a browser acts on or hides rather than shows: C0 and C1 controls
/// and DEL (ESC starts terminal commands, NUL cuts C strings, line breaks split rows), bidi
/// embeddings, overrides, isolates and marks (U+202E shows text reversed), line and paragraph
/// separators, and invisible format characters (zero-width space, word joiner, BOM).
/// The zero-width (non-)joiners U+200C/U+200D are left alone: scripts and emoji need them.
pub fn is_hidden(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{ad}'
        | '\u{61c}'
        | '\u{180e}'
        | '\u{200b}'
        | '\u{200e}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}'
    )
}

/// `text` with every hidden character, and whitespace at either end (a name's trailing space
/// would otherwise be invisible), written as a `\u{1b}` escape.
pub fn escape(text: &str) -> Cow<'_, str> {
    escape_inner(text, false)
}

/// As [`escape`], but line feeds are kept for a format that escapes them itself (Prometheus
/// label values write `\n`).
pub fn escape_keeping_newlines(text: &str) -> Cow<'_, str> {
    escape_inner(text, true)
}

/// For a table cell or a message line: cut to [`MAX_SHOWN_CHARS`], then escaped.
pub fn shown(text: &str) -> Cow<'_, str> {
    match cut(text, MAX_SHOWN_CHARS) {
        Cow::Borrowed(t) => escape(t),
        Cow::Owned(t) => Cow::Owned(escape(&t).into_owned()),
    }
}

/// For a Prometheus label value: cut to [`MAX_SHOWN_CHARS`], then escaped except line feeds,
/// which the exposition format escapes. Distinct long names stay distinct labels: the marker
/// carries a hash of the whole text.
pub fn metric_label(text: &str) -> Cow<'_, str> {
    match cut(text, MAX_SHOWN_CHARS) {
        Cow::Borrowed(t) => escape_keeping_newlines(t),
        Cow::Owned(t) => Cow::Owned(escape_keeping_newlines(&t).into_owned()),
    }
}

/// `text` cut to `max_chars` characters, followed by `…[+N chars #hash]` when it was longer;
/// the hash (FNV-1a of the whole text) tells apart long texts with the same beginning.
pub fn cut(text: &str, max_chars: usize) -> Cow<'_, str> {
    let Some((end, _)) = text.char_indices().nth(max_chars) else {
        return Cow::Borrowed(text);
    };
    let rest = text[end..].chars().count();
    Cow::Owned(format!(
        "{}…[+{rest} chars #{:08x}]",
        &text[..end],
        fnv1a(text.as_bytes())
    ))
}

/// JSON text with every hidden character other than the whitespace JSON allows between
/// tokens written as a `\uXXXX` escape. In valid JSON such characters occur only inside
/// strings, where the escape means the same character: the value parses unchanged.
pub fn json_text(text: &str) -> Cow<'_, str> {
    if !text
        .chars()
        .any(|c| is_hidden(c) && !matches!(c, '\n' | '\t' | '\r'))
    {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_hidden(c) && !matches!(c, '\n' | '\t' | '\r') {
            // Hidden characters are all in the Basic Multilingual Plane: one \u escape each.
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn escape_inner(text: &str, keep_newlines: bool) -> Cow<'_, str> {
    let first = text
        .find(|c: char| !c.is_whitespace())
        .unwrap_or(text.len());
    let last = text.rfind(|c: char| !c.is_whitespace()).map_or(0, |i| {
        i + text[i..].chars().next().map_or(1, char::len_utf8)
    });
    let needs = |i: usize, c: char| {
        if keep_newlines && c == '\n' {
            return false;
        }
        is_hidden(c) || (c.is_whitespace() && (i < first || i >= last))
    };
    if !text.char_indices().any(|(i, c)| needs(i, c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for (i, c) in text.char_indices() {
        if needs(i, c) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash: u32, b| {
        (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_overrides_become_visible_escapes() {
        assert_eq!(escape("red\x1b[31m"), "red\\u{1b}[31m");
        assert_eq!(escape("nul\0x"), "nul\\u{0}x");
        assert_eq!(escape("two\nlines\r\ttab"), "two\\u{a}lines\\u{d}\\u{9}tab");
        assert_eq!(escape("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(escape("c1\u{9b}2J"), "c1\\u{9b}2J");
        assert_eq!(escape("del\u{7f}"), "del\\u{7f}");
        assert_eq!(
            escape("zw\u{200b}sp\u{2066}iso\u{feff}"),
            "zw\\u{200b}sp\\u{2066}iso\\u{feff}"
        );
    }

    #[test]
    fn whitespace_at_the_ends_is_shown_inside_is_kept() {
        assert_eq!(escape("trailing  "), "trailing\\u{20}\\u{20}");
        assert_eq!(escape(" lead in"), "\\u{20}lead in");
        assert_eq!(escape("nbsp\u{a0}"), "nbsp\\u{a0}");
        assert_eq!(escape("  "), "\\u{20}\\u{20}");
        assert_eq!(escape(""), "");
    }

    #[test]
    fn ordinary_text_is_borrowed_unchanged() {
        for text in [
            "demo",
            "été à Zürich",
            "a\\b\"c",
            "中文 名前",
            "👩\u{200d}💻",
            "a b",
        ] {
            assert!(matches!(escape(text), Cow::Borrowed(_)), "{text}");
            assert!(matches!(shown(text), Cow::Borrowed(_)), "{text}");
            assert!(matches!(json_text(text), Cow::Borrowed(_)), "{text}");
        }
    }

    #[test]
    fn labels_keep_line_feeds_for_the_format_to_escape() {
        assert_eq!(
            escape_keeping_newlines("two\nlines\x1b"),
            "two\nlines\\u{1b}"
        );
        assert_eq!(metric_label("q\"2\\\nx"), "q\"2\\\nx");
    }

    #[test]
    fn long_text_is_cut_with_a_marker_that_keeps_distinct_names_distinct() {
        let a = format!("{}a", "n".repeat(100_000));
        let b = format!("{}b", "n".repeat(100_000));
        let (la, lb) = (metric_label(&a), metric_label(&b));
        assert!(la.starts_with(&"n".repeat(MAX_SHOWN_CHARS)), "{la}");
        assert!(la.contains("…[+99745 chars #"), "{la}");
        assert!(la.chars().count() < MAX_SHOWN_CHARS + 40, "{la}");
        assert_ne!(la, lb);
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("été", 2).split('…').next(), Some("ét"));
        let esc = "\x1b".repeat(1000);
        assert!(shown(&esc).chars().count() < MAX_SHOWN_CHARS * 6 + 40);
    }

    #[test]
    fn json_text_escapes_inside_strings_and_still_parses_the_same() {
        let value = serde_json::json!({"name": "a\u{202e}b\u{7f}\u{85}", "n": 1});
        let text = serde_json::to_string_pretty(&value).expect("json");
        let safe = json_text(&text);
        assert!(!safe.chars().any(|c| is_hidden(c) && c != '\n'), "{safe}");
        assert!(safe.contains("a\\u202eb\\u007f\\u0085"), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).expect("still JSON");
        assert_eq!(back, value);
    }
}
