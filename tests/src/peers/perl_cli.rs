//! Disbatch 4.103's own Perl CLI (`bin/disbatch` of the shared peer `disbatch4-perl`), run
//! against a DCI. Its modules come from Debian (`scripts/test` installs them); without the peer
//! (unless CI requires it) or perl the caller skips and says so, while a missing module fails.

use std::path::PathBuf;
use std::process::Command;

use bson::Bson;
use serde_json::{json, Value};

/// The Perl CLI, ready to run.
pub struct PerlCli {
    dir: PathBuf,
    url: String,
}

/// One run: exit code, stdout, stderr.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

const MODULES: &[&str] = &[
    "Cpanel::JSON::XS",
    "File::Slurp",
    "IO::Wrap",
    "LWP::UserAgent",
    "Text::CSV_XS",
    "Text::Table",
    "Try::Tiny",
];

impl PerlCli {
    /// None (after saying why) when the peer is not here (`perl_den::available`) or perl is
    /// not installed.
    pub fn find(url: &str) -> Option<PerlCli> {
        if !super::perl_den::available("perl_cli") {
            return None;
        }
        if Command::new("perl").arg("-e1").status().is_err() {
            eprintln!("SKIPPED perl_cli: perl is not installed, so Disbatch's Perl CLI cannot run");
            return None;
        }
        let dir = super::perl_den::peer_dir();
        assert!(
            dir.join("bin/disbatch").is_file(),
            "Disbatch's Perl CLI is not at {} (DISBATCH_PERL_PEER names the peer's folder)",
            dir.display()
        );
        let mut check = Command::new("perl");
        for m in MODULES {
            check.arg(format!("-M{m}"));
        }
        let out = check.arg("-e1").output().expect("run perl");
        assert!(
            out.status.success(),
            "the Perl CLI's modules are missing (scripts/test installs them with apt): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(PerlCli {
            dir,
            url: url.to_string(),
        })
    }

    pub fn run(&self, args: &[&str]) -> Run {
        let out = Command::new("perl")
            .arg(self.dir.join("bin/disbatch"))
            .args(["--url", &self.url, "--config", "/nonexistent"])
            .args(args)
            .env("PERL5LIB", self.dir.join("lib"))
            .env("PERL_MONGO_NO_DEP_WARNINGS", "1")
            .output()
            .expect("run the Perl CLI");
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// A command that succeeds printing exactly `stdout`.
    pub fn prints(&self, args: &[&str], stdout: &str) {
        let r = self.run(args);
        assert_eq!(
            (r.code, r.stdout.as_str(), r.stderr.as_str()),
            (Some(0), stdout, ""),
            "disbatch {args:?}"
        );
    }

    /// A command that fails (Perl's `die`) printing exactly `stderr`.
    pub fn fails(&self, args: &[&str], stderr: &str) {
        let r = self.run(args);
        assert!(
            r.code.is_some_and(|c| c != 0),
            "disbatch {args:?} should fail: {:?}",
            r.code
        );
        assert_eq!(
            (r.stdout.as_str(), r.stderr.as_str()),
            ("", stderr),
            "disbatch {args:?}"
        );
    }

    /// The message of a failed request: "Error <verb>ing URL (<status>): <body>".
    pub fn http_error(&self, verb: &str, path: &str, status: &str, body: &str) -> String {
        format!("Error {verb} {}{path} ({status}): {body}\n", self.url)
    }
}

/// A stored task as Disbatch's web app renders it: sorted keys, `{"$oid"}` ids, dates as
/// `YYYY-MM-DDTHH:MM:SS` (or float epoch seconds).
pub fn disbatch_json(b: &Bson, epoch: bool) -> Value {
    match b {
        Bson::Document(d) => {
            let mut keys: Vec<&String> = d.keys().collect();
            keys.sort();
            let map = keys
                .into_iter()
                .map(|k| (k.clone(), disbatch_json(&d[k.as_str()], epoch)))
                .collect();
            Value::Object(map)
        }
        Bson::Array(items) => Value::Array(items.iter().map(|i| disbatch_json(i, epoch)).collect()),
        Bson::ObjectId(id) => json!({"$oid": id.to_hex()}),
        Bson::DateTime(t) if epoch => json!(t.timestamp_millis() as f64 / 1000.0),
        Bson::DateTime(t) => {
            let text = t.try_to_rfc3339_string().expect("date");
            Value::String(text[..19].to_string())
        }
        Bson::String(s) => json!(s),
        Bson::Int32(n) => json!(n),
        Bson::Int64(n) => json!(n),
        Bson::Double(f) => json!(f),
        Bson::Boolean(v) => json!(v),
        Bson::Null => Value::Null,
        other => panic!("unexpected value in a task: {other}"),
    }
}

/// Compact JSON with sorted keys (Disbatch encodes canonically), plus the newline the CLI's
/// `say` adds.
pub fn said(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut entries: Vec<(&String, &Value)> = m.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.clone(), sorted(v)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    format!("{}\n", serde_json::to_string(&sorted(v)).expect("json"))
}
