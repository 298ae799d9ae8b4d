//! A `mongohost` carrying a password, in shapes the driver or the config check refuses: every
//! binary still says what is wrong, and no password text reaches its stdout or stderr.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use disbatch_tests::bin_path;
use disbatch_tests::hostile::crashes;
use serde_json::json;

/// How long a binary that keeps running (a DCI that serves anyway, a runner that retries) is
/// watched for the message before it is stopped.
const WATCH: Duration = Duration::from_secs(20);

struct Case {
    label: &'static str,
    mongohost: &'static str,
    /// Texts that must not appear anywhere in the output: the password as written, decoded,
    /// and a fragment of it (a partial leak is a leak).
    secrets: &'static [&'static str],
    /// What the message must say, one of these per binary (the runner and the DCI word an
    /// unreachable server differently from the DEN).
    says: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        label: "unknown scheme",
        mongohost: "mongodbx://user:Hunter2-Scheme@db.example.com/",
        secrets: &["Hunter2-Scheme", "Hunter2"],
        says: &["not a MongoDB URI"],
    },
    Case {
        label: "bad option",
        mongohost: "mongodb://user:Hunter2-Option@127.0.0.1:1/?bogusopt=1",
        secrets: &["Hunter2-Option", "Hunter2"],
        says: &["bogusopt"],
    },
    Case {
        label: "unresolvable host",
        mongohost:
            "mongodb://user:Hunter2-Host@nonexistent.invalid:27017/?serverSelectionTimeoutMS=500",
        secrets: &["Hunter2-Host", "Hunter2"],
        says: &["nonexistent.invalid"],
    },
    Case {
        label: "percent-encoded password",
        mongohost: "mongodb://user:Hunter2%40Pct%3Aword@127.0.0.1:1/?tls=maybe",
        secrets: &["Hunter2%40Pct%3Aword", "Hunter2@Pct:word", "Hunter2"],
        says: &["tls"],
    },
    Case {
        label: "unescaped @ and : in the password",
        mongohost: "mongodb://user:Hunter2@At:Colon@127.0.0.1:1/",
        secrets: &["Hunter2@At:Colon", "Hunter2", "At:Colon"],
        says: &["URL encoded"],
    },
];

/// `auth` passwords ride along: no message may show them either.
const AUTH_SECRET: &str = "AuthPass-Never-Shown";

/// Every binary that reads a config, with its arguments besides the config, and its stdin.
fn binaries(config: &Path) -> Vec<(&'static str, Vec<String>, &'static str)> {
    let config = config.display().to_string();
    let with = |args: &[&str]| -> Vec<String> {
        let mut v = vec!["--config".to_string(), config.clone()];
        v.extend(args.iter().map(|a| a.to_string()));
        v
    };
    vec![
        ("disbatchd", with(&["--node", "cred-node"]), ""),
        ("disbatch-web", with(&["--listen", "127.0.0.1:0"]), ""),
        (
            "disbatch-task-runner",
            with(&["--task", "6b02626f79f4bc22b2fe7135", "--node", "n"]),
            "",
        ),
        (
            "disbatch",
            {
                let mut v = vec!["create-users".to_string()];
                v.extend(with(&["--root-user", "admin"]));
                v
            },
            "root-password\n",
        ),
        ("disbatch-demo", vec![config.clone()], ""),
    ]
}

/// Runs `binary` until it exits, or until its output says one of `says` (then a moment more),
/// or WATCH; returns its stdout and stderr together.
fn run(dir: &Path, binary: &str, args: &[String], stdin: &str, says: &[&str]) -> String {
    let out_path = dir.join(format!("{binary}.out"));
    let out = std::fs::File::create(&out_path).expect("output file");
    let err = out.try_clone().expect("output file");
    let mut child = Command::new(bin_path(binary))
        .args(args)
        .env("RUST_LOG", "debug")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::piped())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn");
    if let Some(mut input) = child.stdin.take() {
        let _ = input.write_all(stdin.as_bytes());
    }
    let started = Instant::now();
    let mut seen_at: Option<Instant> = None;
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        let text = std::fs::read_to_string(&out_path).unwrap_or_default();
        if seen_at.is_none() && says.iter().any(|s| text.contains(s)) {
            seen_at = Some(Instant::now());
        }
        let settled = seen_at.is_some_and(|t| t.elapsed() > Duration::from_millis(500));
        if settled || started.elapsed() > WATCH {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let bytes = std::fs::read(&out_path).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn write_config(dir: &Path, i: usize, mongohost: &str) -> PathBuf {
    let path = dir.join(format!("case-{i}.json"));
    let auth: serde_json::Map<String, serde_json::Value> = [
        "disbatchd",
        "task_runner",
        "disbatch_web",
        "queuebalance",
        "plugin",
    ]
    .iter()
    .map(|u| (u.to_string(), json!(AUTH_SECRET)))
    .collect();
    let config = json!({
        "mongohost": mongohost,
        "database": format!("t_hostile_credentials_{}", std::process::id()),
        "plugins": {"echo": bin_path("disbatch-plugin-echo")},
        "task_runner": bin_path("disbatch-task-runner"),
        "auth": auth,
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&config).expect("json")).expect("write");
    path
}

#[test]
fn no_binary_prints_a_mongohost_password_in_any_bad_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut failures = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let config = write_config(dir.path(), i, case.mongohost);
        for (binary, args, stdin) in binaries(&config) {
            let what = format!("{binary} / {}", case.label);
            let text = run(dir.path(), binary, &args, stdin, case.says);
            for secret in case.secrets.iter().chain([&AUTH_SECRET]) {
                if text.contains(secret) {
                    failures.push(format!("{what}: {secret:?} printed:\n{text}"));
                }
            }
            if !case.says.iter().any(|s| text.contains(s)) {
                failures.push(format!("{what}: does not say {:?}:\n{text}", case.says));
            }
            if !crashes(&text).is_empty() {
                failures.push(format!("{what}: crashed:\n{text}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
