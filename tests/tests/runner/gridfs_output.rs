//! Output placement through the real runner for the three `gfs` modes, read back byte-equal.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use disbatch_config::{Component, Config};
use disbatch_model::status;
use disbatch_store::Store;
use disbatch_tests::{write_config, Den, TestDb};
use serde_json::json;

const MIB: usize = 1024 * 1024;

/// How one stream was stored, and its content.
#[derive(Debug, PartialEq)]
enum Stored {
    Inline(usize),
    GridFs(usize),
}

async fn stored(
    db: &TestDb,
    store: &Store,
    task: &Document,
    field: &str,
    expected: &[u8],
) -> Stored {
    match task.get(field) {
        Some(Bson::String(s)) => {
            assert!(
                s.as_bytes() == expected,
                "{field} inline content differs ({} bytes)",
                s.len()
            );
            Stored::Inline(s.len())
        }
        Some(Bson::ObjectId(id)) => {
            let bytes = store
                .results()
                .read_output_file(*id)
                .await
                .expect("read GridFS");
            assert!(
                bytes == expected,
                "{field} GridFS content differs ({} bytes)",
                bytes.len()
            );
            let file = store
                .results()
                .output_file(*id)
                .await
                .expect("files doc")
                .expect("exists");
            assert_eq!(file.get_str("filename").ok(), Some(field));
            let meta = file.get_document("metadata").expect("metadata");
            assert_eq!(
                meta.get_object_id("task_id").ok(),
                task.get_object_id("_id").ok()
            );
            // Disbatch's format: chunk data are BSON strings, so Perl tools can read them.
            let chunks = db.db.collection::<Document>("tasks.chunks");
            let binary = chunks
                .count_documents(doc! {"files_id": id, "data": {"$not": {"$type": "string"}}})
                .await
                .expect("count chunks");
            assert_eq!(binary, 0, "{field} has non-string chunks");
            Stored::GridFs(bytes.len())
        }
        // Empty inline output is stored as null, as Disbatch's runner stores it.
        Some(Bson::Null) => {
            assert!(
                expected.is_empty(),
                "{field} is null but {} bytes were written",
                expected.len()
            );
            Stored::Inline(0)
        }
        other => panic!("{field} is neither text, null nor a file id: {other:?}"),
    }
}

/// The bytes Disbatch's Demo plugin prints for `commands`.
fn demo_output(commands: &str) -> (Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for c in commands.chars() {
        match c {
            'a' => out.extend_from_slice(b"This is command 'a' for apple.\n"),
            'b' => err.extend_from_slice(
                b"This is command 'b' for banana: an error that does not fail the task.\n",
            ),
            '1' | '7' | '8' | 'e' => {
                let n = match c {
                    '1' => 1,
                    '7' => 7,
                    '8' => 8,
                    _ => 15,
                };
                out.extend(std::iter::repeat_n(c as u8, n * MIB));
            }
            'A' | 'B' | 'C' | 'E' => {
                let n = match c {
                    'A' => 1,
                    'B' => 7,
                    'C' => 8,
                    _ => 15,
                };
                err.extend(std::iter::repeat_n(c as u8, n * MIB));
            }
            _ => {}
        }
    }
    (out, err)
}

async fn run_cases(test: &str, gfs: serde_json::Value, cases: &[(&str, Stored, Stored)]) {
    let db = TestDb::new(test).await;
    let config = write_config(&db, "node.json", json!({"gfs": gfs}));
    let loaded = Config::load(&config).expect("config");
    let store = Store::connect(&loaded.config, Component::Den)
        .await
        .expect("store");
    let queue = db.insert_queue("demo", "Disbatch::Plugin::Demo", 2).await;
    let ids: Vec<ObjectId> = db
        .insert_tasks(
            queue,
            cases
                .iter()
                .map(|(c, _, _)| doc! {"commands": *c}.into())
                .collect(),
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(120)).await;
    for ((commands, want_out, want_err), id) in cases.iter().zip(&ids) {
        let task = db.task(*id).await;
        assert_eq!(
            task.get_i32("status").ok(),
            Some(status::SUCCEEDED),
            "{commands}: {:?}",
            task.get("stderr")
        );
        let (out, err) = demo_output(commands);
        assert_eq!(
            &stored(&db, &store, &task, "stdout", &out).await,
            want_out,
            "stdout of {commands}"
        );
        assert_eq!(
            &stored(&db, &store, &task, "stderr", &err).await,
            want_err,
            "stderr of {commands}"
        );
    }
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn auto_mode_applies_the_fifteen_mib_rules() {
    use Stored::*;
    let line = 31; // "This is command 'a' for apple.\n"
    run_cases(
        "gfs_auto",
        json!("auto"),
        &[
            ("a", Inline(line), Inline(0)),
            // Exactly 15 MiB in all stays inline (the limit is inclusive).
            ("e", Inline(15 * MIB), Inline(0)),
            ("78", Inline(15 * MIB), Inline(0)),
            ("7C", Inline(7 * MIB), Inline(8 * MIB)),
            // One line over: stdout moves to GridFS, stderr stays.
            ("ea", GridFs(15 * MIB + line), Inline(0)),
            ("8C", GridFs(8 * MIB), Inline(8 * MIB)),
            // stderr alone at the limit still stays inline.
            ("aE", GridFs(line), Inline(15 * MIB)),
        ],
    )
    .await;
}

#[tokio::test]
async fn auto_mode_moves_both_when_stderr_alone_is_over_the_limit() {
    use Stored::*;
    let banana = 70;
    run_cases(
        "gfs_auto_both",
        json!("auto"),
        &[("Eb", GridFs(0), GridFs(15 * MIB + banana))],
    )
    .await;
}

#[tokio::test]
async fn on_mode_always_uses_gridfs_even_for_empty_output() {
    use Stored::*;
    run_cases(
        "gfs_on",
        json!(true),
        &[("", GridFs(0), GridFs(0)), ("a", GridFs(31), GridFs(0))],
    )
    .await;
}

#[tokio::test]
async fn off_mode_keeps_output_inline_and_replaces_what_cannot_fit() {
    let db = TestDb::new("gfs_off").await;
    let config = write_config(&db, "node.json", json!({"gfs": false}));
    let queue = db.insert_queue("demo", "Disbatch::Plugin::Demo", 2).await;
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"commands": "e"}.into(),
                doc! {"commands": "eEb"}.into(),
            ],
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(120)).await;
    let fits = db.task(ids[0]).await;
    assert_eq!(fits.get_str("stdout").map(str::len).ok(), Some(15 * MIB));
    let too_big = db.task(ids[1]).await;
    assert_eq!(
        too_big.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "the task still finishes"
    );
    let out = too_big.get_str("stdout").unwrap_or_default();
    assert!(
        out.starts_with("Error: stdout") && out.contains("gfs is false"),
        "{out}"
    );
    let err = too_big.get_str("stderr").unwrap_or_default();
    assert_eq!(
        err.len(),
        15 * MIB + 70,
        "stderr fits on its own and is kept"
    );
    assert_eq!(
        db.db
            .collection::<Document>("tasks.files")
            .count_documents(doc! {})
            .await
            .ok(),
        Some(0)
    );
    drop(den);
    db.drop().await;
}
