//! Aligned plain-text tables: a header row, then rows, columns two spaces apart; every cell
//! escaped and cut, so stored names cannot break a row or drive the terminal.

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

pub struct Table {
    headers: Vec<String>,
    aligns: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Table {
            headers: columns.iter().map(|(h, _)| h.to_string()).collect(),
            aligns: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are blank and extra cells are dropped. Control, bidi and
    /// invisible characters and whitespace at a cell's ends are shown as `\u{..}` escapes,
    /// and a cell longer than `printable::MAX_SHOWN_CHARS` is cut with a marker.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells: Vec<String> = cells
            .into_iter()
            .map(|c| match disbatch_model::text::printable::shown(&c) {
                std::borrow::Cow::Borrowed(_) => c,
                std::borrow::Cow::Owned(escaped) => escaped,
            })
            .collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// The table text, one line per row with a final newline. Widths count characters, which
    /// is exact for the ids, names and numbers these tables hold.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[i] - cell.chars().count());
                match self.aligns[i] {
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&pad);
                    }
                    Align::Right => {
                        line.push_str(&pad);
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_left_and_right() {
        let mut t = Table::new(&[
            ("ID", Align::Left),
            ("Name", Align::Left),
            ("Queued", Align::Right),
        ]);
        t.row(vec!["a1".into(), "demo".into(), "5".into()]);
        t.row(vec!["b".into(), "x".into(), "1234567".into()]);
        assert_eq!(
            t.render(),
            "ID  Name   Queued\n\
             a1  demo        5\n\
             b   x     1234567\n"
        );
    }

    #[test]
    fn short_rows_pad_and_trailing_blanks_are_trimmed() {
        let mut t = Table::new(&[("A", Align::Left), ("Bee", Align::Left)]);
        t.row(vec!["long value".into()]);
        assert_eq!(t.render(), "A           Bee\nlong value\n");
    }

    #[test]
    fn empty_table_is_just_the_header() {
        let t = Table::new(&[("Node", Align::Left), ("Live", Align::Left)]);
        assert_eq!(t.render(), "Node  Live\n");
    }

    #[test]
    fn stored_names_cannot_break_rows_or_reach_the_terminal_raw() {
        let mut t = Table::new(&[("Name", Align::Left), ("N", Align::Right)]);
        t.row(vec!["red\x1b[31m".into(), "1".into()]);
        t.row(vec!["two\nlines\0".into(), "2".into()]);
        t.row(vec!["abc\u{202e}fed ".into(), "3".into()]);
        t.row(vec!["x".repeat(100_000), "4".into()]);
        let text = t.render();
        assert_eq!(text.lines().count(), 5, "{text}");
        assert!(
            !text
                .chars()
                .any(|c| c != '\n' && disbatch_model::text::printable::is_hidden(c)),
            "{text:?}"
        );
        assert!(text.contains("red\\u{1b}[31m"), "{text}");
        assert!(text.contains("two\\u{a}lines\\u{0}"), "{text}");
        assert!(text.contains("abc\\u{202e}fed\\u{20}"), "{text}");
        assert!(text.lines().all(|l| l.chars().count() < 400), "{text}");
    }

    #[test]
    fn widths_count_characters_not_bytes() {
        let mut t = Table::new(&[("N", Align::Left), ("X", Align::Left)]);
        t.row(vec!["été".into(), "1".into()]);
        assert_eq!(t.render(), "N    X\nété  1\n");
    }
}
