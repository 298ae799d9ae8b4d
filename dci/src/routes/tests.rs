//! Tests of the route table in `routes/mod.rs`.

use super::*;

/// The policy in the book's REST API reference (docs/src/reference/api.md): only the console shell and the probes are public, reading
/// is `read`, and every change needs at least `operate`.
#[test]
fn every_route_has_the_role_its_kind_calls_for() {
    let public: Vec<&str> = table()
        .into_iter()
        .filter(|r| r.role == PUBLIC)
        .map(|r| r.path)
        .collect();
    assert_eq!(public, ["/", "/ui/{file}", "/healthz", "/readyz"]);
    for r in table() {
        let what = format!("{} {}", r.method, r.path);
        if matches!(r.path, "/" | "/ui/{file}" | "/healthz" | "/readyz") {
            assert_eq!(r.role, PUBLIC, "{what}");
        } else if r.method == Method::GET || (r.method == Method::POST && r.path == "/tasks/search")
        {
            assert_eq!(r.role, READ, "{what}");
        } else {
            assert!(
                r.role >= OPERATE,
                "{what} changes data: needs operate or admin"
            );
        }
    }
    let role = |method: Method, path: &str| {
        table()
            .into_iter()
            .find(|r| r.method == method && r.path == path)
            .and_then(|r| r.role)
    };
    for path in ["/queues", "/specs", "/balance"] {
        assert_eq!(role(Method::POST, path), Some(Role::Admin), "POST {path}");
    }
    assert_eq!(role(Method::DELETE, "/queues/{queue}"), Some(Role::Admin));
    assert_eq!(role(Method::POST, "/tasks"), Some(Role::Operate));
}
