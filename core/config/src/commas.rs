//! The one leniency of the relaxed-JSON parser we refuse: members and elements with no comma
//! between them (`{"a": 1 "b": 2}`), which it reads as if the comma were there. A forgotten
//! comma is a typo, not a style; comments and trailing commas stay allowed.

use jsonc_parser::tokens::Token;
use jsonc_parser::Scanner;

/// An open object or array, and whether an item of it ended with no comma after it yet.
enum Open {
    Object {
        awaiting_comma: bool,
        in_value: bool,
    },
    Array {
        awaiting_comma: bool,
    },
}

/// Where the first missing comma is, as "expected a comma … on line L column C"; None when
/// every member and element is separated. Run on text the parser accepted, so anything else
/// it would refuse has already been refused.
pub(super) fn missing_comma(text: &str) -> Option<String> {
    let mut scanner = Scanner::new(text);
    let mut open: Vec<Open> = Vec::new();
    loop {
        let token = scanner.scan().ok()??;
        let at = scanner.token_start();
        let missing = |what: &str| {
            Some(format!(
                "expected a comma before this {what} {}",
                place(text, at)
            ))
        };
        match token {
            Token::CommentLine(_) | Token::CommentBlock(_) => {}
            Token::Comma => match open.last_mut() {
                Some(Open::Object { awaiting_comma, .. } | Open::Array { awaiting_comma }) => {
                    *awaiting_comma = false;
                }
                None => {}
            },
            Token::Colon => {
                if let Some(Open::Object { in_value, .. }) = open.last_mut() {
                    *in_value = true;
                }
            }
            Token::CloseBrace | Token::CloseBracket => {
                open.pop();
                item_ended(&mut open);
            }
            Token::String(_) | Token::Word(_) | Token::Number(_)
                if matches!(
                    open.last(),
                    Some(Open::Object {
                        in_value: false,
                        ..
                    })
                ) =>
            {
                // A member's name.
                if let Some(Open::Object {
                    awaiting_comma: true,
                    ..
                }) = open.last()
                {
                    return missing("member");
                }
            }
            value => {
                if let Some(Open::Array {
                    awaiting_comma: true,
                }) = open.last()
                {
                    return missing("element");
                }
                match value {
                    Token::OpenBrace => open.push(Open::Object {
                        awaiting_comma: false,
                        in_value: false,
                    }),
                    Token::OpenBracket => open.push(Open::Array {
                        awaiting_comma: false,
                    }),
                    _ => item_ended(&mut open),
                }
            }
        }
    }
}

/// A value just ended: the item it completes now needs a comma before the next one.
fn item_ended(open: &mut [Open]) {
    match open.last_mut() {
        Some(Open::Object {
            awaiting_comma,
            in_value,
        }) => {
            *in_value = false;
            *awaiting_comma = true;
        }
        Some(Open::Array { awaiting_comma }) => *awaiting_comma = true,
        None => {}
    }
}

/// "on line L column C" (1-based, columns in characters) of byte offset `at`, as the
/// parser's own messages say it.
fn place(text: &str, at: usize) -> String {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("on line {line} column {column}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_comma_between_members_or_elements_is_found_with_its_place() {
        assert_eq!(
            missing_comma(r#"{"a": 1 "b": 2}"#).as_deref(),
            Some("expected a comma before this member on line 1 column 9")
        );
        assert_eq!(
            missing_comma("{\n  \"a\": {\"x\": 1}\n  \"b\": 2\n}").as_deref(),
            Some("expected a comma before this member on line 3 column 3")
        );
        assert_eq!(
            missing_comma(r#"{"p": ["x" "y"]}"#).as_deref(),
            Some("expected a comma before this element on line 1 column 12")
        );
        assert_eq!(
            missing_comma(r#"{"p": [{} {}]}"#).as_deref(),
            Some("expected a comma before this element on line 1 column 11")
        );
        assert_eq!(
            missing_comma("{\"a\": [1] /* , */ \"b\": 2}").as_deref(),
            Some("expected a comma before this member on line 1 column 19")
        );
        assert_eq!(
            missing_comma("{\"é\": \"ü\" \"b\": 2}").as_deref(),
            Some("expected a comma before this member on line 1 column 11")
        );
    }

    #[test]
    fn commas_comments_and_trailing_commas_pass() {
        for text in [
            r#"{"a": 1, "b": [1, 2, {"c": null}], "d": {}}"#,
            "{\"a\": 1, // note\n \"b\": [1, 2,], /* x */ \"c\": {\"d\": true,},}",
            "{}",
            "[]",
            r#"{"s": "a, \"b\" c"}"#,
        ] {
            assert_eq!(missing_comma(text), None, "{text}");
        }
    }
}
