//! The Debian package (`scripts/package`), built from the debug binaries: what it holds, its
//! control data and units, and the unpacked binaries at work — the packaged `disbatchd`, with
//! the packaged config pointed at the test database, runs a task that the packaged `disbatch`
//! queued through the packaged `disbatch-web`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use bson::{doc, Document};
use disbatch_config::Config;
use disbatch_model::status;
use disbatch_tests::{bin_path, Dci, Den, Launch, TestDb};
use futures::TryStreamExt;

const BINARIES: [&str; 4] = [
    "disbatchd",
    "disbatch-task-runner",
    "disbatch-web",
    "disbatch",
];
const PLUGINS: [&str; 3] = [
    "disbatch-plugin-demo",
    "disbatch-plugin-echo",
    "disbatch-plugin-noop",
];
const CONFIG: &str = "etc/disbatch/config.json";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Output {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {program}: {e}; the package tests need dpkg-deb (package dpkg), \
             dpkg-shlibdeps (dpkg-dev), strip (binutils) and systemd-analyze (systemd), which \
             scripts/test installs"
        )
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run(cmd).stdout).into_owned()
}

/// The workspace version as Debian spells it, with the script's default revision.
fn deb_version() -> String {
    format!("{}-1", env!("CARGO_PKG_VERSION"))
}

/// The package, built once per test binary from the debug build this test belongs to, into
/// the script's default place for it (`<target>/debian/debug`), which each run overwrites.
fn package() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| {
        run(Command::new("dpkg-deb").arg("--version"));
        let target = bin_path("disbatchd")
            .parent()
            .and_then(Path::parent)
            .expect("target directory")
            .to_path_buf();
        let printed = stdout(
            Command::new(workspace().join("scripts/package"))
                .args(["--profile", "dev", "--no-build"])
                .env("CARGO_TARGET_DIR", &target),
        );
        let deb = PathBuf::from(printed.lines().last().expect("the script prints the .deb"));
        let arch = stdout(Command::new("dpkg").arg("--print-architecture"));
        assert_eq!(
            deb,
            target.join("debian/debug").join(format!(
                "disbatch_{}_{}.deb",
                deb_version(),
                arch.trim()
            )),
            "the dev profile's package goes to <target>/debian/debug"
        );
        assert!(deb.is_file(), "{} was not written", deb.display());
        deb
    })
}

/// The package unpacked into a scratch root (what `dpkg -i` puts on disk, without running
/// its maintainer scripts).
fn unpack() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("scratch root");
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(package())
        .arg(root.path()));
    root
}

/// `dpkg-deb -c`: path (without the leading `.`) → (mode, owner/group).
fn contents() -> BTreeMap<String, (String, String)> {
    stdout(Command::new("dpkg-deb").arg("-c").arg(package()))
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = fields.last().expect("path").trim_start_matches('.');
            (
                path.to_string(),
                (fields[0].to_string(), fields[1].to_string()),
            )
        })
        .collect()
}

/// The `Key=Value` lines of a unit's `[Service]` section (repeated keys keep the last).
fn service_section(unit: &str) -> BTreeMap<String, String> {
    let mut in_service = false;
    let mut keys = BTreeMap::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service && !line.starts_with('#') {
            if let Some((k, v)) = line.split_once('=') {
                keys.insert(k.to_string(), v.to_string());
            }
        }
    }
    keys
}

#[test]
fn package_holds_binaries_plugins_units_docs_and_the_config_as_a_conffile() {
    let listed = contents();
    let expected = expected_files();
    for (path, (mode, owner)) in &expected {
        let got = listed
            .get(path)
            .unwrap_or_else(|| panic!("{path} is not in the package: {listed:#?}"));
        assert_eq!((got.0.as_str(), got.1.as_str()), (*mode, *owner), "{path}");
    }
    let files: BTreeSet<&String> = listed
        .iter()
        .filter(|(_, (mode, _))| !mode.starts_with('d'))
        .map(|(path, _)| path)
        .collect();
    assert_eq!(
        files,
        expected.keys().collect::<BTreeSet<_>>(),
        "the package holds exactly the expected files"
    );

    check_the_control_fields();

    let control = tempfile::tempdir().expect("control dir");
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(package())
        .arg(control.path()));
    let read = |name: &str| {
        std::fs::read_to_string(control.path().join(name))
            .unwrap_or_else(|e| panic!("control file {name}: {e}"))
    };
    assert_eq!(read("conffiles"), format!("/{CONFIG}\n"));
    let summed: BTreeSet<String> = read("md5sums")
        .lines()
        .filter_map(|l| l.split_once("  "))
        .map(|(_, path)| format!("/{path}"))
        .collect();
    assert_eq!(
        summed.iter().collect::<BTreeSet<_>>(),
        files,
        "md5sums covers every file"
    );
    for script in ["postinst", "prerm", "postrm"] {
        let path = control.path().join(script);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).expect("script").permissions(),
        );
        assert_eq!(mode & 0o777, 0o755, "{script} is executable");
        run(Command::new("sh").arg("-n").arg(&path));
    }
    let postinst = read("postinst");
    for needle in [
        "useradd --system",
        "dpkg-statoverride --update --add root disbatch 0640 \"$CONFIG\"",
        "systemctl daemon-reload",
    ] {
        assert!(postinst.contains(needle), "postinst lacks {needle:?}");
    }
    // Units are never enabled by the package: the admin writes the config first.
    let enabling: Vec<&str> = postinst
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains("systemctl enable"))
        .collect();
    assert!(enabling.is_empty(), "postinst enables units: {enabling:?}");
}

fn expected_files() -> BTreeMap<String, (&'static str, &'static str)> {
    let mut expected: BTreeMap<String, (&str, &str)> = BTreeMap::new();
    for bin in BINARIES {
        expected.insert(format!("/usr/bin/{bin}"), ("-rwxr-xr-x", "root/root"));
    }
    for plugin in PLUGINS {
        expected.insert(
            format!("/usr/lib/disbatch/plugins/{plugin}"),
            ("-rwxr-xr-x", "root/root"),
        );
    }
    for unit in ["disbatchd.service", "disbatch-web.service"] {
        expected.insert(
            format!("/usr/lib/systemd/system/{unit}"),
            ("-rw-r--r--", "root/root"),
        );
    }
    // The config will hold MongoDB passwords: never world-readable, even before postinst.
    expected.insert(format!("/{CONFIG}"), ("-rw-r-----", "root/root"));
    for doc in [
        "copyright",
        "README.md",
        "config.example.json",
        "PROTOCOL.md",
    ] {
        expected.insert(
            format!("/usr/share/doc/disbatch/{doc}"),
            ("-rw-r--r--", "root/root"),
        );
    }
    // The persistent-worker helper for Python plugins, and its example.
    for file in ["disbatch_worker.py", "example_worker.py"] {
        expected.insert(
            format!("/usr/share/disbatch/python/{file}"),
            ("-rw-r--r--", "root/root"),
        );
    }
    expected
}

fn check_the_control_fields() {
    let fields: BTreeMap<String, String> =
        stdout(Command::new("dpkg-deb").arg("--field").arg(package()))
            .lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    assert_eq!(fields.get("Package").map(String::as_str), Some("disbatch"));
    assert_eq!(fields.get("Version"), Some(&deb_version()));
    let arch = stdout(Command::new("dpkg").arg("--print-architecture"));
    assert_eq!(
        fields.get("Architecture").map(String::as_str),
        Some(arch.trim())
    );
    let depends = fields.get("Depends").expect("Depends");
    for dep in ["libc6 (>= ", "passwd"] {
        assert!(depends.contains(dep), "Depends: {depends}");
    }
    let size: u64 = fields
        .get("Installed-Size")
        .and_then(|s| s.parse().ok())
        .expect("Installed-Size");
    assert!(size > 1000, "Installed-Size {size} KiB");
}

#[test]
fn units_keep_running_tasks_across_restarts_and_reload_on_sighup() {
    let root = unpack();
    let unit_dir = root.path().join("usr/lib/systemd/system");
    let den_unit = std::fs::read_to_string(unit_dir.join("disbatchd.service")).expect("den unit");
    let den = service_section(&den_unit);
    let web_unit =
        std::fs::read_to_string(unit_dir.join("disbatch-web.service")).expect("web unit");
    let web = service_section(&web_unit);

    let get = |keys: &BTreeMap<String, String>, k: &str| keys.get(k).cloned().unwrap_or_default();
    assert_eq!(
        get(&den, "ExecStart"),
        "/usr/bin/disbatchd --config /etc/disbatch/config.json"
    );
    assert_eq!(
        get(&web, "ExecStart"),
        "/usr/bin/disbatch-web --config /etc/disbatch/config.json"
    );
    // The README's promise: a DEN restart or upgrade leaves running task runners alone.
    assert_eq!(get(&den, "KillMode"), "process");
    for keys in [&den, &web] {
        assert_eq!(get(keys, "Restart"), "on-failure");
        assert_eq!(get(keys, "ExecReload"), "/bin/kill -HUP $MAINPID");
        assert_eq!(get(keys, "User"), "disbatch");
        assert_eq!(get(keys, "NoNewPrivileges"), "yes");
    }
    assert_eq!(get(&den, "ProtectSystem"), "full");
    assert_eq!(get(&den, "ProtectHome"), "read-only");
    // systemd empties a unit's private /tmp when it stops, under the runners that outlive it.
    assert!(
        !den.contains_key("PrivateTmp"),
        "disbatchd must not have PrivateTmp: {den:?}"
    );
    assert!(den_unit.contains("WantedBy=multi-user.target"));

    // systemd's own check, with the commands pointed into the scratch root (verify insists
    // that they exist).
    let checked = tempfile::tempdir().expect("unit dir");
    let usr_bin = format!("{}/usr/bin/", root.path().display());
    let mut verify = Command::new("systemd-analyze");
    verify.arg("verify");
    for (name, text) in [
        ("disbatchd.service", &den_unit),
        ("disbatch-web.service", &web_unit),
    ] {
        let path = checked.path().join(name);
        std::fs::write(&path, text.replace("/usr/bin/", &usr_bin)).expect("write unit");
        verify.arg(path);
    }
    let out = run(&mut verify);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !said.contains("disbatch"),
        "systemd-analyze verify has something to say about the units:\n{said}"
    );
}

/// Hardening both units carry: none of it takes from a plugin what it may need.
const HARDENING: &[(&str, &str)] = &[
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectHostname", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("RestrictRealtime", "yes"),
    ("LockPersonality", "yes"),
    ("UMask", "0077"),
];

/// What disbatch-web, which runs no plugin, carries besides.
const WEB_HARDENING: &[(&str, &str)] = &[
    ("ProtectClock", "yes"),
    ("CapabilityBoundingSet", ""),
    ("SystemCallFilter", "@system-service"),
    ("MemoryDenyWriteExecute", "yes"),
    ("RestrictNamespaces", "yes"),
];

/// `systemd-analyze security` scores (0 safest, 10 most exposed) the units must not exceed:
/// what they scored when the hardening above was added (8.8 and 6.5 before it).
const MAX_EXPOSURE: &[(&str, f64)] = &[("disbatchd.service", 7.5), ("disbatch-web.service", 1.8)];

#[test]
fn units_carry_their_hardening_and_keep_their_exposure_score() {
    let root = unpack();
    let unit_dir = root.path().join("usr/lib/systemd/system");
    let checked = tempfile::tempdir().expect("unit dir");
    let usr_bin = format!("{}/usr/bin/", root.path().display());
    for (name, max) in MAX_EXPOSURE {
        let text = std::fs::read_to_string(unit_dir.join(name)).expect("unit");
        let keys = service_section(&text);
        let web = WEB_HARDENING
            .iter()
            .filter(|_| *name == "disbatch-web.service");
        for (key, value) in HARDENING.iter().chain(web) {
            assert_eq!(
                keys.get(*key).map(String::as_str),
                Some(*value),
                "{name}: {key}={value}"
            );
        }
        assert_eq!(
            keys.get("RuntimeDirectory").map(String::as_str),
            (*name == "disbatchd.service").then_some("disbatchd"),
            "{name}: the DEN's runtime directory holds the runners' config copy"
        );
        let path = checked.path().join(name);
        std::fs::write(&path, text.replace("/usr/bin/", &usr_bin)).expect("write unit");
        let out = run(Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(&path));
        let said = String::from_utf8_lossy(&out.stdout);
        let marker = format!("Overall exposure level for {name}: ");
        let score: f64 = said
            .lines()
            .find_map(|l| l.split_once(&marker).map(|(_, rest)| rest))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no exposure score for {name}:\n{said}"));
        println!("{name}: exposure {score}");
        assert!(
            score <= *max,
            "{name}: exposure {score} above {max}:\n{said}"
        );
    }
}

#[test]
fn unpacked_binaries_report_the_package_version_and_their_usage() {
    let root = unpack();
    let version = env!("CARGO_PKG_VERSION");
    for bin in BINARIES {
        let path = root.path().join("usr/bin").join(bin);
        let said = stdout(Command::new(&path).arg("--version"));
        // `NAME VERSION (git SHA)`: each program by its installed name, with its build.
        let prefix = format!("{bin} {version} (git ");
        assert!(
            said.starts_with(&prefix) && said.trim_end().ends_with(')'),
            "{bin} --version: {said:?}"
        );
        let help = stdout(Command::new(&path).arg("--help"));
        assert!(help.contains("Usage:"), "{bin} --help: {help}");
    }
}

#[tokio::test]
async fn unpacked_node_runs_a_task_queued_with_the_unpacked_cli_and_dci() {
    let root = unpack();
    let db = TestDb::new("package").await;

    // The packaged config as shipped (it must load without a warning), then pointed at the
    // test database and at the scratch root, the way an admin edits it.
    let shipped = root.path().join(CONFIG);
    let loaded = Config::load(&shipped).expect("the packaged config loads");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert!(loaded.config.plugins.is_listed("Disbatch::Plugin::Demo"));
    assert!(
        !loaded.config.plugins.is_listed("echo"),
        "the echo plugin writes where a task says: not allowed by default"
    );
    let mut text = std::fs::read_to_string(&shipped).expect("packaged config");
    let root_usr = format!("\"{}/usr/", root.path().display());
    for (from, to) in [
        (
            "\"mongodb://127.0.0.1:27017/\"".to_string(),
            serde_json::to_string(&db.uri).expect("uri"),
        ),
        (
            "\"database\": \"disbatch\"".to_string(),
            format!(
                "\"database\": {}",
                serde_json::to_string(&db.name).expect("name")
            ),
        ),
        ("\"/usr/".to_string(), root_usr),
    ] {
        assert!(text.contains(&from), "the packaged config has no {from}");
        text = text.replace(&from, &to);
    }
    let config = db.path("config.json");
    std::fs::write(&config, text).expect("write config");
    assert!(
        root.path()
            .join("usr/lib/disbatch/plugins/disbatch-plugin-demo")
            .is_file(),
        "the configured plugin is packaged"
    );

    let dci = Dci::launch(
        &config,
        Launch {
            binary: Some(root.path().join("usr/bin/disbatch-web")),
            log_file: Some(db.path("web.log")),
            ..Launch::default()
        },
    );
    let cli = |args: &[&str]| {
        stdout(
            Command::new(root.path().join("usr/bin/disbatch"))
                .arg("--url")
                .arg(&dci.url)
                .args(args),
        )
    };
    let created = cli(&[
        "create-queue",
        "packaged",
        "Disbatch::Plugin::Demo",
        "--threads",
        "2",
    ]);
    assert!(created.starts_with("Created queue packaged"), "{created}");
    let tasks = cli(&["create-tasks", "packaged", r#"[{"commands":"ab"}]"#]);
    assert!(tasks.starts_with("Created 1 task in"), "{tasks}");

    // The task runner is not in the config: the DEN finds the packaged one beside itself.
    let den = Den::start_adjusted(
        &root.path().join("usr/bin/disbatchd"),
        &config,
        "packaged-node",
        &[],
        |_| {},
    );
    let ids: Vec<bson::oid::ObjectId> = db
        .tasks()
        .find(doc! {})
        .await
        .expect("find tasks")
        .try_collect::<Vec<Document>>()
        .await
        .expect("tasks")
        .iter()
        .map(|t| t.get_object_id("_id").expect("_id"))
        .collect();
    assert_eq!(ids.len(), 1);
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let task = db.task(ids[0]).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}\n{}",
        den.log_text()
    );
    assert_eq!(task.get_str("node").ok(), Some("packaged-node"), "{task}");
    assert_eq!(
        task.get_str("stdout").ok(),
        Some("This is command 'a' for apple.\n"),
        "{task}"
    );
    assert!(
        task.get_str("stderr")
            .is_ok_and(|e| e.contains("command 'b' for banana")),
        "{task}"
    );
    drop(den);
    drop(dci);
    db.drop().await;
}
