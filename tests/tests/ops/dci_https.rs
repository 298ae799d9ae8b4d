//! HTTPS on the real `disbatch-web`: a private CA serving the API and the CLI, and bad TLS files
//! that stop the start.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use disbatch_tests::{bin_path, write_config, Dci, Launch, TestDb};
use reqwest::Method;
use serde_json::json;

use super::dci_access::{call, tokens_config, OPERATE, READ};

/// A private CA and a server certificate it signed for 127.0.0.1 and localhost, as PEM.
struct Pki {
    ca: String,
    cert: String,
    key: String,
}

fn private_pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.distinguished_name
        .push(DnType::CommonName, "disbatch test CA");
    let ca = ca.self_signed(&ca_key).expect("CA certificate");
    let key = KeyPair::generate().expect("server key");
    let mut server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("server params");
    server
        .distinguished_name
        .push(DnType::CommonName, "disbatch-web");
    let cert = server
        .signed_by(&key, &ca, &ca_key)
        .expect("server certificate");
    Pki {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

/// `disbatch` with a clean environment for its own variables plus `env`.
fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(bin_path("disbatch"));
    for var in [
        "DISBATCH_URL",
        "DISBATCH_TOKEN",
        "DISBATCH_CACERT",
        "DISBATCH_NAMESPACE",
    ] {
        command.env_remove(var);
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run disbatch")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn https_with_a_private_ca_serves_the_api_and_the_cli() {
    let db = TestDb::new("access_tls").await;
    db.insert_queue("tls-queue", "echo", 0).await;
    let pki = private_pki();
    std::fs::create_dir(db.path("tls")).expect("tls dir");
    std::fs::write(db.path("tls/cert.pem"), &pki.cert).expect("cert");
    std::fs::write(db.path("tls/key.pem"), &pki.key).expect("key");
    let ca_file = db.path("ca.pem");
    std::fs::write(&ca_file, &pki.ca).expect("ca");
    // Relative paths resolve against the config's directory.
    let config = tokens_config(
        &db,
        "tls.json",
        json!({"tls": {"cert_file": "tls/cert.pem", "key_file": "tls/key.pem"}}),
    );
    let dci = Dci::launch(
        &config,
        Launch {
            ca_pem: Some(pki.ca.clone().into_bytes()),
            ..Launch::default()
        },
    );
    assert!(dci.url.starts_with("https://127.0.0.1:"), "{}", dci.url);

    let (status, _, body) = call(&dci, Method::GET, "/queues", Some(READ), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body[0]["name"], "tls-queue", "{body}");
    let (status, _, _) = call(&dci, Method::GET, "/queues", None, None).await;
    assert_eq!(status, 401, "tokens apply over HTTPS too");

    // Plain HTTP to the TLS port gets no answer, and a client that does not trust the CA
    // gets no connection.
    let plain = dci.url.replacen("https://", "http://", 1);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("client");
    let r = client
        .get(format!("{plain}/queues"))
        .bearer_auth(READ)
        .send()
        .await;
    assert!(r.is_err(), "plain HTTP was answered: {r:?}");
    let r = client.get(dci.at("/queues")).bearer_auth(READ).send().await;
    assert!(r.is_err(), "an untrusted certificate was accepted: {r:?}");

    // The CLI: --cacert (or DISBATCH_CACERT) and DISBATCH_TOKEN.
    let ca = ca_file.to_str().expect("path");
    let out = cli(
        &["--url", &dci.url, "--cacert", ca, "queues"],
        &[("DISBATCH_TOKEN", READ)],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("tls-queue"),
        "{}",
        text(&out)
    );
    let out = cli(
        &["--url", &dci.url, "queues"],
        &[("DISBATCH_TOKEN", READ), ("DISBATCH_CACERT", ca)],
    );
    assert!(out.status.success(), "{}", text(&out));

    // Without the CA, without a token, or with too low a role: a clear failure.
    let out = cli(&["--url", &dci.url, "queues"], &[("DISBATCH_TOKEN", READ)]);
    assert!(!out.status.success(), "{}", text(&out));
    let out = cli(&["--url", &dci.url, "--cacert", ca, "queues"], &[]);
    assert!(!out.status.success());
    let shown = text(&out);
    assert!(
        shown.contains("401") && shown.contains("DISBATCH_TOKEN"),
        "{shown}"
    );
    let out = cli(
        &[
            "--url",
            &dci.url,
            "--cacert",
            ca,
            "create-queue",
            "x",
            "echo",
        ],
        &[("DISBATCH_TOKEN", OPERATE)],
    );
    assert!(!out.status.success());
    let shown = text(&out);
    assert!(
        shown.contains("403") && shown.contains("role cannot do this"),
        "{shown}"
    );
    assert!(
        !shown.contains(OPERATE),
        "the CLI printed the token: {shown}"
    );
    let out = cli(
        &[
            "--url",
            &dci.url,
            "--cacert",
            &config.display().to_string(),
            "queues",
        ],
        &[("DISBATCH_TOKEN", READ)],
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("--cacert"), "{}", text(&out));

    // SIGTERM still stops the HTTPS server cleanly.
    let status = dci.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}");
    db.drop().await;
}

/// Runs `disbatch-web` expecting it to exit at start; returns (success, stderr). Awaits the
/// exit, so the test's runtime (its database client) keeps running meanwhile.
async fn failed_start(config: &Path) -> (bool, String) {
    let mut child = Command::new(bin_path("disbatch-web"))
        .arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn disbatch-web");
    let deadline = Instant::now() + disbatch_tests::scaled(Duration::from_secs(30));
    let mut backoff = disbatch_tests::Backoff::new();
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("disbatch-web kept running with a bad web.tls");
        }
        backoff.wait().await;
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn bad_tls_files_stop_the_start_naming_the_file() {
    let db = TestDb::new("access_bad_tls").await;
    let pki = private_pki();
    std::fs::write(db.path("cert.pem"), &pki.cert).expect("cert");
    std::fs::write(db.path("key.pem"), &pki.key).expect("key");
    std::fs::write(db.path("junk.pem"), "not a key\n").expect("junk");

    let missing = db.path("missing-cert.pem");
    let config = write_config(
        &db,
        "missing.json",
        json!({"web": {"tls": {"cert_file": missing, "key_file": "key.pem"}}}),
    );
    let (ok, stderr) = failed_start(&config).await;
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(&missing.display().to_string()) && stderr.contains("web.tls.cert_file"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    let config = write_config(
        &db,
        "junk.json",
        json!({"web": {"tls": {"cert_file": "cert.pem", "key_file": "junk.pem"}}}),
    );
    let (ok, stderr) = failed_start(&config).await;
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(&db.path("junk.pem").display().to_string())
            && stderr.contains("web.tls.key_file"),
        "{stderr}"
    );

    // A key that does not belong to the certificate.
    let other = private_pki();
    std::fs::write(db.path("other-key.pem"), &other.key).expect("key");
    let config = write_config(
        &db,
        "mismatch.json",
        json!({"web": {"tls": {"cert_file": "cert.pem", "key_file": "other-key.pem"}}}),
    );
    let (ok, stderr) = failed_start(&config).await;
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("other-key.pem"), "{stderr}");
    db.drop().await;
}
