//! The relaxed JSON Disbatch's config files are written in: Cpanel::JSON::XS `relaxed` takes
//! `#` comments to the end of a line and trailing commas. We take those, and `//` and `/* */`
//! comments as before.

use std::borrow::Cow;

use serde_json::Value;

/// Parses a config file's text: comments and trailing commas allowed, a missing comma between
/// members refused (the parser would let it through), errors placed by line and column.
pub(super) fn parse_relaxed_json(text: &str) -> Result<Value, String> {
    // jsonc-parser knows `//` and `/* */` but not `#`; blanking them keeps every other byte,
    // and so every line and column the parser reports, where it was.
    let text = blank_hash_comments(text);
    let text = text.as_ref();
    // The parser recurses; a hostile file nested thousands deep would overflow the stack.
    if let Some(depth) = nesting_beyond(text, MAX_NESTING) {
        return Err(format!(
            "nested deeper than {MAX_NESTING} levels (at byte {depth}); no config needs that"
        ));
    }
    let options = jsonc_parser::ParseOptions {
        allow_comments: true,
        allow_trailing_commas: true,
        allow_loose_object_property_names: false,
    };
    let parsed = jsonc_parser::parse_to_serde_value(text, &options);
    if matches!(parsed, Ok(Some(_))) {
        if let Some(missing) = super::commas::missing_comma(text) {
            return Err(format!("not valid JSON: {missing}"));
        }
    }
    match parsed {
        Ok(Some(value @ Value::Object(_))) => Ok(value),
        Ok(Some(_)) => Err("the top level must be a JSON object".into()),
        Ok(None) => Err("the file is empty".into()),
        Err(e) => Err(format!("not valid JSON: {e}")),
    }
}

const MAX_NESTING: usize = 128;

/// Where the lexer is: comments and strings hide brackets, quotes and `#` from each other.
#[derive(Clone, Copy, PartialEq)]
enum Lex {
    Code,
    Str { escaped: bool },
    LineComment,
    BlockComment { star: bool },
}

impl Lex {
    /// The state after byte `b` at index `i` of `bytes`.
    fn step(self, bytes: &[u8], i: usize) -> Lex {
        let b = bytes[i];
        match self {
            Lex::Code => match b {
                b'"' => Lex::Str { escaped: false },
                b'#' => Lex::LineComment,
                b'/' if bytes.get(i + 1) == Some(&b'/') => Lex::LineComment,
                b'/' if bytes.get(i + 1) == Some(&b'*') => Lex::BlockComment { star: false },
                _ => Lex::Code,
            },
            Lex::Str { escaped: true } => Lex::Str { escaped: false },
            Lex::Str { escaped: false } => match b {
                b'\\' => Lex::Str { escaped: true },
                b'"' => Lex::Code,
                _ => self,
            },
            Lex::LineComment if b == b'\n' => Lex::Code,
            Lex::LineComment => self,
            // The `*` of the opening `/*` is seen here too; `/*/` is not a closed comment.
            Lex::BlockComment { star } => match b {
                b'/' if star && i >= 2 && bytes[i - 2..i] != *b"/*" => Lex::Code,
                b'*' => Lex::BlockComment { star: true },
                _ => Lex::BlockComment { star: false },
            },
        }
    }
}

/// `text` with each `#` comment (outside strings and other comments, to the end of its line)
/// turned into as many spaces as it had bytes.
pub(super) fn blank_hash_comments(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut out: Option<Vec<u8>> = None;
    let (mut lex, mut blanking) = (Lex::Code, false);
    for i in 0..bytes.len() {
        if lex == Lex::Code && bytes[i] == b'#' {
            blanking = true;
        }
        lex = lex.step(bytes, i);
        if lex != Lex::LineComment {
            blanking = false;
        }
        // A `\r` before the newline stays: it belongs to the line end, not the comment.
        if blanking && bytes[i] != b'\r' {
            out.get_or_insert_with(|| bytes.to_vec())[i] = b' ';
        }
    }
    match out {
        // Whole UTF-8 sequences were replaced by ASCII, so the text is still UTF-8.
        Some(blanked) => Cow::Owned(String::from_utf8_lossy(&blanked).into_owned()),
        None => Cow::Borrowed(text),
    }
}

/// The byte offset where brackets outside strings and comments nest deeper than `max`.
pub(super) fn nesting_beyond(text: &str, max: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let (mut depth, mut lex) = (0usize, Lex::Code);
    for (i, &b) in bytes.iter().enumerate() {
        if lex == Lex::Code {
            match b {
                b'{' | b'[' => {
                    depth += 1;
                    if depth > max {
                        return Some(i);
                    }
                }
                b'}' | b']' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        lex = lex.step(bytes, i);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_comments_are_blanked_outside_strings_only() {
        let text = "{\"a\": \"x # y\", # note \"q\n\"b\": 1}";
        assert_eq!(
            blank_hash_comments(text),
            "{\"a\": \"x # y\",          \n\"b\": 1}"
        );
        // Inside `//` and `/* */` comments a `#` is already commented out; a `"` in a
        // `#` comment does not open a string.
        for same in [
            "{\"a\": 1 // x # y\n}",
            "{/* # */ \"a\": 1}",
            "{\"a\\\"#\": 1}",
        ] {
            assert_eq!(blank_hash_comments(same), same);
        }
        assert_eq!(blank_hash_comments("# \"é\r\n{}"), "     \r\n{}");
        assert_eq!(blank_hash_comments("{}#"), "{} ");
    }

    #[test]
    fn a_quote_or_bracket_in_any_comment_does_not_hide_deep_nesting() {
        for comment in ["// \"\n", "/* \" */", "# \"\n"] {
            let text = format!(
                "{{{comment}\"x\": {}1{}}}",
                "[".repeat(200),
                "]".repeat(200)
            );
            assert!(
                nesting_beyond(&blank_hash_comments(&text), 128).is_some(),
                "{comment}"
            );
        }
        assert_eq!(nesting_beyond("{\"[[[[\": 1} # [[[[", 2), None);
        assert_eq!(nesting_beyond("{/*/ [[[[ */}", 2), None);
    }
}
