//! A hostile plugin for the isolation tests: tries to read what its runner and node keep from
//! it and prints what it got as one JSON object on stdout.
//!
//! Params: `den_pid` (the node's pid, from its `nodes` document), `attack_spool` (bool: also
//! try to make the runner read or overwrite files through symlinks in its spool).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

/// The most a probe reads of one file: enough to see a secret, never a whole disk.
const READ_CAP: u64 = 64 * 1024;
/// Descriptors probed in this process: well past anything a runner would leave open.
const MAX_FD: i32 = 4096;

fn main() {
    // First, before anything here opens a descriptor of its own.
    let own_fds = own_descriptors();
    let mut input = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut input);
    let task: Value = serde_json::from_slice(&input).unwrap_or(Value::Null);
    let params = task.get("params").cloned().unwrap_or(Value::Null);
    let ppid = std::os::unix::process::parent_id() as i32;
    let mut report = Map::new();
    report.insert("own_fds".into(), own_fds);
    report.insert("status".into(), status_ids());
    report.insert(
        "env".into(),
        std::env::vars_os()
            .map(|(k, v)| {
                let (k, v) = (k.to_string_lossy(), v.to_string_lossy());
                (k.into_owned(), Value::String(v.into_owned()))
            })
            .collect::<Map<_, _>>()
            .into(),
    );
    report.insert("runner".into(), spy_on(ppid));
    if let Some(den) = params.get("den_pid").and_then(Value::as_i64) {
        report.insert("den".into(), spy_on(den as i32));
    }
    let result = std::env::var_os("DISBATCH_RESULT").map(PathBuf::from);
    if let Some(result) = &result {
        report.insert("wrote_result".into(), write_result(result));
        if params.get("attack_spool").and_then(Value::as_bool) == Some(true) {
            report.insert("attack".into(), attack_spool(result));
        }
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", Value::Object(report));
}

/// Every descriptor above stderr, where it leads and what it holds.
fn own_descriptors() -> Value {
    let mut found = Vec::new();
    for fd in 3..MAX_FD {
        // readlink opens nothing, so the probe itself adds no descriptor.
        let Ok(target) = std::fs::read_link(format!("/proc/self/fd/{fd}")) else {
            continue;
        };
        found.push(json!({
            "fd": fd,
            "target": target.to_string_lossy(),
            "content": read_descriptor(fd),
        }));
    }
    Value::Array(found)
}

/// What an inherited descriptor lets us read, whatever the file's permissions: reopening it
/// through /proc would be checked again, reading the descriptor is not.
fn read_descriptor(fd: i32) -> Value {
    use std::os::fd::BorrowedFd;
    use std::os::unix::fs::FileExt;
    // SAFETY: `fd` was open a moment ago (readlink saw it) and nothing else here closes it;
    // the borrow lasts for one dup.
    let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned();
    let file = match owned {
        Ok(o) => std::fs::File::from(o),
        Err(e) => return json!({"error": e.to_string()}),
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return json!({"error": "not a regular file"});
    }
    let mut buf = vec![0; READ_CAP as usize];
    // pread: the offset the descriptor shares with its other holders stays where it was.
    match file.read_at(&mut buf, 0) {
        Ok(n) => Value::String(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// Uid, Gid and Groups lines of /proc/self/status.
fn status_ids() -> Value {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    json!({"uid": field("Uid:"), "gid": field("Gid:"), "groups": field("Groups:")})
}

/// What another process lets us read: its environment, command line, the config file named
/// there, and its descriptors (targets and contents).
fn spy_on(pid: i32) -> Value {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let cmdline = std::fs::read(proc.join("cmdline"));
    let args: Vec<String> = match &cmdline {
        Ok(bytes) => bytes
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    let config = args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let fds = match std::fs::read_dir(proc.join("fd")) {
        Ok(entries) => Value::Array(
            entries
                .flatten()
                .map(|e| {
                    let target = std::fs::read_link(e.path())
                        .map(|t| t.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    json!({"fd": e.file_name().to_string_lossy(), "target": target,
                           "content": read_capped(&e.path())})
                })
                .collect(),
        ),
        Err(e) => json!({"error": e.to_string()}),
    };
    json!({
        "pid": pid,
        "environ": read_capped(&proc.join("environ")),
        "cmdline": match cmdline {
            Ok(_) => Value::from(args.clone()),
            Err(e) => json!({"error": e.to_string()}),
        },
        "config": config.as_ref().map(|p| json!({"path": p, "read": read_capped(p)})),
        "fds": fds,
    })
}

/// A file's text (NULs shown as newlines) or the error that kept it from us. Only regular
/// files are read: a pipe or socket could block the spy forever.
fn read_capped(path: &Path) -> Value {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return json!({"error": "not a regular file"}),
        Ok(_) => {}
        Err(e) => return json!({"error": e.to_string()}),
    }
    let mut bytes = Vec::new();
    match std::fs::File::open(path).and_then(|f| f.take(READ_CAP).read_to_end(&mut bytes)) {
        Ok(_) => Value::String(String::from_utf8_lossy(&bytes).replace('\0', "\n")),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// Writes the result file the way careful programs do: a temporary file, then a rename.
fn write_result(result: &Path) -> Value {
    let tmp = result.with_extension("tmp");
    let written = std::fs::write(&tmp, br#"{"status": 1, "spy": "wrote-result"}"#)
        .and_then(|()| std::fs::rename(&tmp, result));
    match written {
        Ok(()) => Value::Bool(true),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// Symlinks that would make a careless runner read /etc/shadow into the task (as the result
/// or the stdout it reads back) or append its stderr note to /etc/shadow.
fn attack_spool(result: &Path) -> Value {
    let mut tried = Map::new();
    let swap = |link: &Path, to: &str| -> Value {
        let tmp = link.with_extension("spy-link");
        let _ = std::fs::remove_file(&tmp);
        match std::os::unix::fs::symlink(to, &tmp).and_then(|()| std::fs::rename(&tmp, link)) {
            Ok(()) => Value::String("replaced".into()),
            Err(e) => json!({"error": e.to_string()}),
        }
    };
    tried.insert("result".into(), swap(result, "/etc/shadow"));
    // The spool holding stdout/stderr: the result's directory, or the one above it.
    for dir in result.ancestors().skip(1).take(2) {
        for name in ["stdout", "stderr"] {
            let path = dir.join(name);
            tried.insert(path.display().to_string(), swap(&path, "/etc/shadow"));
        }
    }
    Value::Object(tried)
}
