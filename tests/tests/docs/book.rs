//! The book builds with the pinned mdBook, and every link inside it, and every link from the
//! README into the repository, lands on a page, file or anchor that exists.

use std::process::Command;

use disbatch_tests::docs::{broken_links, mdbook, repo_root};

#[test]
fn the_book_builds_and_every_internal_link_and_anchor_resolves() {
    let out = tempfile::tempdir().expect("tempdir");
    let built = Command::new(mdbook())
        .arg("build")
        .arg(repo_root().join("docs"))
        .arg("--dest-dir")
        .arg(out.path())
        .output()
        .expect("run mdbook");
    assert!(
        built.status.success(),
        "mdbook build failed:\n{}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    // mdBook warns (and goes on) about a chapter file it cannot read or a bad include.
    let log = String::from_utf8_lossy(&built.stderr);
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    assert!(
        warnings.is_empty(),
        "mdbook warned:\n{}",
        warnings.join("\n")
    );
    let broken = broken_links(out.path());
    assert!(
        broken.is_empty(),
        "{} broken link(s) in the book:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn every_relative_link_of_the_readme_names_a_file_of_the_repository() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut broken = Vec::new();
    // `](target)`: Markdown links and images.
    for piece in readme.split("](").skip(1) {
        let Some(target) = piece.split(')').next() else {
            continue;
        };
        let path = target.split('#').next().unwrap_or_default();
        if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
            continue;
        }
        if !root.join(path).exists() {
            broken.push(target.to_string());
        }
    }
    assert!(
        broken.is_empty(),
        "README links to missing files: {broken:?}"
    );
    let lines = readme.lines().count();
    assert!(
        lines <= 150,
        "README.md has {lines} lines; the book holds the details"
    );
}
