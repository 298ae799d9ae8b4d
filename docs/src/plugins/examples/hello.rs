//! hello: a Disbatch plugin in Rust, standard library only.
//! The task document arrives on stdin as JSON; params.name is the name to greet.
//! Build it with `rustc --edition 2021 -O hello.rs -o hello`.

use std::io::Read;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut task = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut task) {
        eprintln!("hello: cannot read the task document: {e}");
        return ExitCode::from(3);
    }
    let name = match param_string(&task, "name") {
        Some(name) if is_valid(&name) => name,
        _ => {
            eprintln!(
                "hello: params.name must be 1 to 64 letters, digits, spaces, '.', '_' or '-'"
            );
            return ExitCode::from(3);
        }
    };

    println!("Hello, {name}!");
    let task_id = std::env::var("DISBATCH_TASK_ID").unwrap_or_default();
    eprintln!("warning: an example greeting for task {task_id}");

    // Optional: a result for the attempt record (and for chaining, when the queue has
    // `then`). The name holds no character that JSON must escape.
    let result = format!("{{\"output\": {{\"greeted\": \"{name}\"}}}}\n");
    if let Err(e) = std::fs::write(
        std::env::var_os("DISBATCH_RESULT").unwrap_or_default(),
        result,
    ) {
        eprintln!("hello: cannot write the result: {e}");
        return ExitCode::from(4);
    }
    ExitCode::SUCCESS
}

/// 1 to 64 letters, digits, spaces, '.', '_' or '-'.
fn is_valid(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b" ._-".contains(&b))
}

// A minimal JSON reader, enough to find one string in the task document. A plugin that may
// use crates would write, with serde_json:
//     let task: serde_json::Value = serde_json::from_str(&task)?;
//     let name = task["params"]["name"].as_str();

/// `params.<key>` of the task document, when it is a string.
fn param_string(doc: &str, key: &str) -> Option<String> {
    let mut json = Json { text: doc, at: 0 };
    json.member("params")?;
    json.member(key)?;
    json.string()
}

struct Json<'a> {
    text: &'a str,
    at: usize,
}

impl Json<'_> {
    /// The next byte that is not white space, consumed.
    fn next(&mut self) -> Option<u8> {
        let bytes = self.text.as_bytes();
        while bytes.get(self.at)?.is_ascii_whitespace() {
            self.at += 1;
        }
        self.at += 1;
        Some(bytes[self.at - 1])
    }

    fn peek(&mut self) -> Option<u8> {
        let byte = self.next()?;
        self.at -= 1;
        Some(byte)
    }

    /// In the object that starts here, moves to the value of member `key`.
    fn member(&mut self, key: &str) -> Option<()> {
        (self.next()? == b'{').then_some(())?;
        if self.peek()? == b'}' {
            return None;
        }
        loop {
            let name = self.string()?;
            (self.next()? == b':').then_some(())?;
            if name == key {
                return Some(());
            }
            self.skip()?;
            (self.next()? == b',').then_some(())?;
        }
    }

    /// The string that starts here, its escapes decoded.
    fn string(&mut self) -> Option<String> {
        (self.next()? == b'"').then_some(())?;
        let mut text = String::new();
        let mut chars = self.text.get(self.at..)?.char_indices();
        loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => {
                    self.at += i + 1;
                    return Some(text);
                }
                '\\' => match chars.next()?.1 {
                    'n' => text.push('\n'),
                    't' => text.push('\t'),
                    'r' => text.push('\r'),
                    'b' => text.push('\u{8}'),
                    'f' => text.push('\u{c}'),
                    'u' => {
                        let hex: String = (0..4)
                            .filter_map(|_| chars.next().map(|(_, c)| c))
                            .collect();
                        let code = u32::from_str_radix(&hex, 16).ok()?;
                        // A surrogate half stands for a character outside the BMP: replaced.
                        text.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                    }
                    other => text.push(other), // '"', '\\' and '/'
                },
                c => text.push(c),
            }
        }
    }

    /// Skips the value that starts here.
    fn skip(&mut self) -> Option<()> {
        let mut depth = 0;
        loop {
            match self.peek()? {
                b'"' => {
                    self.string()?;
                }
                b'{' | b'[' => {
                    self.at += 1;
                    depth += 1;
                }
                b'}' | b']' => {
                    self.at += 1;
                    depth -= 1;
                }
                _ if depth > 0 => self.at += 1, // ',' ':' and the bytes of scalars
                _ => {
                    // A number, true, false or null: up to the next delimiter.
                    while !b",}] \t\r\n".contains(self.text.as_bytes().get(self.at)?) {
                        self.at += 1;
                    }
                }
            }
            if depth == 0 {
                return Some(());
            }
        }
    }
}
