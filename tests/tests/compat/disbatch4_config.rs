//! Disbatch 4's own `config.json-example` (its `#` comments, trailing commas, `attributes.ssl`
//! and `auth` users), changed only in `mongohost` and `database`, run by the real `disbatchd`
//! and `disbatch-web` against TLS and plain servers with access control.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use disbatch_tests::{
    bin_path, start_auth_server, start_tls_auth_server, wait_for, Dci, Den, Launch, ServerTls,
};
use mongodb::options::{ClientOptions, Credential, Tls, TlsOptions};
use mongodb::Client;
use serde_json::json;

const EXAMPLE: &str = include_str!("../../fixtures/disbatch4-config.json-example");
const EXAMPLE_MONGOHOST: &str = r#""mongohost": "mongodb://127.0.0.1:27017","#;
const EXAMPLE_DATABASE: &str = r#""database": "disbatch_test","#;
const EXAMPLE_CA_FILE: &str = "/etc/ssl/certs/ca-bundle.crt";
const ROOT: &str = "root";
const ROOT_PASSWORD: &str = "d4-root-secret";

/// The example with `mongohost` and `database` replaced, and nothing else.
fn example_with(mongohost: &str, database: &str) -> String {
    assert_eq!(EXAMPLE.matches(EXAMPLE_MONGOHOST).count(), 1);
    assert_eq!(EXAMPLE.matches(EXAMPLE_DATABASE).count(), 1);
    EXAMPLE
        .replace(
            EXAMPLE_MONGOHOST,
            &format!(r#""mongohost": {},"#, json!(mongohost)),
        )
        .replace(
            EXAMPLE_DATABASE,
            &format!(r#""database": {},"#, json!(database)),
        )
}

/// `text` without the `ssl` member of `attributes`, and nothing else removed.
fn without_ssl(text: &str) -> String {
    let start = text
        .find(r#""ssl": {"#)
        .expect("the example has attributes.ssl");
    let start = text[..start].rfind('\n').expect("line start") + 1;
    let close = "\n        },\n";
    let end = start + text[start..].find(close).expect("the end of ssl") + close.len();
    let out = format!("{}{}", &text[..start], &text[end..]);
    assert!(!out.contains("SSL_ca_file") && out.contains(r#""attributes": {"#));
    out
}

struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
}

/// A private CA and a server certificate it signed for 127.0.0.1, as files.
fn private_pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.distinguished_name
        .push(DnType::CommonName, "disbatch4 config test CA");
    let ca = ca.self_signed(&ca_key).expect("CA certificate");
    let key = KeyPair::generate().expect("server key");
    let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("server params");
    let cert = server
        .signed_by(&key, &ca, &ca_key)
        .expect("server certificate");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write CA");
    std::fs::write(dir.path().join("server.pem"), cert.pem()).expect("write cert");
    std::fs::write(dir.path().join("server.key"), key.serialize_pem()).expect("write key");
    Pki { dir }
}

/// One TLS-only server with access control for this test binary, and its CA.
fn tls_server() -> &'static (String, Pki) {
    static SERVER: OnceLock<(String, Pki)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let pki = private_pki();
        let uri = start_tls_auth_server(ServerTls {
            cert_file: &pki.dir.path().join("server.pem"),
            key_file: &pki.dir.path().join("server.key"),
        });
        (uri, pki)
    })
}

/// `uri` without its scheme: the bare host form Perl sites write.
fn bare(uri: &str) -> &str {
    uri.strip_prefix("mongodb://").expect("a mongodb:// URI")
}

/// Writes the config, and puts a runner where the example's `task_runner` (`./bin/task_runner`,
/// relative to the config) points, as a Disbatch checkout has one there.
fn write(dir: &Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("bin")).expect("bin dir");
    std::os::unix::fs::symlink(
        bin_path("disbatch-task-runner"),
        dir.join("bin/task_runner"),
    )
    .expect("link the task runner");
    let path = dir.join("config.json");
    std::fs::write(&path, text).expect("write config");
    path
}

/// Runs `cmd` to its exit, which must come: a binary that cannot reach its server over TLS
/// gives up rather than serving or retrying for ever. The deadline is only when to stop
/// waiting for that (scaled by `DISBATCH_TEST_SLOWDOWN`), not a speed the test asks for.
async fn exit_of(mut cmd: Command, dir: &Path, name: &str) -> Output {
    let (out_path, err_path) = (
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.err")),
    );
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("run");
    let give_up = disbatch_tests::scaled(Duration::from_secs(120));
    let deadline = Instant::now() + give_up;
    let mut backoff = disbatch_tests::Backoff::new();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name} still running {give_up:?} after its start; stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        backoff.wait().await;
    };
    Output {
        status,
        stdout: std::fs::read(&out_path).unwrap_or_default(),
        stderr: std::fs::read(&err_path).unwrap_or_default(),
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The root user (localhost exception) and Disbatch's five users with the example's passwords.
fn create_users(config: &Path) {
    use std::io::Write;
    let mut child = Command::new(bin_path("disbatch"))
        .arg("create-users")
        .arg("--config")
        .arg(config)
        .args(["--root-user", ROOT, "--create-root"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn disbatch");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{ROOT_PASSWORD}").expect("write password");
    drop(stdin);
    let out = child.wait_with_output().expect("disbatch output");
    assert!(out.status.success(), "create-users: {}", text(&out));
}

async fn root_client(uri: &str, ca: Option<&Path>) -> Client {
    let mut options = ClientOptions::parse(uri).await.expect("parse uri");
    if let Some(ca) = ca {
        options.tls = Some(Tls::Enabled(
            TlsOptions::builder().ca_file_path(ca.to_path_buf()).build(),
        ));
    }
    options.credential = Some(
        Credential::builder()
            .username(ROOT.to_string())
            .password(ROOT_PASSWORD.to_string())
            .source("admin".to_string())
            .build(),
    );
    Client::with_options(options).expect("client")
}

/// Starts both binaries on `config` and checks they work as the example's users: the DEN
/// heartbeats its `nodes` document, the DCI lists it and shows the balance settings as written.
async fn both_serve(config: &Path, client: &Client, database: &str, node: &str) {
    let mut den = Den::start(config, node);
    let nodes = client.database(database).collection::<Document>("nodes");
    wait_for("the DEN's heartbeat", Duration::from_secs(60), || async {
        nodes
            .find_one(doc! {"node": node})
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await;
    assert!(den.is_running(), "{}", den.log_text());
    let dci_log = config.with_file_name(format!("dci-{node}.log"));
    let dci = Dci::launch(
        config,
        Launch {
            log_file: Some(dci_log.clone()),
            rust_log: Some("info".into()),
            ..Launch::default()
        },
    );
    let (status, body) = dci.get("/nodes").await;
    assert_eq!(status, 200, "{body}");
    let listed = body.as_array().expect("an array of nodes");
    assert!(
        listed.iter().any(|n| n["node"] == json!(node)),
        "{node} not in {body}"
    );
    let (status, body) = dci.get("/balance").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["settings"],
        json!({"log": true, "verbose": false, "pretend": false, "enabled": false})
    );
    assert!(dci.terminate().success());
    assert_eq!(den.stop(), Some(0), "{}", den.log_text());
    // Neither binary complained about the file: no config error, no ignored key.
    let said = std::fs::read_to_string(&dci_log).expect("DCI log") + &den.log_text();
    for complaint in ["config file", "is ignored", "not applied", "unknown key"] {
        assert!(!said.contains(complaint), "{complaint}: {said}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_as_it_is_fails_only_at_tls_naming_its_ca_file() {
    let (uri, _pki) = tls_server();
    let dir = tempfile::tempdir().expect("tempdir");
    let database = format!("d4_as_is_{}", std::process::id());
    // The bare host form, as the Perl driver took it; the CA file is the example's own.
    let config = write(dir.path(), &example_with(bare(uri), &database));
    let ca_missing = !Path::new(EXAMPLE_CA_FILE).exists();
    for program in ["disbatchd", "disbatch-web"] {
        let own = match program {
            "disbatchd" => ["--node", "d4-as-is"],
            _ => ["--listen", "127.0.0.1:0"],
        };
        let mut cmd = Command::new(bin_path(program));
        cmd.arg("--config")
            .arg(&config)
            .args(own)
            .env("RUST_LOG", "warn");
        let out = exit_of(cmd, dir.path(), program).await;
        let said = text(&out);
        assert!(!out.status.success(), "{program}: {said}");
        assert!(
            !said.contains("config file"),
            "{program}: a config error: {said}"
        );
        if ca_missing {
            assert!(said.contains(EXAMPLE_CA_FILE), "{program}: {said}");
        } else {
            // A system CA bundle is there: our private server certificate is not in it.
            assert!(
                said.to_lowercase().contains("certificate"),
                "{program}: {said}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_serves_over_tls_as_its_auth_users() {
    let (uri, pki) = tls_server();
    let dir = tempfile::tempdir().expect("tempdir");
    let database = format!("d4_tls_{}", std::process::id());
    // The server's CA through the URI, which wins over `attributes.ssl.SSL_ca_file`, as the
    // Perl driver's URI options do: TLS stays on from the example's `attributes`.
    let mongohost = format!("{uri}&tlsCAFile={}", pki.ca().display());
    let config = write(dir.path(), &example_with(&mongohost, &database));
    create_users(&config);
    let client = root_client(uri, Some(&pki.ca())).await;
    both_serve(&config, &client, &database, "d4-tls").await;
    let _ = client.database(&database).drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_without_ssl_serves_on_a_plain_server_as_its_auth_users() {
    let uri = start_auth_server();
    let dir = tempfile::tempdir().expect("tempdir");
    let database = format!("d4_plain_{}", std::process::id());
    let config = write(
        dir.path(),
        &without_ssl(&example_with(bare(&uri), &database)),
    );
    create_users(&config);
    let client = root_client(&uri, None).await;
    both_serve(&config, &client, &database, "d4-plain").await;
}
