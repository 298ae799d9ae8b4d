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
    if let Some((i, c)) = name.char_indices().find(|(_, c)| is_unsafe(*c)) {
        return Err(format!(
            "{what} {:?} contains {} at byte {i}: control and text-direction characters are not allowed",
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

/// Control characters (C0, DEL, C1), and the marks and overrides that reorder how text is
/// shown (a name could look like another).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200e}' | '\u{200f}' | '\u{061c}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
            | '\u{2028}' | '\u{2029}')
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
