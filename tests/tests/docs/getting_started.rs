//! The book's Getting started runs as written: its `bash` blocks, in order, as one script,
//! against the test's server, with only the database name and the DCI's port made the test's
//! own (so it runs beside other tests).

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bson::doc;
use disbatch_tests::docs::{book_page, repo_root};
use disbatch_tests::{bin_path, scaled, TestDb};

/// The page's `bash` blocks (other languages are shown, not run), joined in order.
fn bash_blocks(page: &str) -> String {
    let mut script = String::new();
    let mut in_bash = false;
    for line in page.lines() {
        let fence = line.trim_start();
        if fence.starts_with("```") {
            in_bash = !in_bash && fence.trim_start_matches('`').trim() == "bash";
            continue;
        }
        if in_bash {
            script.push_str(line);
            script.push('\n');
        }
    }
    script
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[tokio::test]
async fn the_getting_started_commands_run_as_written() {
    let db = TestDb::new("docs_getting_started").await;
    let page = book_page("getting-started.md");
    let script = bash_blocks(&page);
    for needed in [
        "\"database\": \"disbatch_first\"",
        "127.0.0.1:8081",
        "disbatch create-queue",
        "from disbatch_client import Client",
        "disbatch failures",
        "disbatch result",
    ] {
        assert!(
            script.contains(needed),
            "Getting started no longer has {needed:?}: update this test"
        );
    }
    let port = free_port();
    let script = script
        .replace(
            "\"database\": \"disbatch_first\"",
            &format!("\"database\": \"{}\"", db.name),
        )
        .replace("127.0.0.1:8081", &format!("127.0.0.1:{port}"));
    let path = db.path("getting-started.sh");
    std::fs::write(&path, format!("set -euo pipefail\n{script}")).expect("write the script");

    // `${CARGO_TARGET_DIR:-$PWD/target}/debug` is where this test's own binaries are.
    let debug = bin_path("disbatchd")
        .parent()
        .map(|p| p.to_path_buf())
        .expect("the binaries' folder");
    let target = debug
        .parent()
        .map(|p| p.to_path_buf())
        .expect("the target folder");
    let log = db.path("getting-started.log");
    let out = std::fs::File::create(&log).expect("log file");
    let mut child = Command::new("bash")
        .arg(&path)
        .current_dir(repo_root())
        .env("MONGODB_URI", &db.uri)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("DISBATCH_URL")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .expect("run bash");
    let deadline = Instant::now() + scaled(Duration::from_secs(120));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for bash") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut said = String::new();
    std::fs::File::open(&log)
        .and_then(|mut f| f.read_to_string(&mut said))
        .expect("read the log");
    let Some(status) = status else {
        panic!("Getting started did not finish within its deadline; it printed:\n{said}");
    };
    assert!(
        status.success(),
        "Getting started failed ({status}); it printed:\n{said}"
    );
    for line in [
        "hello, world",
        "hello, disbatch",
        "params.name is missing",
        // The Python client read the results back, and saw the third task discarded.
        "succeeded: {'greeted': 'world'}",
        "succeeded: {'greeted': 'disbatch'}",
        "failed; discarded: True",
        // `disbatch result` of a task that succeeded.
        "\"greeted\"",
    ] {
        assert!(
            said.contains(line),
            "Getting started did not print {line:?}:\n{said}"
        );
    }
    assert_eq!(db.count(doc! {"status": 1}).await, 2, "{said}");
    assert_eq!(db.count(doc! {"status": 2}).await, 1, "{said}");
    assert_eq!(
        db.count(doc! {"status": 2, "discarded_at": {"$exists": true}})
            .await,
        1,
        "{said}"
    );
    db.drop().await;
}

/// CI and the set-up scripts run from any clone on any machine: none names a path of the
/// machine it was written on (the Perl peer is found beside the clone, or given).
#[test]
fn ci_and_the_scripts_name_no_path_of_one_machine() {
    let root = repo_root();
    let mut files = vec![root.join(".ci/run")];
    let scripts = std::fs::read_dir(root.join("scripts")).expect("scripts/");
    files.extend(
        scripts
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_file()),
    );
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            for machine_path in ["/work/", "/home/", "/root/", "/Users/"] {
                assert!(
                    !line.contains(machine_path),
                    "{}:{}: names {machine_path}: {line}",
                    file.display(),
                    n + 1
                );
            }
        }
    }
}
