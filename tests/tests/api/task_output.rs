//! `disbatch-web` black-box: a task's output streams, from inline text or GridFS.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson};
use disbatch_tests::api::error;
use disbatch_tests::api_calls::{content_type, gridfs_file, inserted, oid};
use disbatch_tests::{write_config, Dci, Den, TestDb};
use serde_json::json;

async fn bytes(dci: &Dci, path: &str) -> (u16, String, Vec<u8>) {
    let r = dci.http.get(dci.at(path)).send().await.expect("request");
    let (status, ct) = (r.status().as_u16(), content_type(&r));
    (status, ct, r.bytes().await.expect("body").to_vec())
}

fn binary(b: &[u8]) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes: b.to_vec(),
    })
}

#[tokio::test]
async fn output_streams_come_from_inline_text_and_gridfs_string_or_binary_chunks() {
    let db = TestDb::new("api_task_output").await;
    let config = write_config(&db, "web.json", json!({}));
    let queue = db.insert_queue("q", "echo", 0).await;
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"a": 1}.into(),
                doc! {"a": 2}.into(),
                doc! {"a": 3}.into(),
            ],
        )
        .await;
    db.set_task(
        ids[0],
        doc! {"status": 1, "stdout": "line one\nline two\n", "stderr": "warn é\n"},
    )
    .await;
    let raw_bytes: Vec<u8> = b"bin\x00ary\xff\xfe"
        .iter()
        .copied()
        .chain((0..=255u8).cycle().take(3000))
        .collect();
    let pieces: Vec<Bson> = raw_bytes.chunks(1000).map(binary).collect();
    let bin_file = gridfs_file(&db, ids[1], "stdout", pieces).await;
    let text_file = gridfs_file(
        &db,
        ids[1],
        "stderr",
        vec![
            Bson::String("part 1, ".into()),
            Bson::String("part 2".into()),
        ],
    )
    .await;
    db.set_task(
        ids[1],
        doc! {"status": 2, "stdout": bin_file, "stderr": text_file},
    )
    .await;
    let dci = Dci::start(&config);
    let text_plain = "text/plain; charset=utf-8";

    let path = |id: ObjectId, s: &str| format!("/tasks/{}/{s}", id.to_hex());
    assert_eq!(
        bytes(&dci, &path(ids[0], "stdout")).await,
        (
            200,
            text_plain.to_string(),
            b"line one\nline two\n".to_vec()
        )
    );
    assert_eq!(
        bytes(&dci, &path(ids[0], "stderr")).await,
        (200, text_plain.to_string(), "warn é\n".as_bytes().to_vec())
    );
    assert_eq!(
        bytes(&dci, &path(ids[1], "stdout")).await,
        (200, text_plain.to_string(), raw_bytes)
    );
    assert_eq!(
        bytes(&dci, &path(ids[1], "stderr")).await,
        (200, text_plain.to_string(), b"part 1, part 2".to_vec())
    );
    // Null output is empty.
    assert_eq!(
        bytes(&dci, &path(ids[2], "stdout")).await,
        (200, text_plain.to_string(), Vec::new())
    );

    let unknown = ObjectId::new();
    let (status, body) = dci.get(&path(unknown, "stdout")).await;
    assert_eq!(
        (status, body),
        (404, error(&format!("no task with id {}", unknown.to_hex())))
    );
    let (status, body) = dci.get(&path(unknown, "stderr")).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = dci.get("/tasks/nothex/stdout").await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].is_string(), "{body}");

    // .full reads binary chunks too.
    let (status, full) = dci
        .get(&format!("/tasks?id={}&.full=1&.limit=1", ids[1].to_hex()))
        .await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(full["stderr"], "part 1, part 2");
    assert!(
        full["stdout"]
            .as_str()
            .is_some_and(|s| s.starts_with("bin\u{0}ary")),
        "{full}"
    );
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn a_real_tasks_gridfs_output_streams_byte_for_byte() {
    let db = TestDb::new("api_task_gridfs").await;
    let config = write_config(&db, "node.json", json!({"gfs": true}));
    db.insert_queue("demo", "Disbatch::Plugin::Demo", 1).await;
    let den = Den::start(&config, "n1");
    let dci = Dci::start(&config);
    let (status, body) = dci
        .post(
            "/tasks",
            json!({"queue": "demo", "params": {"commands": "a1bA"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let id = inserted(&body)[0];
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    let task = db.task(id).await;
    let (Some(Bson::ObjectId(out)), Some(Bson::ObjectId(err))) =
        (task.get("stdout"), task.get("stderr"))
    else {
        panic!("gfs: true puts output in GridFS: {task}");
    };
    let mib = 1024 * 1024;
    let mut want_out = b"This is command 'a' for apple.\n".to_vec();
    want_out.extend(std::iter::repeat_n(b'1', mib));
    let mut want_err =
        b"This is command 'b' for banana: an error that does not fail the task.\n".to_vec();
    want_err.extend(std::iter::repeat_n(b'A', mib));

    let (status, ct, got) = bytes(&dci, &format!("/tasks/{}/stdout", id.to_hex())).await;
    assert_eq!((status, ct.as_str()), (200, "text/plain; charset=utf-8"));
    assert!(
        got == want_out,
        "stdout differs: {} bytes, want {}",
        got.len(),
        want_out.len()
    );
    let (status, _, got) = bytes(&dci, &format!("/tasks/{}/stderr", id.to_hex())).await;
    assert_eq!(status, 200);
    assert!(
        got == want_err,
        "stderr differs: {} bytes, want {}",
        got.len(),
        want_err.len()
    );

    let (_, plain) = dci.get(&format!("/tasks/{}", id.to_hex())).await;
    assert_eq!(
        (plain["stdout"].clone(), plain["stderr"].clone()),
        (oid(*out), oid(*err))
    );
    let (_, full) = dci
        .get(&format!("/tasks?id={}&.full=1&.limit=1", id.to_hex()))
        .await;
    assert!(
        full["stdout"].as_str().map(str::as_bytes) == Some(&want_out[..]),
        "full stdout"
    );
    assert!(
        full["stderr"].as_str().map(str::as_bytes) == Some(&want_err[..]),
        "full stderr"
    );
    drop(den);
    drop(dci);
    db.drop().await;
}
