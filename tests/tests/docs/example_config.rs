//! The shipped example config stays valid as keys are added.

use disbatch_config::Config;

#[test]
fn config_example_json_parses_without_warnings() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config.example.json");
    let loaded = Config::load(path).expect("config.example.json is valid");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert!(loaded.config.plugins.is_listed("Disbatch::Plugin::Demo"));
    assert!(loaded.config.tls.enabled);
}
