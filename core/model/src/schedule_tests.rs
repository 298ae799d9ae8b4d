use super::*;
use bson::doc;

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn schedule(pattern: &str, tz: Option<&str>, missed: Option<&str>) -> Schedule {
    Schedule::new(pattern, tz, missed, Document::new()).unwrap_or_else(|e| panic!("{pattern}: {e}"))
}

/// The ticks in (from, to], as UTC text.
fn ticks(s: &Schedule, from: &str, to: &str) -> Vec<String> {
    let (mut t, to) = (at(from), at(to));
    let mut out = Vec::new();
    while let Some(next) = s.next_after(t).expect("search").filter(|n| *n <= to) {
        out.push(next.to_rfc3339());
        t = next;
    }
    out
}

const GRACE: Duration = Duration::from_secs(2);

#[test]
fn five_fields_tick_on_minutes_and_six_on_seconds() {
    let minutes = schedule("*/5 * * * *", None, None);
    assert_eq!(
        ticks(&minutes, "2024-01-01T00:00:00Z", "2024-01-01T00:12:00Z"),
        ["2024-01-01T00:05:00+00:00", "2024-01-01T00:10:00+00:00"]
    );
    let seconds = schedule("*/2 * * * * *", None, None);
    assert_eq!(
        ticks(&seconds, "2024-01-01T00:00:00.500Z", "2024-01-01T00:00:05Z"),
        ["2024-01-01T00:00:02+00:00", "2024-01-01T00:00:04+00:00"],
        "a start within a second counts from that second"
    );
    let hourly = schedule("@hourly", None, None);
    assert_eq!(
        ticks(&hourly, "2024-01-01T00:30:00Z", "2024-01-01T02:00:00Z"),
        ["2024-01-01T01:00:00+00:00", "2024-01-01T02:00:00+00:00"]
    );
}

#[test]
fn bad_patterns_zones_and_policies_are_refused_naming_the_field() {
    for (pattern, tz, missed, needle) in [
        ("not cron", None, None, "schedule"),
        ("", None, None, "schedule"),
        ("61 * * * *", None, None, "schedule"),
        ("* * * * * * * *", None, None, "schedule"),
        ("0 0 30 2 *", None, None, "never fires"),
        ("* * * * *", Some("Mars/Olympus_Mons"), None, "schedule_tz"),
        ("* * * * *", Some(""), None, "schedule_tz"),
        ("* * * * *", None, Some("twice"), "schedule_missed"),
    ] {
        let e = Schedule::new(pattern, tz, missed, Document::new())
            .expect_err(&format!("{pattern:?} {tz:?} {missed:?}"));
        assert!(e.contains(needle), "{pattern:?}: {e}");
    }
    let long = "*".repeat(300);
    assert!(Schedule::new(&long, None, None, Document::new())
        .expect_err("long")
        .contains("at most"));
}

#[test]
fn a_document_is_read_and_checked_field_by_field() {
    assert!(read(&doc! {"name": "q"}).is_none(), "no schedule");
    let s = read(
        &doc! {"schedule": "0 * * * *", "schedule_tz": "Europe/Paris",
        "schedule_params": {"report": "daily"}, "schedule_missed": "once"},
    )
    .expect("a schedule")
    .expect("valid");
    assert_eq!(s.tz, chrono_tz::Europe::Paris);
    assert_eq!(s.missed, Missed::Once);
    assert_eq!(s.params, doc! {"report": "daily"});
    assert_eq!(s.basis(), "0 * * * * | Europe/Paris | once");
    let s = read(&doc! {"schedule": "0 * * * *"})
        .expect("some")
        .expect("ok");
    assert_eq!((s.tz, s.missed), (chrono_tz::UTC, Missed::Skip), "defaults");
    for (bad, needle) in [
        (doc! {"schedule": 5}, "schedule must be"),
        (
            doc! {"schedule": "* * * * *", "schedule_params": [1]},
            "schedule_params",
        ),
        (
            doc! {"schedule": "* * * * *", "schedule_tz": 3},
            "schedule_tz",
        ),
    ] {
        let e = read(&bad).expect("some").expect_err("bad");
        assert!(e.contains(needle), "{bad}: {e}");
    }
    // An update may set one field alone: each is checked without the others.
    assert!(check(&doc! {"schedule_tz": "America/New_York"}).is_ok());
    assert!(check(&doc! {"schedule_tz": "Nowhere"}).is_err());
    assert!(check(&doc! {"schedule_missed": "always"}).is_err());
    assert!(check(&doc! {"schedule_params": "x"}).is_err());
    assert!(check(&doc! {"schedule": "* * *"}).is_err());
}

#[test]
fn on_time_ticks_are_each_due_and_settled() {
    let s = schedule("*/2 * * * * *", None, None);
    let plan = s
        .plan(
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:00:01.900Z"),
            GRACE,
        )
        .expect("plan");
    assert_eq!(plan, Plan::default(), "no tick yet");
    let plan = s
        .plan(
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:00:04.300Z"),
            GRACE,
        )
        .expect("plan");
    let due: Vec<_> = plan
        .due
        .iter()
        .map(|d| (d.tick.to_rfc3339(), d.missed))
        .collect();
    assert_eq!(
        due,
        [
            ("2024-01-01T00:00:02+00:00".to_string(), None),
            ("2024-01-01T00:00:04+00:00".to_string(), None)
        ]
    );
    assert_eq!(plan.skipped, 0);
    assert_eq!(plan.through, Some(at("2024-01-01T00:00:04Z")));
    let again = s
        .plan(
            at("2024-01-01T00:00:04Z"),
            at("2024-01-01T00:00:05Z"),
            GRACE,
        )
        .expect("plan");
    assert!(
        again.due.is_empty() && again.through.is_none(),
        "settled ticks are not owed again"
    );
}

#[test]
fn after_a_gap_skip_drops_the_missed_ticks_and_keeps_those_within_the_grace() {
    let s = schedule("*/2 * * * * *", None, Some("skip"));
    // Settled through :00; now :11, grace 2 s: :02 … :08 were missed, :10 is on time.
    let plan = s
        .plan(
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:00:11Z"),
            GRACE,
        )
        .expect("plan");
    assert_eq!(
        plan.due,
        [Due {
            tick: at("2024-01-01T00:00:10Z"),
            missed: None
        }]
    );
    assert_eq!(plan.skipped, 4);
    assert_eq!(plan.through, Some(at("2024-01-01T00:00:10Z")));
    // A tick exactly `grace` old is still on time.
    let plan = s
        .plan(
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:00:04Z"),
            GRACE,
        )
        .expect("plan");
    assert_eq!(plan.skipped, 0);
    assert_eq!(plan.due.len(), 2);
}

#[test]
fn after_a_gap_once_makes_one_task_for_the_latest_missed_tick() {
    let s = schedule("*/2 * * * * *", None, Some("once"));
    let plan = s
        .plan(
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:00:11Z"),
            GRACE,
        )
        .expect("plan");
    assert_eq!(
        plan.due,
        [
            Due {
                tick: at("2024-01-01T00:00:08Z"),
                missed: Some(4)
            },
            Due {
                tick: at("2024-01-01T00:00:10Z"),
                missed: None
            }
        ],
        ":02, :04, :06 and :08 missed: one task, for :08, stands for the four"
    );
    assert_eq!(plan.skipped, 3);
    assert_eq!(plan.through, Some(at("2024-01-01T00:00:10Z")));
    // All missed, none within the grace: the one task alone.
    let s = schedule("*/5 * * * * *", None, Some("once"));
    let plan = s
        .plan(
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:00:14Z"),
            GRACE,
        )
        .expect("plan");
    assert_eq!(
        plan.due,
        [Due {
            tick: at("2024-01-01T00:00:10Z"),
            missed: Some(2)
        }]
    );
    assert_eq!(plan.through, Some(at("2024-01-01T00:00:10Z")));
}

#[test]
fn a_long_gap_is_counted_up_to_a_bound_and_still_finds_the_latest_tick() {
    let s = schedule("* * * * * *", None, Some("once"));
    let plan = s
        .plan(
            at("2024-01-01T00:00:00Z"),
            at("2024-01-02T00:00:00Z"),
            GRACE,
        )
        .expect("plan");
    assert_eq!(
        plan.due.first(),
        Some(&Due {
            tick: at("2024-01-01T23:59:57Z"),
            missed: Some(MAX_COUNTED)
        })
    );
    assert_eq!(plan.due.len(), 4, "the catch-up and :58, :59, :00 on time");
    assert_eq!(plan.through, Some(at("2024-01-02T00:00:00Z")));
}

#[test]
fn the_grace_grows_with_the_loop_interval_from_two_seconds() {
    assert_eq!(grace(Duration::from_millis(100)), Duration::from_secs(2));
    assert_eq!(grace(Duration::from_secs(1)), Duration::from_secs(5));
    assert_eq!(grace(Duration::from_secs(60)), Duration::from_secs(300));
}

#[test]
fn new_york_spring_forward_runs_a_skipped_wall_time_once_and_hours_stay_hourly() {
    let ny = Some("America/New_York");
    // 2024-03-10: 02:00 EST jumps to 03:00 EDT (07:00 UTC); 02:30 never happens that day.
    let daily = schedule("30 2 * * *", ny, None);
    let got = ticks(&daily, "2024-03-09T00:00:00Z", "2024-03-12T00:00:00Z");
    assert_eq!(
        got,
        [
            "2024-03-09T07:30:00+00:00",
            "2024-03-10T07:00:00+00:00",
            "2024-03-11T06:30:00+00:00"
        ],
        "02:30 EST; then, on the day it does not exist, at the jump (03:00 EDT); 02:30 EDT"
    );
    let hourly = schedule("0 * * * *", ny, None);
    let got = ticks(&hourly, "2024-03-10T05:30:00Z", "2024-03-10T09:30:00Z");
    assert_eq!(
        got,
        [
            "2024-03-10T06:00:00+00:00",
            "2024-03-10T07:00:00+00:00",
            "2024-03-10T08:00:00+00:00",
            "2024-03-10T09:00:00+00:00"
        ],
        "01:00 EST, 03:00 EDT, 04:00, 05:00: an hour apart in real time"
    );
}

#[test]
fn new_york_fall_back_runs_a_fixed_time_once_and_an_interval_in_both_hours() {
    let ny = Some("America/New_York");
    // 2024-11-03: 02:00 EDT falls back to 01:00 EST (06:00 UTC); 01:xx happens twice.
    let daily = schedule("30 1 * * *", ny, None);
    let got = ticks(&daily, "2024-11-02T12:00:00Z", "2024-11-04T12:00:00Z");
    assert_eq!(
        got,
        ["2024-11-03T05:30:00+00:00", "2024-11-04T06:30:00+00:00"],
        "01:30 EDT only, not again at 01:30 EST"
    );
    let half_hours = schedule("*/30 1 * * *", ny, None);
    let got = ticks(&half_hours, "2024-11-03T04:00:00Z", "2024-11-03T08:00:00Z");
    assert_eq!(
        got,
        [
            "2024-11-03T05:00:00+00:00",
            "2024-11-03T05:30:00+00:00",
            "2024-11-03T06:00:00+00:00",
            "2024-11-03T06:30:00+00:00"
        ],
        "01:00 and 01:30 EDT, then 01:00 and 01:30 EST: every half hour of real time"
    );
}

#[test]
fn a_gap_across_the_fall_back_counts_each_instant_once() {
    let s = schedule("*/30 * * * *", Some("America/New_York"), Some("once"));
    // Settled through 00:30 EDT (04:30 UTC); no leader until 03:00 EST (08:00 UTC).
    let plan = s
        .plan(
            at("2024-11-03T04:30:00Z"),
            at("2024-11-03T08:00:01Z"),
            GRACE,
        )
        .expect("plan");
    assert_eq!(
        plan.due,
        [
            Due {
                tick: at("2024-11-03T07:30:00Z"),
                missed: Some(6)
            },
            Due {
                tick: at("2024-11-03T08:00:00Z"),
                missed: None
            }
        ],
        "01:00, 01:30 EDT, 01:00, 01:30 EST, 02:00, 02:30 EST missed; 03:00 on time"
    );
}

#[test]
fn a_work_spec_sets_its_schedule_keys_and_a_reload_without_them_removes_them() {
    let spec = serde_json::json!({"name": "a", "schedule": "@daily", "schedule_tz": "Asia/Tokyo",
                                  "schedule_params": {"k": [1, 2]}});
    let (set, unset) = spec_fields(spec.as_object().expect("object")).expect("valid");
    assert_eq!(
        set,
        doc! {"schedule": "@daily", "schedule_tz": "Asia/Tokyo", "schedule_params": {"k": [1, 2]}}
    );
    assert_eq!(unset, [queue::SCHEDULE_MISSED]);
    let (set, unset) =
        spec_fields(serde_json::json!({"name": "a"}).as_object().expect("o")).expect("valid");
    assert!(set.is_empty());
    for field in FIELDS.iter().chain(&LEADER_FIELDS) {
        assert!(unset.contains(field), "{field} removed");
    }
    for (bad, needle) in [
        (
            serde_json::json!({"schedule": 5}),
            "schedule must be a string",
        ),
        (serde_json::json!({"schedule": "x y"}), "schedule"),
        (
            serde_json::json!({"schedule_params": [1]}),
            "schedule_params",
        ),
        (
            serde_json::json!({"schedule": "@daily", "schedule_missed": "later"}),
            "schedule_missed",
        ),
    ] {
        let e = spec_fields(bad.as_object().expect("o")).expect_err("bad");
        assert!(e.contains(needle), "{bad}: {e}");
    }
}

#[test]
fn the_next_tick_is_shown_in_utc_and_on_the_zones_wall_clock() {
    let nine = schedule("0 9 * * *", Some("Asia/Kolkata"), None);
    let now = to_bson(at("2026-12-07T04:00:00Z"));
    let next = nine.next_shown(now).expect("search").expect("a tick");
    assert_eq!(next.utc, "2026-12-08T03:30:00Z");
    assert_eq!(next.local, "2026-12-08T09:00:00+05:30");
    assert_eq!(next.zone, "Asia/Kolkata");
    // Across a DST change the offset is the tick's own, not today's.
    let paris = schedule("30 2 * * *", Some("Europe/Paris"), None);
    let next = paris
        .next_shown(to_bson(at("2026-10-23T12:00:00Z")))
        .expect("search")
        .expect("a tick");
    assert_eq!(next.local, "2026-10-24T02:30:00+02:00");
    let next = paris
        .next_shown(to_bson(at("2026-10-25T12:00:00Z")))
        .expect("search")
        .expect("a tick");
    assert_eq!(next.local, "2026-10-26T02:30:00+01:00");
    let utc = schedule("*/15 * * * *", None, None);
    let next = utc
        .next_shown(to_bson(at("2026-12-07T04:00:00Z")))
        .expect("search")
        .expect("a tick");
    assert_eq!(
        (next.utc.as_str(), next.local.as_str()),
        ("2026-12-07T04:15:00Z", "2026-12-07T04:15:00+00:00")
    );
}

/// One rule on both days, Vixie cron's: a pattern with `*` in its minute or hour follows real
/// time; one of fixed times runs once at a wall time that repeats, and once at the change for
/// one that does not happen. Before, `0 1 * * *` never ran on the fall-back day (croner
/// skipped it) while `0 0,1 * * *` did.
#[test]
fn both_clock_changes_follow_one_rule_in_new_york_paris_and_lord_howe() {
    let ny = Some("America/New_York");
    // 2024-11-03: 02:00 EDT back to 01:00 EST (06:00 UTC).
    let fall = ("2024-11-03T00:00:00Z", "2024-11-04T00:00:00Z");
    let one = schedule("0 1 * * *", ny, None);
    assert_eq!(
        ticks(&one, fall.0, fall.1),
        ["2024-11-03T05:00:00+00:00"],
        "01:00 EDT, once"
    );
    let two = schedule("0 0,1 * * *", ny, None);
    assert_eq!(
        ticks(&two, fall.0, fall.1),
        ["2024-11-03T04:00:00+00:00", "2024-11-03T05:00:00+00:00"]
    );
    let every_minute = schedule("* 1 * * *", ny, None);
    let got = ticks(&every_minute, fall.0, fall.1);
    assert_eq!(got.len(), 120, "both 01:xx hours: {got:?}");
    assert_eq!(got[0], "2024-11-03T05:00:00+00:00");
    assert_eq!(got[60], "2024-11-03T06:00:00+00:00");
    assert_eq!(got[119], "2024-11-03T06:59:00+00:00");
    // 2024-03-10: 02:00 EST forward to 03:00 EDT (07:00 UTC).
    let spring = ("2024-03-10T00:00:00Z", "2024-03-11T00:00:00Z");
    let wild = schedule("* 2 * * *", ny, None);
    assert_eq!(ticks(&wild, spring.0, spring.1), Vec::<String>::new());
    let fixed = schedule("0,30 2 * * *", ny, None);
    assert_eq!(
        ticks(&fixed, spring.0, spring.1),
        ["2024-03-10T07:00:00+00:00"],
        "both 02:00 and 02:30 at the change, as one tick"
    );
    let daily = schedule("@daily", ny, None);
    assert_eq!(ticks(&daily, fall.0, fall.1), ["2024-11-03T04:00:00+00:00"]);

    // Paris: 2024-03-31 02:00 CET to 03:00 CEST (01:00 UTC); 2024-10-27 03:00 CEST back to
    // 02:00 CET (01:00 UTC).
    let paris = Some("Europe/Paris");
    let at_two = schedule("0 2 * * *", paris, None);
    assert_eq!(
        ticks(&at_two, "2024-03-30T12:00:00Z", "2024-04-01T12:00:00Z"),
        ["2024-03-31T01:00:00+00:00", "2024-04-01T00:00:00+00:00"],
        "at the change, then 02:00 CEST"
    );
    assert_eq!(
        ticks(&at_two, "2024-10-26T12:00:00Z", "2024-10-28T12:00:00Z"),
        ["2024-10-27T00:00:00+00:00", "2024-10-28T01:00:00+00:00"],
        "02:00 CEST once, then 02:00 CET"
    );
    let quarter = schedule("*/15 2 * * *", paris, None);
    assert_eq!(
        ticks(&quarter, "2024-10-26T23:00:00Z", "2024-10-27T03:00:00Z").len(),
        8,
        "02:xx twice, four quarters each"
    );

    // Lord Howe sets its clock by 30 minutes: 2024-04-07 02:00 back to 01:30 (15:00 UTC).
    let howe = Some("Australia/Lord_Howe");
    let fixed = schedule("45 1 * * *", howe, None);
    assert_eq!(
        ticks(&fixed, "2024-04-06T12:00:00Z", "2024-04-07T12:00:00Z"),
        ["2024-04-06T14:45:00+00:00"],
        "01:45 +11:00 once, not again at 01:45 +10:30"
    );
    let wild = schedule("*/15 1 * * *", howe, None);
    assert_eq!(
        ticks(&wild, "2024-04-06T12:00:00Z", "2024-04-07T12:00:00Z").len(),
        6,
        "01:00, 01:15, 01:30, 01:45 +11:00, then 01:30 and 01:45 again"
    );
}

/// The backward search (for the latest of a long gap's missed ticks) agrees with the forward
/// one around both changes, for both kinds of pattern.
#[test]
fn the_last_tick_before_is_the_one_the_forward_search_reached() {
    for (pattern, tz) in [
        ("*/20 * * * *", "America/New_York"),
        ("0 1 * * *", "America/New_York"),
        ("30 2 * * *", "America/New_York"),
        ("*/15 2 * * *", "Europe/Paris"),
        ("45 1 * * *", "Australia/Lord_Howe"),
    ] {
        let s = schedule(pattern, Some(tz), None);
        for (from, to) in [
            ("2024-03-09T00:00:00Z", "2024-03-12T00:00:00Z"),
            ("2024-03-29T00:00:00Z", "2024-04-02T00:00:00Z"),
            ("2024-04-05T00:00:00Z", "2024-04-08T00:00:00Z"),
            ("2024-10-26T00:00:00Z", "2024-10-28T00:00:00Z"),
            ("2024-11-02T00:00:00Z", "2024-11-05T00:00:00Z"),
        ] {
            let forward = ticks(&s, from, to);
            for pair in forward.windows(2) {
                let later = at(&pair[1]);
                let before = s
                    .last_before(later)
                    .expect("search")
                    .map(|t| t.to_rfc3339());
                assert_eq!(before.as_deref(), Some(pair[0].as_str()), "{pattern} {tz}");
            }
        }
    }
}

/// A stored time at the edge of the calendar is no panic.
#[test]
fn times_at_the_ends_of_the_calendar_find_nothing_without_a_panic() {
    let s = schedule("0 1 * * *", Some("America/New_York"), None);
    assert!(s.next_after(DateTime::<Utc>::MAX_UTC).is_ok());
    assert!(s.last_before(DateTime::<Utc>::MIN_UTC).is_ok());
}
