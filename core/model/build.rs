//! Records the git commit this build comes from (`DISBATCH_GIT_SHA`), for `--version` and metrics.

use std::path::Path;
use std::process::Command;

fn main() {
    // A packager building from a tarball (no .git) can still name the commit.
    println!("cargo:rerun-if-env-changed=DISBATCH_GIT_SHA");
    println!("cargo:rerun-if-changed=build.rs");
    // A tarball unpacked inside another repository (a distribution's packaging tree) must not
    // take that repository's commit: git is asked only when the workspace (two levels above
    // this crate, core/model) is its top level.
    let ours = git(&["rev-parse", "--show-toplevel"]).is_some_and(|top| {
        let root = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(std::path::PathBuf::from)
            .and_then(|dir| dir.parent().and_then(Path::parent).map(Path::to_path_buf));
        match (std::fs::canonicalize(top), root.map(std::fs::canonicalize)) {
            (Ok(top), Some(Ok(root))) => top == root,
            _ => false,
        }
    });
    let sha = std::env::var("DISBATCH_GIT_SHA")
        .ok()
        .filter(|s| is_sha(s))
        .or_else(|| {
            ours.then(|| git(&["rev-parse", "--short", "HEAD"]))
                .flatten()
                .filter(|s| is_sha(s))
        })
        .unwrap_or_else(|| "unknown".to_string());
    // Rebuilt when HEAD moves: HEAD itself (a checkout), the branch it points at (a commit)
    // and packed-refs (a branch packed by gc). Only existing files: a missing one would make
    // cargo run this script on every build.
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
    }
    watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watched.into_iter().flatten() {
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rustc-env=DISBATCH_GIT_SHA={sha}");
}

/// One line of git's output, run in this crate's directory; None without git or a checkout.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let out = Command::new("git")
        .args(args)
        .current_dir(&dir)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    if text.is_empty() {
        return None;
    }
    // Relative paths are relative to the directory git ran in.
    if args.first() == Some(&"rev-parse") && args.get(1) == Some(&"--git-path") {
        return Some(Path::new(&dir).join(text).to_string_lossy().into_owned());
    }
    Some(text)
}

/// Only hex digits go into the version text: nothing odd from the environment reaches it.
fn is_sha(s: &str) -> bool {
    (4..=40).contains(&s.len()) && s.chars().all(|c| c.is_ascii_hexdigit())
}
