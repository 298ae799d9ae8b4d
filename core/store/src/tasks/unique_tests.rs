//! Tests of `unique.rs`.

use super::*;
use disbatch_model::status;

fn unique(states: Vec<i32>, window_s: u64) -> Unique {
    Unique {
        key: "params.id".into(),
        states,
        window: Duration::from_secs(window_s),
    }
}

fn holder(status: Bson, ctime: Bson) -> Holder {
    Holder {
        id: ObjectId::new(),
        status,
        ctime,
        gen: 0,
        unit: None,
    }
}

#[test]
fn the_key_is_stamped_from_the_task_as_stored() {
    let u = unique(vec![status::QUEUED], 0);
    let mut t = doc! {"queue": ObjectId::new(), "params": {"id": "a1"}};
    t.insert(task::UNIQUE_GEN, 4_i64);
    assert_eq!(stamp_unique_key(&u, &mut t), Ok(Some(Bson::from("a1"))));
    assert!(!t.contains_key(task::UNIQUE_GEN), "placed afresh");
    assert_eq!(t.get_str(task::UNIQUE_KEY), Ok("a1"));
    let mut sub = doc! {"params": {"id": {"shop": 3, "sku": "x"}}};
    assert!(stamp_unique_key(&u, &mut sub).is_ok());
    assert_eq!(
        sub.get_document(task::UNIQUE_KEY).ok(),
        Some(&doc! {"shop": 3, "sku": "x"})
    );
}

#[test]
fn a_task_without_a_key_value_is_not_constrained() {
    let u = unique(vec![status::QUEUED], 0);
    for mut t in [
        doc! {"params": {"other": 1}},
        doc! {"params": {"id": null}},
        doc! {"params": "text"},
    ] {
        assert_eq!(stamp_unique_key(&u, &mut t), Ok(None), "{t}");
        assert!(!t.contains_key(task::UNIQUE_KEY), "{t}");
    }
}

#[test]
fn a_list_key_is_refused_naming_the_field() {
    let u = unique(vec![status::QUEUED], 0);
    let mut t = doc! {"params": {"id": [1, 2]}};
    let err = stamp_unique_key(&u, &mut t).expect_err("a list");
    assert!(err.contains("params.id") && err.contains("list"), "{err}");
    assert!(!t.contains_key(task::UNIQUE_KEY));
}

#[test]
fn later_repeats_of_a_key_in_one_request_are_marked() {
    let docs = vec![
        doc! {task::UNIQUE_KEY: "a"},
        doc! {},
        doc! {task::UNIQUE_KEY: "b"},
        doc! {task::UNIQUE_KEY: "a"},
        doc! {},
        doc! {task::UNIQUE_KEY: 7},
        doc! {task::UNIQUE_KEY: "7"},
        doc! {task::UNIQUE_KEY: "a"},
        doc! {task::UNIQUE_KEY: 7.0},
        doc! {task::UNIQUE_KEY: 7_i64},
    ];
    let none = vec![false; docs.len()];
    assert_eq!(
        repeated_keys(&docs, &none),
        [false, false, false, true, false, false, false, true, true, true]
    );
    // A skipped doc (a duplicate of a holder) is no first of its key.
    let mut skipped = none;
    skipped[0] = true;
    assert_eq!(
        repeated_keys(&docs, &skipped)[..4],
        [false, false, false, false]
    );
}

#[test]
fn numbers_are_one_key_by_value() {
    assert_eq!(key_bytes(&Bson::Int32(3)), key_bytes(&Bson::Double(3.0)));
    assert_eq!(key_bytes(&Bson::Int64(3)), key_bytes(&Bson::Int32(3)));
    assert_ne!(key_bytes(&Bson::Double(3.5)), key_bytes(&Bson::Int32(3)));
    assert_ne!(key_bytes(&Bson::from("3")), key_bytes(&Bson::Int32(3)));
}

#[test]
fn a_holder_is_read_from_a_task_or_a_group() {
    let id = ObjectId::new();
    let t = doc! {"_id": id, "status": -2, "ctime": 5.0, "unique_gen": 3_i64, "key": "u1"};
    let h = read_holder(&t, task::ID).expect("holder");
    assert_eq!((h.id, h.gen, h.unit.as_deref()), (id, 3, Some("u1")));
    let g = doc! {"_id": "the key", HOLDER: id, "status": 1, "unique_gen": 2};
    let h = read_holder(&g, HOLDER).expect("holder");
    assert_eq!((h.id, h.gen, h.unit), (id, 2, None));
    assert_eq!(read_holder(&doc! {"_id": "x"}, task::ID), None);
}

#[test]
fn a_holder_holds_in_its_states_or_within_its_window() {
    let now = DateTime::from_millis(1_000_000_000_000);
    let ago = |s: i64| Bson::DateTime(DateTime::from_millis(now.timestamp_millis() - s * 1000));
    let states = unique(vec![status::QUEUED, status::CLAIMED, status::RUNNING], 0);
    assert!(still_holds(
        &states,
        &holder(Bson::Int32(status::QUEUED), ago(5)),
        now
    ));
    assert!(still_holds(
        &states,
        &holder(Bson::Int64(status::RUNNING.into()), ago(5)),
        now
    ));
    assert!(!still_holds(
        &states,
        &holder(Bson::Int32(status::SUCCEEDED), ago(0)),
        now
    ));
    assert!(!still_holds(
        &states,
        &holder(Bson::String("-2".into()), ago(0)),
        now
    ));
    let window = unique(vec![status::QUEUED], 60);
    assert!(still_holds(
        &window,
        &holder(Bson::Int32(status::SUCCEEDED), ago(59)),
        now
    ));
    assert!(!still_holds(
        &window,
        &holder(Bson::Int32(status::SUCCEEDED), ago(61)),
        now
    ));
    // A ctime from a clock ahead of ours is within the window; none is outside it.
    assert!(still_holds(
        &window,
        &holder(Bson::Int32(status::FAILED), ago(-30)),
        now
    ));
    assert!(!still_holds(
        &window,
        &holder(Bson::Int32(status::FAILED), Bson::Null),
        now
    ));
    // Disbatch 3's epoch-seconds ctime.
    let secs = Bson::Double(now.timestamp_millis() as f64 / 1000.0 - 10.0);
    assert!(still_holds(
        &window,
        &holder(Bson::Int32(status::FAILED), secs),
        now
    ));
}

#[test]
fn the_unique_setting_is_read_alone() {
    let d = doc! {"name": "q", "rate_limit": "bad", "unique": {"key": "params.id"}};
    let u = unique_setting(&d).expect("parses").expect("unique");
    assert_eq!(u.key, "params.id");
    assert_eq!(unique_setting(&doc! {"name": "q"}), Ok(None));
    let bad = unique_setting(&doc! {"unique": {"key": "k", "states": ["done"]}});
    assert!(bad.expect_err("refused").contains("unknown state"));
}
