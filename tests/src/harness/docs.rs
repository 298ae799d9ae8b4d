//! Reading the book for its checks: its Markdown tables, the built HTML's links and anchors,
//! and where `mdbook` is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The repository's root (this crate is `tests/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// A page of the book's source, `docs/src/<page>`.
pub fn book_page(page: &str) -> String {
    let path = repo_root().join("docs/src").join(page);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The `mdbook` to build with: `DISBATCH_MDBOOK`, else one on PATH (scripts/test installs a
/// pinned one into ~/.cache and names it).
pub fn mdbook() -> PathBuf {
    if let Some(path) = std::env::var_os("DISBATCH_MDBOOK") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("mdbook"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("mdbook is not installed: scripts/test installs the pinned version and sets DISBATCH_MDBOOK; or `cargo install mdbook --version 0.4.52 --locked`")
    })
}

/// One row of a Markdown table, with the heading it sits under.
#[derive(Debug, Clone)]
pub struct Row {
    /// The nearest heading above the table (its text, `#`s left out).
    pub section: String,
    /// The nearest level-2 heading (`## …`) above the table.
    pub part: String,
    pub cells: Vec<String>,
    /// 1-based line in the page, for messages.
    pub line: usize,
}

/// The rows of every table whose header's first cell is `first_header` (header and rule
/// rows left out). Cells are split on `|` outside backticks.
pub fn table_rows(page: &str, first_header: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut section = String::new();
    let mut part = String::new();
    let mut in_table = false;
    let mut in_fence = false;
    for (i, line) in page.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        if let Some(h) = trimmed.strip_prefix('#') {
            section = h.trim_start_matches('#').trim().to_string();
            if h.starts_with("# ") {
                part = section.clone();
            }
            in_table = false;
            continue;
        }
        if !trimmed.starts_with('|') {
            in_table = false;
            continue;
        }
        let cells = split_cells(trimmed);
        if !in_table {
            in_table = cells.first().map(String::as_str) == Some(first_header);
            continue;
        }
        if cells
            .iter()
            .all(|c| c.chars().all(|ch| matches!(ch, '-' | ':' | ' ')))
        {
            continue;
        }
        rows.push(Row {
            section: section.clone(),
            part: part.clone(),
            cells,
            line: i + 1,
        });
    }
    rows
}

fn split_cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut in_code = false;
    let mut escaped = false;
    for ch in inner.chars() {
        match ch {
            '\\' if !escaped => {
                escaped = true;
                cell.push(ch);
                continue;
            }
            '`' => in_code = !in_code,
            '|' if !in_code && !escaped => {
                cells.push(cell.trim().to_string());
                cell.clear();
                escaped = false;
                continue;
            }
            _ => {}
        }
        escaped = false;
        cell.push(ch);
    }
    cells.push(cell.trim().to_string());
    cells
}

/// The backticked names in a cell: "`a`, `b`" gives ["a", "b"].
pub fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

/// What is wrong with the links of a built HTML book: each broken `href`/`src` to a page or
/// file of the book, or to an anchor no `id` of its target holds, as "page: link (why)".
pub fn broken_links(built: &Path) -> Vec<String> {
    let mut pages: BTreeMap<PathBuf, String> = BTreeMap::new();
    collect_html(built, &mut pages);
    let ids: BTreeMap<PathBuf, BTreeSet<String>> = pages
        .iter()
        .map(|(p, html)| {
            (
                p.clone(),
                attribute_values(html, "id").into_iter().collect(),
            )
        })
        .collect();
    let mut broken = Vec::new();
    for (page, html) in &pages {
        let shown = page
            .strip_prefix(built)
            .unwrap_or(page)
            .display()
            .to_string();
        // mdBook's 404 page links from the site's root (`<base href="/">`), wherever it is.
        if shown == "404.html" {
            continue;
        }
        let mut links = attribute_values(html, "href");
        links.extend(attribute_values(html, "src"));
        for link in links {
            if link.is_empty()
                || link.contains("://")
                || link.starts_with("mailto:")
                || link.starts_with("javascript:")
                || link.starts_with("data:")
                || link.starts_with("//")
            {
                continue;
            }
            let (path, anchor) = match link.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (link.as_str(), None),
            };
            let path = path.split('?').next().unwrap_or_default();
            let target = if path.is_empty() {
                page.clone()
            } else {
                let dir = page.parent().unwrap_or(built);
                normalise(&dir.join(path))
            };
            let target = if target.is_dir() {
                target.join("index.html")
            } else {
                target
            };
            if !target.exists() {
                broken.push(format!("{shown}: {link} (no such file)"));
                continue;
            }
            if let Some(anchor) = anchor.filter(|a| !a.is_empty()) {
                let found = ids.get(&target).is_some_and(|set| set.contains(anchor));
                if !found {
                    broken.push(format!("{shown}: {link} (no such anchor)"));
                }
            }
        }
    }
    broken.sort();
    broken.dedup();
    broken
}

fn collect_html(dir: &Path, pages: &mut BTreeMap<PathBuf, String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_html(&path, pages);
        } else if path.extension().is_some_and(|e| e == "html") {
            if let Ok(text) = std::fs::read_to_string(&path) {
                pages.insert(normalise(&path), text);
            }
        }
    }
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The values of `name="…"` attributes, HTML entities for `&` undone.
fn attribute_values(html: &str, name: &str) -> Vec<String> {
    let needle = format!(" {name}=\"");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(&needle) {
        rest = &rest[at + needle.len()..];
        if let Some(end) = rest.find('"') {
            out.push(rest[..end].replace("&amp;", "&"));
            rest = &rest[end..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_read_by_their_first_header_and_cells_keep_pipes_in_code() {
        let page = "# A\n\n| Key | Meaning |\n|---|---|\n| `a.b` | x `|` y |\n| `c` | z |\n\n| Other | x |\n|---|---|\n| `d` | e |\n";
        let rows = table_rows(page, "Key");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].section, "A");
        assert_eq!(code_spans(&rows[0].cells[0]), ["a.b"]);
        assert_eq!(rows[0].cells[1], "x `|` y");
        assert_eq!(code_spans("`x`, `y_z`"), ["x", "y_z"]);
    }

    #[test]
    fn a_broken_page_link_and_a_broken_anchor_are_both_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("sub")).expect("mkdir");
        std::fs::write(
            dir.path().join("index.html"),
            r##"<a href="sub/page.html#here">ok</a> <a href="sub/page.html#gone">no anchor</a> <a href="missing.html">no page</a> <a href="https://example.com/x">outside</a> <img src="sub/pic.png">"##,
        )
        .expect("write");
        std::fs::write(
            dir.path().join("sub/page.html"),
            r##"<h2 id="here">Here</h2><a href="../index.html">up</a><a href="#nowhere">x</a>"##,
        )
        .expect("write");
        let broken = broken_links(dir.path());
        assert_eq!(
            broken,
            [
                "index.html: missing.html (no such file)",
                "index.html: sub/page.html#gone (no such anchor)",
                "index.html: sub/pic.png (no such file)",
                "sub/page.html: #nowhere (no such anchor)",
            ]
        );
    }
}
