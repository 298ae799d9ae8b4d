//! Tests of `batch.rs`.

use super::*;

#[test]
fn a_claimed_document_carries_the_claim_and_counts_the_attempt() {
    let id = ObjectId::new();
    let read =
        doc! {"_id": id, "status": -2, "node": Bson::Null, "params": {"a": 1}, "attempts": 2_i64};
    let set = doc! {"node": "n1", "status": 0, "slot": 3_i64};
    let doc = claimed_document(&read, &set);
    assert_eq!(doc.get_str("node").ok(), Some("n1"));
    assert_eq!(doc.get_i32("status").ok(), Some(0));
    assert_eq!(doc.get_i64("attempts").ok(), Some(3));
    assert_eq!(doc.get_document("params").ok(), Some(&doc! {"a": 1}));
    let first = claimed_document(&doc! {"_id": id}, &set);
    assert_eq!(first.get_i32("attempts").ok(), Some(1));
    let double = claimed_document(&doc! {"_id": id, "attempts": 1.0}, &set);
    assert_eq!(double.get_f64("attempts").ok(), Some(2.0));
}

#[test]
fn a_claim_key_is_the_ids_counter() {
    let id = ObjectId::from_bytes([0, 0, 0, 1, 9, 9, 9, 9, 9, 0, 1, 2]);
    assert_eq!(claim_key(&doc! {"_id": id}), 258);
    assert_eq!(claim_key(&doc! {"_id": "text"}), 0);
    let a = ObjectId::new();
    let b = ObjectId::new();
    assert_eq!(claim_key(&doc! {"_id": b}), claim_key(&doc! {"_id": a}) + 1);
}

#[test]
fn a_claim_matches_only_the_task_as_read() {
    let id = ObjectId::new();
    let at = DateTime::from_millis(5);
    let filter = still_as_read(&doc! {"_id": id, "node": -1, "mtime": at, "status": -2});
    assert_eq!(
        filter,
        doc! {"_id": {"$eq": id}, "status": -2, "node": {"$eq": -1}, "mtime": {"$eq": at}}
    );
    // Missing fields match only documents still missing them (null matches missing).
    let bare = still_as_read(&doc! {"_id": id});
    assert_eq!(
        bare.get("mtime"),
        Some(&Bson::from(doc! {"$eq": Bson::Null}))
    );
    assert_eq!(
        bare.get("node"),
        Some(&Bson::from(doc! {"$eq": Bson::Null}))
    );
    // A stored value shaped like an operator is compared as it is.
    let odd = doc! {"$date": "x"};
    let filter = still_as_read(&doc! {"_id": id, "mtime": odd.clone()});
    assert_eq!(filter.get("mtime"), Some(&Bson::from(doc! {"$eq": odd})));
}

#[test]
fn a_head_read_makes_the_window() {
    let ids: Vec<ObjectId> = (0..3).map(|_| ObjectId::new()).collect();
    let head: Vec<Document> = ids
        .iter()
        .map(|id| doc! {"_id": id, "node": Bson::Null})
        .collect();
    let full = window_over(&head, 3, 3).expect("window");
    assert_eq!((full.first, full.last), (ids[0], Some(ids[2])));
    assert!(!full.legacy_nodes);
    let open = window_over(&head, 3, 4).expect("window");
    assert_eq!(open.last, None, "the head reached the queue's end");
    let mut legacy = head.clone();
    legacy[1].insert("node", -1);
    assert!(window_over(&legacy, 3, 3).expect("window").legacy_nodes);
    assert!(window_over(&[], 0, 3).is_none());
}

#[test]
fn an_old_window_is_read_again() {
    let range = |read_at| WindowRange {
        first: ObjectId::new(),
        last: None,
        legacy_nodes: false,
        read_at,
    };
    let mut w = ClaimWindow {
        range: Some(range(Instant::now())),
    };
    assert!(w.current().is_some());
    w.reset();
    assert!(w.current().is_none());
    // An Instant this far back may not exist on a machine just booted.
    if let Some(old) = Instant::now().checked_sub(WINDOW_MAX_AGE) {
        let w = ClaimWindow {
            range: Some(range(old)),
        };
        assert!(w.current().is_none());
    }
}
