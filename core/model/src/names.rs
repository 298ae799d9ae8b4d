//! Which names may be stored (queues, nodes): printable text a terminal, a table, a log line
//! and a Prometheus label all show as written, with no control or direction-changing
//! characters, no surrounding whitespace, and a sane length.

/// The longest name accepted, in characters.
pub const MAX_NAME_CHARS: usize = 256;

/// Ok when `name` may be stored as a `what` name (e.g. "queue name"); Err says why not.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(format!(
            "{what} is {chars} characters long; at most {MAX_NAME_CHARS} are allowed"
        ));
    }
    check_characters(what, name)
}

/// Ok when `name` (of any length) holds no control, text-direction or invisible character
/// and no whitespace at either end: what every stored name must be, whatever its length rule.
pub fn check_characters(what: &str, name: &str) -> Result<(), String> {
    if let Some((i, c)) = name.char_indices().find(|(_, c)| is_unsafe(*c)) {
        return Err(format!(
            "{what} {:?} contains {} at byte {i}: control, text-direction and invisible characters are not allowed",
            shown(name),
            describe(c)
        ));
    }
    if name.trim() != name {
        return Err(format!(
            "{what} {:?} starts or ends with whitespace",
            shown(name)
        ));
    }
    Ok(())
}

/// Control characters (C0, DEL, C1), the marks and overrides that reorder how text is shown,
/// and the characters that show as nothing or as a plain space (format characters such as
/// U+200B zero-width space, fillers, variation selectors, spaces other than U+0020): with
/// any of them a name could look like another (`demo\u{200b}` beside `demo`).
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || is_format(c) || is_invisible(c) || (c.is_whitespace() && c != ' ')
}

/// Unicode's format characters (general category Cf), bidi controls among them.
fn is_format(c: char) -> bool {
    matches!(c,
        '\u{00ad}' | '\u{0600}'..='\u{0605}' | '\u{061c}' | '\u{06dd}' | '\u{070f}'
        | '\u{0890}'..='\u{0891}' | '\u{08e2}' | '\u{180e}' | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206f}'
        | '\u{feff}' | '\u{fff9}'..='\u{fffb}' | '\u{110bd}' | '\u{110cd}'
        | '\u{13430}'..='\u{1343f}' | '\u{1bca0}'..='\u{1bca3}' | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0001}' | '\u{e0020}'..='\u{e007f}')
}

/// Characters that are not format characters but still show as nothing: the combining
/// grapheme joiner, Hangul fillers, the Braille blank, variation selectors, the line and
/// paragraph separators.
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{034f}' | '\u{2800}' | '\u{115f}' | '\u{1160}' | '\u{3164}' | '\u{ffa0}' | '\u{2028}' | '\u{2029}'
        | '\u{180b}'..='\u{180d}' | '\u{180f}' | '\u{fe00}'..='\u{fe0f}'
        | '\u{e0100}'..='\u{e01ef}')
}

fn describe(c: char) -> String {
    format!("U+{:04X}", u32::from(c))
}

/// The name cut short for a message, its unsafe characters made visible.
fn shown(name: &str) -> String {
    let mut out: String = name
        .chars()
        .take(64)
        .map(|c| {
            if is_unsafe(c) {
                format!("\\u{{{:x}}}", u32::from(c))
            } else {
                c.to_string()
            }
        })
        .collect();
    if name.chars().count() > 64 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass() {
        for ok in ["q", "queue-1", "Événements", "作业", "a b", "🦀"] {
            assert_eq!(check_name("queue name", ok), Ok(()), "{ok}");
        }
        assert!(check_name("queue name", &"x".repeat(MAX_NAME_CHARS)).is_ok());
    }

    #[test]
    fn control_direction_whitespace_and_length_are_refused() {
        for (bad, words) in [
            ("", "empty"),
            ("a\u{1b}[31mb", "U+001B"),
            ("a\0b", "U+0000"),
            ("a\nb", "U+000A"),
            ("a\u{7f}", "U+007F"),
            ("a\u{85}", "U+0085"),
            ("evil\u{202e}txt", "U+202E"),
            ("x\u{2066}", "U+2066"),
            ("demo\u{200b}", "U+200B"),
            ("de\u{200d}mo", "U+200D"),
            ("\u{feff}demo", "U+FEFF"),
            ("demo\u{ad}", "U+00AD"),
            ("demo\u{fe0f}", "U+FE0F"),
            ("demo\u{3164}", "U+3164"),
            ("\u{2800}", "U+2800"),
            ("a\u{a0}b", "U+00A0"),
            ("a\u{3000}b", "U+3000"),
            ("tag\u{e0041}", "U+E0041"),
            ("name ", "whitespace"),
            (" name", "whitespace"),
        ] {
            let e = check_name("queue name", bad).expect_err(bad);
            assert!(e.contains(words), "{bad:?}: {e}");
            assert!(!e.contains('\u{1b}') && !e.contains('\0'), "{e:?}");
        }
        let long = "x".repeat(100_000);
        let e = check_name("queue name", &long).expect_err("long");
        assert!(e.contains("100000 characters") && e.len() < 200, "{e}");
    }
}
