//! `disbatch create-users` refusing: users that exist (unless `--drop-roles`), and bad input that
//! creates nothing.

use bson::{doc, Document};
use disbatch_tests::write_config;
use serde_json::json;

use super::mongo_users::{
    as_user, auth_db, create_users, passwords, text, user_names, ROOT_PASSWORD, USERS,
};

#[tokio::test]
async fn existing_users_are_refused_and_drop_roles_replaces_them() {
    let db = auth_db("rerun").await;
    let config = write_config(&db, "node.json", json!({"auth": passwords("one")}));
    let out = create_users(&config, &[], ROOT_PASSWORD);
    assert!(out.status.success(), "{}", text(&out));
    as_user(&db, "disbatchd", "one")
        .await
        .collection::<Document>("tasks")
        .find_one(doc! {})
        .await
        .expect("first password works");

    // A second run with new passwords changes nothing and says why.
    let config = write_config(&db, "node.json", json!({"auth": passwords("two")}));
    let out = create_users(&config, &[], ROOT_PASSWORD);
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("already in database")
            && stderr.contains("user disbatchd")
            && stderr.contains("--drop-roles"),
        "{stderr}"
    );
    as_user(&db, "disbatchd", "one")
        .await
        .collection::<Document>("tasks")
        .find_one(doc! {})
        .await
        .expect("the refused run left the old password");

    let out = create_users(&config, &["--drop-roles"], ROOT_PASSWORD);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for user in USERS {
        assert!(
            stdout.contains(&format!("dropped user {user}"))
                && stdout.contains(&format!("dropped role {user}"))
                && stdout.contains(&format!("created role and user {user}")),
            "{user}: {stdout}"
        );
    }
    as_user(&db, "disbatchd", "two")
        .await
        .collection::<Document>("tasks")
        .find_one(doc! {})
        .await
        .expect("the new password works");
    assert!(
        as_user(&db, "disbatchd", "one")
            .await
            .collection::<Document>("tasks")
            .find_one(doc! {})
            .await
            .is_err(),
        "the old password no longer works"
    );

    // --drop-roles on a database without them skips what is missing.
    let fresh = auth_db("rerun_fresh").await;
    let config = write_config(&fresh, "node.json", json!({"auth": passwords("f")}));
    let out = create_users(&config, &["--drop-roles"], ROOT_PASSWORD);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("dropped"));
    assert_eq!(user_names(&fresh).await.len(), 5);
    fresh.drop().await;
    db.drop().await;
}

#[tokio::test]
async fn bad_input_is_refused_clearly_and_creates_nothing() {
    let db = auth_db("refused").await;

    let mut partial = passwords("p");
    partial.as_object_mut().expect("object").remove("plugin");
    let config = write_config(&db, "node.json", json!({"auth": partial}));
    let out = create_users(&config, &[], ROOT_PASSWORD);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no password for MongoDB user \"plugin\""),
        "{}",
        text(&out)
    );

    let config = write_config(&db, "node.json", json!({"auth": passwords("p")}));
    let out = create_users(&config, &[], "wrong");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("authentication failed"),
        "{}",
        text(&out)
    );

    let additional = db.path("additional.json");
    std::fs::write(&additional, r#"{"admin": {"tasks": ["remove"]}}"#).expect("write");
    let out = create_users(
        &config,
        &[
            "--additional-perms",
            additional.to_str().expect("utf-8 path"),
        ],
        ROOT_PASSWORD,
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"admin\""),
        "{}",
        text(&out)
    );

    // The server has users now, so the localhost exception is closed.
    let out = create_users(&config, &["--create-root"], ROOT_PASSWORD);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--create-root works only"),
        "{}",
        text(&out)
    );

    assert!(user_names(&db).await.is_empty(), "nothing was created");
    db.drop().await;
}
