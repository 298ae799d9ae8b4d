//! The balance rules, by hand: schedules, tiers and the balance document.

use super::*;
use bson::doc;

const SUN: u8 = 0;
const MON: u8 = 1;
const FRI: u8 = 5;
const SAT: u8 = 6;

fn schedule(entries: &[(&str, i64)]) -> BTreeMap<String, i64> {
    entries.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Disbatch's documented example: 5 by day, 10 at night, 15 through the weekend.
fn documented() -> BTreeMap<String, i64> {
    schedule(&[
        ("* 07:00", 5),
        ("* 19:00", 10),
        ("1 07:00", 5),
        ("5 19:00", 15),
    ])
}

#[test]
fn the_weekend_value_holds_until_monday_morning() {
    let m = documented();
    // Friday 19:00's 15 is still in force early Saturday (Disbatch 4 said 10 here) …
    assert_eq!(max_tasks_at(&m, (SAT, 1, 0)), Some(15));
    // … until Saturday 07:00's `*` entry.
    assert_eq!(max_tasks_at(&m, (SAT, 6, 59)), Some(15));
    assert_eq!(max_tasks_at(&m, (SAT, 7, 0)), Some(5));
    assert_eq!(max_tasks_at(&m, (FRI, 19, 0)), Some(15));
    assert_eq!(max_tasks_at(&m, (FRI, 18, 59)), Some(5));
    // Monday before 07:00 is still under Sunday 19:00's 10.
    assert_eq!(max_tasks_at(&m, (MON, 6, 59)), Some(10));
    assert_eq!(max_tasks_at(&m, (MON, 7, 0)), Some(5));
}

#[test]
fn an_earlier_minute_in_an_earlier_hour_wins_over_a_later_one() {
    let m = schedule(&[("* 06:00", 3), ("* 07:30", 9)]);
    // Disbatch 4 said 9: it took the latest minute within the current hour.
    assert_eq!(max_tasks_at(&m, (MON, 7, 10)), Some(3));
    assert_eq!(max_tasks_at(&m, (MON, 7, 29)), Some(3));
    assert_eq!(max_tasks_at(&m, (MON, 7, 30)), Some(9));
    assert_eq!(max_tasks_at(&m, (MON, 23, 59)), Some(9));
}

#[test]
fn midnight_falls_back_to_the_previous_day() {
    let m = schedule(&[("* 06:00", 3), ("* 22:00", 7), ("2 00:00", 1)]);
    assert_eq!(max_tasks_at(&m, (MON, 0, 0)), Some(7), "Sunday 22:00");
    assert_eq!(max_tasks_at(&m, (MON, 5, 59)), Some(7));
    assert_eq!(max_tasks_at(&m, (2, 0, 0)), Some(1), "exactly at an entry");
    assert_eq!(max_tasks_at(&m, (2, 5, 59)), Some(1));
    assert_eq!(max_tasks_at(&m, (2, 6, 0)), Some(3));
}

#[test]
fn before_the_first_entry_of_the_week_the_last_one_holds() {
    // Only Saturday entries: Sunday 00:30 is still under Saturday's latest.
    let m = schedule(&[("6 08:00", 4), ("6 20:00", 12)]);
    assert_eq!(max_tasks_at(&m, (SUN, 0, 30)), Some(12));
    assert_eq!(max_tasks_at(&m, (FRI, 23, 59)), Some(12));
    assert_eq!(max_tasks_at(&m, (SAT, 7, 59)), Some(12));
    assert_eq!(max_tasks_at(&m, (SAT, 8, 0)), Some(4));
    // With a `*` entry, Sunday 00:30 takes Saturday's latest of the `*` and specific ones.
    let m = schedule(&[("* 21:00", 2), ("6 23:00", 8)]);
    assert_eq!(max_tasks_at(&m, (SUN, 0, 30)), Some(8));
    assert_eq!(max_tasks_at(&m, (SUN, 21, 0)), Some(2));
}

#[test]
fn a_specific_day_overrides_star_at_the_same_time_only() {
    let m = schedule(&[("* 07:00", 5), ("3 07:00", 50)]);
    assert_eq!(max_tasks_at(&m, (3, 7, 0)), Some(50));
    assert_eq!(max_tasks_at(&m, (3, 23, 0)), Some(50));
    assert_eq!(max_tasks_at(&m, (4, 6, 0)), Some(50), "still Wednesday's");
    assert_eq!(max_tasks_at(&m, (4, 7, 0)), Some(5));
    assert_eq!(max_tasks_at(&m, (2, 7, 0)), Some(5));
}

#[test]
fn no_entries_means_no_limit_and_bad_keys_are_ignored() {
    assert_eq!(max_tasks_at(&BTreeMap::new(), (MON, 12, 0)), None);
    assert_eq!(
        max_tasks_at(&schedule(&[("7 07:00", 1)]), (MON, 12, 0)),
        None
    );
    let m = schedule(&[("x", 1), ("* 07:00", 2)]);
    assert_eq!(max_tasks_at(&m, (MON, 12, 0)), Some(2));
}

#[test]
fn slot_keys_parse_into_day_and_minute() {
    assert_eq!(parse_slot_key("* 07:00"), Some((None, 420)));
    assert_eq!(parse_slot_key("6 23:59"), Some((Some(6), 1439)));
    assert_eq!(parse_slot_key("0 00:00"), Some((Some(0), 0)));
    assert_eq!(parse_slot_key("7 00:00"), None);
    assert_eq!(parse_slot_key("* 24:00"), None);
    assert_eq!(parse_slot_key("*  7:00"), None);
}

fn q(name: &str, queued: i64, running: i64) -> QueueLoad {
    QueueLoad::new(name, queued, running)
}

fn limits(max: i64, tiers: &[Vec<QueueLoad>]) -> Vec<(String, i64)> {
    effective_threads(max, tiers).into_iter().collect()
}

fn named(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
    let mut v: Vec<(String, i64)> = pairs.iter().map(|(n, t)| (n.to_string(), *t)).collect();
    v.sort();
    v
}

#[test]
fn one_queue_gets_the_total_up_to_its_queued_count() {
    assert_eq!(limits(10, &[vec![q("a", 100, 0)]]), named(&[("a", 10)]));
    // Only 4 waiting: 4 threads, the other 6 are not held for it.
    assert_eq!(limits(10, &[vec![q("a", 4, 3)]]), named(&[("a", 4)]));
    assert_eq!(limits(0, &[vec![q("a", 4, 0)]]), named(&[("a", 0)]));
    assert_eq!(limits(-3, &[vec![q("a", 4, 0)]]), named(&[("a", 0)]));
    assert!(effective_threads(10, &[]).is_empty());
}

#[test]
fn a_tier_splits_evenly_and_the_remainder_goes_first_queue_first() {
    // 11 over three busy queues: 3 each, remainder 2 to the first under its cap: a.
    assert_eq!(
        limits(11, &[vec![q("a", 50, 0), q("b", 50, 0), q("c", 50, 0)]]),
        named(&[("a", 5), ("b", 3), ("c", 3)])
    );
    // 10 over a (2 queued) and b (100): shares 5 each, a capped at 2, so b takes the 3 a
    // cannot use: 2 + 8.
    assert_eq!(
        limits(10, &[vec![q("a", 2, 0), q("b", 100, 0)]]),
        named(&[("a", 2), ("b", 8)])
    );
    // 15 over a (6), b (2), c (2): shares 5; a 5, b 2, c 2; 6 left, a takes 1 up to its
    // cap of 6; the other 5 stay unused (Disbatch gave a 11 for 6 tasks).
    assert_eq!(
        limits(15, &[vec![q("a", 6, 0), q("b", 2, 0), q("c", 2, 0)]]),
        named(&[("a", 6), ("b", 2), ("c", 2)])
    );
}

/// The worked example in the notes at the end of Disbatch's QueueBalance.pm: tiers
/// [default], [oneoff], [single] sharing 10, the default tier always has plenty queued.
#[test]
fn higher_tiers_take_capacity_from_the_default_tier() {
    let plenty = 1000;
    // 10 default tasks running; 4 oneoffs arrive. The default tier gives way to the 4
    // waiting (10 - 4 = 6), but its 10 running still occupy everything: oneoff 10 - 10 = 0.
    assert_eq!(
        limits(
            10,
            &[
                vec![q("default", plenty, 10)],
                vec![q("oneoff", 4, 0)],
                vec![q("single", 0, 0)]
            ]
        ),
        named(&[("default", 6), ("oneoff", 0), ("single", 0)])
    );
    // Two default tasks finish (8 running) and 3 singles arrive: the default tier gives
    // way to 4 + 3 = 7 (limit 3); oneoff gets 10 - max(8, 3) = 2; single 10 - 8 - 2 = 0.
    assert_eq!(
        limits(
            10,
            &[
                vec![q("default", plenty, 8)],
                vec![q("oneoff", 4, 0)],
                vec![q("single", 3, 0)]
            ]
        ),
        named(&[("default", 3), ("oneoff", 2), ("single", 0)])
    );
    // Down to 6 default and 2 oneoffs running, 4 oneoffs and 3 singles still queued (the
    // notes' numbers): default 10 - 7 = 3; oneoff 10 - max(6, 3) = 4;
    // single 10 - 6 - max(2, 4) = 0.
    assert_eq!(
        limits(
            10,
            &[
                vec![q("default", plenty, 6)],
                vec![q("oneoff", 4, 2)],
                vec![q("single", 3, 0)]
            ]
        ),
        named(&[("default", 3), ("oneoff", 4), ("single", 0)])
    );
    // A oneoff finishes (3 queued): default 10 - 6 = 4; oneoff min(10 - 6, 3) = 3;
    // single 10 - 6 - max(3, 3) = 1.
    assert_eq!(
        limits(
            10,
            &[
                vec![q("default", plenty, 6)],
                vec![q("oneoff", 3, 3)],
                vec![q("single", 3, 0)]
            ]
        ),
        named(&[("default", 4), ("oneoff", 3), ("single", 1)])
    );
}

#[test]
fn higher_tiers_get_what_lower_tiers_do_not_occupy() {
    // The default tier's budget is 8 - 5 waiting above = 3, but it has 1 queued: limit 1.
    // Tier 1 then gets 8 - 1 = 7, not just the 5 the default tier gave way to; split 3 / 3
    // and capped by queued: x 3, y 2. The 2 nobody can use are not handed out.
    assert_eq!(
        limits(8, &[vec![q("d", 1, 0)], vec![q("x", 3, 0), q("y", 2, 0)]]),
        named(&[("d", 1), ("x", 3), ("y", 2)])
    );
    // Higher tiers can never be given more than the total, even when more is running
    // below them than the total allows (running 12 of 8): they get 0, not a negative.
    assert_eq!(
        limits(8, &[vec![q("d", 20, 12)], vec![q("x", 5, 0)]]),
        named(&[("d", 3), ("x", 0)])
    );
    // More waiting above than the total: the default tier gets 0.
    assert_eq!(
        limits(8, &[vec![q("d", 20, 0)], vec![q("x", 30, 0)]]),
        named(&[("d", 0), ("x", 8)])
    );
}

#[test]
fn empty_tiers_and_repeated_names_are_harmless() {
    assert_eq!(limits(6, &[vec![], vec![q("x", 9, 0)]]), named(&[("x", 6)]));
    assert_eq!(
        limits(6, &[vec![q("x", 2, 0)], vec![q("x", 9, 0)]]),
        named(&[("x", 0)]),
        "the first (default-tier) limit is kept: 6 - 9 waiting above = 0"
    );
}

#[test]
fn local_time_from_unix_and_offset() {
    // 2024-05-03 17:00:00 UTC was a Friday.
    let t = 1_714_755_600;
    let utc = LocalTime::from_unix(t, 0);
    assert_eq!(utc.to_string(), "2024-05-03 17:00:00 +00:00");
    assert_eq!(utc.week_time(), (FRI, 17, 0));
    // At +02:00 that is 19:00 Friday: the documented weekend value begins.
    let cest = LocalTime::from_unix(t, 2 * 3600);
    assert_eq!(cest.week_time(), (FRI, 19, 0));
    assert_eq!(max_tasks_at(&documented(), cest.week_time()), Some(15));
    // At -08:00 it is 09:00: weekday daytime.
    let pst = LocalTime::from_unix(t, -8 * 3600);
    assert_eq!(pst.to_string(), "2024-05-03 09:00:00 -08:00");
    // Crossing midnight backwards changes the day: 2024-05-03 01:30 UTC at -05:00 is
    // Thursday 20:30.
    let early = LocalTime::from_unix(1_714_699_800, -5 * 3600);
    assert_eq!(early.week_time(), (4, 20, 30));
    assert_eq!(early.to_string(), "2024-05-02 20:30:00 -05:00");
    // Epoch, a leap day, and before the epoch.
    assert_eq!(
        LocalTime::from_unix(0, 0).to_string(),
        "1970-01-01 00:00:00 +00:00"
    );
    assert_eq!(LocalTime::from_unix(0, 0).weekday, 4);
    assert_eq!(
        LocalTime::from_unix(951_782_400, 0).to_string(),
        "2000-02-29 00:00:00 +00:00"
    );
    let before = LocalTime::from_unix(-1, 0);
    assert_eq!(before.to_string(), "1969-12-31 23:59:59 +00:00");
    assert_eq!(before.weekday, 3);
    assert_eq!(
        LocalTime::from_unix(0, 5 * 3600 + 30 * 60).to_string(),
        "1970-01-01 05:30:00 +05:30"
    );
}

#[test]
fn balance_documents_parse_or_say_what_is_wrong() {
    assert_eq!(parse_balance_document(None), Ok(BalancePlan::default()));
    let plan = parse_balance_document(Some(&doc! {
        "max_tasks": {"* 07:00": 5, "5 19:00": "15", "1 07:00": 5.0},
        "queues": [["a", "b"], ["c"]],
        "disabled": 1_700_000_000i64,
        "status": "OK",
    }))
    .expect("valid");
    assert_eq!(plan.max_tasks.get("5 19:00"), Some(&15));
    assert_eq!(plan.max_tasks.get("1 07:00"), Some(&5));
    assert_eq!(plan.tiers, vec![vec!["a", "b"], vec!["c"]]);
    assert_eq!(plan.disabled, Some(1_700_000_000));
    let plan = parse_balance_document(Some(
        &doc! {"max_tasks": {}, "queues": [], "disabled": null},
    ))
    .expect("valid");
    assert_eq!(plan.disabled, None);

    let bad = [
        doc! {"queues": []},
        doc! {"max_tasks": {}},
        doc! {"max_tasks": [], "queues": []},
        doc! {"max_tasks": {"8 07:00": 1}, "queues": []},
        doc! {"max_tasks": {"* 07:00": -1}, "queues": []},
        doc! {"max_tasks": {"* 07:00": 1.5}, "queues": []},
        doc! {"max_tasks": {}, "queues": ["a"]},
        doc! {"max_tasks": {}, "queues": [[1]]},
        doc! {"max_tasks": {}, "queues": [["a"], ["a"]]},
        doc! {"max_tasks": {}, "queues": [["a", "a"]]},
        doc! {"max_tasks": {}, "queues": [], "disabled": "soon"},
    ];
    for d in bad {
        assert!(parse_balance_document(Some(&d)).is_err(), "{d} should fail");
    }
}

#[test]
fn health_words_are_what_monitoring_reads() {
    assert_eq!(Health::Ok.as_str(), "OK");
    assert_eq!(Health::Warning.to_string(), "WARNING");
    assert_eq!(Health::Critical.as_str(), "CRITICAL");
}
