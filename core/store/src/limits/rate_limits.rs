//! Rate-limit grants: the starts a queue's `rate_limit` allows, per partition, decided by one
//! atomic update of the partition's window document so the limit holds across every node.
//!
//! The window is exact and sliding on the server's clock: a grant at server time `t` counts
//! until `t + per`, and a grant is only made while the starts counted stay within `starts`,
//! so no stretch of `per` ever holds more. Grants close together are kept as one entry (the
//! `open` one) whose time moves to the latest of them: the entry then expires with its last
//! grant, never before any of them (a grant may be counted up to `per / OPEN_SPAN_PARTS`
//! longer than it must, never shorter: an entry takes grants for that long at most), and a
//! window holds at most `OPEN_SPAN_PARTS` + 1 entries however many starts it allows.
//!
//! While the window is less than half full, a grant may also give starts *ahead*, which the
//! node uses for its next claims within the limit's `ahead_horizon` instead of asking again
//! for each: one request per many claims when a limit is far above demand. Such a grant is
//! counted at the end of its horizon, after every start it allows, so the bound holds for
//! the starts as they happen; a near-full window grants only what is asked, for now.

use crate::LimitStore;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use mongodb::options::ReturnDocument;

use crate::error::{Error, Result};
use disbatch_model::fleet_time;
use disbatch_model::limits::RateLimit;
use disbatch_model::schema::rate::{FIRST, OPEN};
use disbatch_model::schema::{rate, RATE_LIMITS};

/// Grants less than `per / OPEN_SPAN_PARTS` after the open entry's time join it.
const OPEN_SPAN_PARTS: i64 = 64;
/// Window documents whose last grant left the window this long ago are removed.
const KEEP_EXPIRED: Duration = Duration::from_secs(60);

/// What a grant request got.
#[derive(Debug, Clone, PartialEq)]
pub enum Grant {
    /// `n` starts (0 when the window is full), granted at `at` (the server's time): the
    /// attempts' start. `free_in`: how long until the window frees a start, when it is full
    /// after this grant.
    Starts {
        n: u32,
        /// Further starts for the node's next claims, until `ahead_horizon` after `at`.
        ahead: u32,
        at: DateTime,
        free_in: Option<Duration>,
    },
    /// The partition has no live window and the queue already has `max_partitions` live
    /// ones: no start until one of them expires.
    TooManyPartitions { live: u64 },
}

impl LimitStore<'_> {
    /// Asks the window of `queue`'s `partition` for up to `asked` starts under `limit`, and
    /// up to `ahead` more for later claims if the window has room to spare.
    pub async fn grant_starts(
        self,
        queue: ObjectId,
        partition: &Bson,
        limit: &RateLimit,
        asked: u32,
        ahead: u32,
    ) -> Result<Grant> {
        let id = doc! {rate::QUEUE: queue, rate::PARTITION: partition.clone()};
        let grant_id = ObjectId::new();
        let pipeline = grant_pipeline(queue, limit, (asked, ahead), grant_id);
        let context = format!("granting starts in queue {queue}");
        let existing = self
            .raw(RATE_LIMITS)
            .find_one_and_update(doc! {rate::ID: &id}, pipeline.clone())
            .return_document(ReturnDocument::After)
            .await
            .map_err(|e| Error::mongo(&context, e))?;
        let window = match existing {
            Some(raw) => raw,
            None => {
                if limit.partition.is_some() {
                    let live = self.live_partitions(queue).await?;
                    if live >= u64::from(limit.max_partitions) {
                        return Ok(Grant::TooManyPartitions { live });
                    }
                }
                let upsert = self
                    .raw(RATE_LIMITS)
                    .find_one_and_update(doc! {rate::ID: &id}, pipeline)
                    .upsert(true)
                    .return_document(ReturnDocument::After)
                    .await;
                match upsert {
                    Ok(Some(raw)) => raw,
                    Ok(None) => return Err(Error::Invalid(format!("{context}: no window"))),
                    // Another node made the window first: the next pass asks it.
                    Err(e) if crate::driver_error::is_duplicate_key(&e) => {
                        return Ok(Grant::Starts {
                            n: 0,
                            ahead: 0,
                            at: fleet_time::now(),
                            free_in: Some(Duration::ZERO),
                        })
                    }
                    Err(e) => return Err(Error::mongo(&context, e)),
                }
            }
        };
        let window = disbatch_model::text::raw_doc::from_raw(&window).map_err(|why| {
            Error::Invalid(format!("{context}: the window cannot be read: {why}"))
        })?;
        Ok(read_grant(&window, grant_id, limit))
    }

    /// Gives back `n` starts granted at `at` that started nothing (their claims went to other
    /// nodes, or a reserve's horizon passed): the entry holding that grant counts `n` fewer.
    /// That entry is the newest one begun at or before `at` (an entry takes grants only while
    /// it is the newest); a grant whose entry already left the window has nothing to give back.
    pub async fn refund_starts(
        self,
        queue: ObjectId,
        partition: &Bson,
        at: DateTime,
        n: u32,
    ) -> Result<()> {
        let id = doc! {rate::QUEUE: queue, rate::PARTITION: partition.clone()};
        self.raw(RATE_LIMITS)
            .update_one(
                doc! {rate::ID: id},
                refund_pipeline(at.timestamp_millis(), n),
            )
            .await
            .map_err(|e| Error::mongo(format!("giving back starts in queue {queue}"), e))?;
        Ok(())
    }

    /// How many partitions of `queue` have starts in their window.
    pub async fn live_partitions(self, queue: ObjectId) -> Result<u64> {
        self.raw(RATE_LIMITS)
            .count_documents(doc! {rate::QUEUE: queue, rate::UNTIL: {"$gt": fleet_time::now()}})
            .await
            .map_err(|e| Error::mongo(format!("counting live partitions of queue {queue}"), e))
    }

    /// Removes windows whose last grant left them a while ago (a partition per customer would
    /// otherwise leave one document per customer ever seen). Returns how many.
    pub async fn remove_expired_rate_windows(self) -> Result<u64> {
        let before = DateTime::from_millis(
            fleet_time::now()
                .timestamp_millis()
                .saturating_sub(KEEP_EXPIRED.as_millis() as i64),
        );
        let gone = self
            .raw(RATE_LIMITS)
            .delete_many(doc! {rate::UNTIL: {"$lt": before}})
            .await
            .map_err(|e| Error::mongo("removing expired rate windows", e))?;
        Ok(gone.deleted_count)
    }
}

/// The grant as one update pipeline: drop the entries that left the window, grant what the
/// rest leave room for, and record the grant where the caller can read it back.
fn grant_pipeline(
    queue: ObjectId,
    limit: &RateLimit,
    (asked, ahead): (u32, u32),
    grant_id: ObjectId,
) -> Vec<Document> {
    let per_ms = i64::try_from(limit.per.as_millis())
        .unwrap_or(i64::MAX)
        .max(1);
    let horizon_ms = i64::try_from(limit.ahead_horizon().as_millis()).unwrap_or(0);
    let half = i64::from(limit.starts / 2);
    let span = (per_ms / OPEN_SPAN_PARTS).max(1);
    let open = format!("${OPEN}");
    let open_t = format!("${OPEN}.{}", rate::T);
    let open_n = format!("${OPEN}.{}", rate::N);
    let starts = format!("${}", rate::STARTS);
    let cutoff = doc! {"$subtract": ["$_now", per_ms]};
    let live_entry = |var: &str| doc! {"$gt": [format!("$${var}.{}", rate::T), cutoff.clone()]};
    let open_live = doc! {"$gt": [{"$ifNull": [&open_t, 0_i64]}, cutoff.clone()]};
    // An open entry whose first grant is too old to take this one moves into `starts`: an
    // entry spans at most `span`, so its grants are counted at most that much too long.
    let open_first = format!("${OPEN}.{FIRST}");
    let open_joins =
        doc! {"$gt": [{"$ifNull": [&open_first, 0_i64]}, {"$subtract": ["$_now", span]}]};
    // The open entry leaves the window, moves into `starts` (too old to take this grant), or
    // stays open and takes it.
    let moves = doc! {"$and": [open_live.clone(), {"$not": [open_joins.clone()]}]};
    let stays = doc! {"$and": [open_live, open_joins]};
    vec![
        doc! {"$set": {"_now": {"$toLong": "$$NOW"}}},
        doc! {"$set": {
            rate::QUEUE: queue,
            rate::STARTS: {"$filter": {
                "input": {"$concatArrays": [
                    {"$ifNull": [&starts, []]},
                    {"$cond": [moves, [&open], []]},
                ]},
                "as": "s",
                "cond": live_entry("s"),
            }},
            OPEN: {"$cond": [stays, &open, "$$REMOVE"]},
        }},
        doc! {"$set": {"_used": {"$add": [
            {"$reduce": {"input": &starts, "initialValue": 0_i64, "in": {"$add": ["$$value", format!("$$this.{}", rate::N)]}}},
            {"$ifNull": [&open_n, 0_i64]},
        ]}}},
        doc! {"$set": {"_grant": {"$max": [0_i64, {"$min": [i64::from(asked), {"$subtract": [i64::from(limit.starts), "$_used"]}]}]}}},
        // Ahead only while the window stays at most half full with them.
        doc! {"$set": {"_ahead": {"$max": [0_i64, {"$min": [i64::from(ahead), {"$subtract": [half, {"$add": ["$_used", "$_grant"]}]}]}]}}},
        doc! {"$set": {
            "_total": {"$add": ["$_grant", "$_ahead"]},
            "_t": {"$cond": [{"$gt": ["$_ahead", 0_i64]}, {"$add": ["$_now", horizon_ms]}, "$_now"]},
        }},
        doc! {"$set": {
            OPEN: {"$cond": [
                {"$eq": ["$_total", 0_i64]},
                {"$ifNull": [&open, "$$REMOVE"]},
                {
                    rate::T: {"$max": [{"$ifNull": [&open_t, 0_i64]}, "$_t"]},
                    rate::N: {"$add": [{"$ifNull": [&open_n, 0_i64]}, "$_total"]},
                    FIRST: {"$ifNull": [&open_first, "$_now"]},
                },
            ]},
            rate::GRANTED: {rate::GRANT_ID: grant_id, rate::N: "$_grant", rate::AHEAD: "$_ahead", rate::AT: "$_now", "used": "$_used"},
        }},
        doc! {"$set": {
            rate::UNTIL: {"$cond": [
                {"$gt": ["$_total", 0_i64]},
                {"$toDate": {"$max": [
                    {"$add": ["$_t", per_ms]},
                    {"$toLong": {"$ifNull": [format!("${}", rate::UNTIL), {"$toDate": 0_i64}]}},
                ]}},
                {"$ifNull": [format!("${}", rate::UNTIL), {"$toDate": "$_now"}]},
            ]},
        }},
        doc! {"$unset": ["_now", "_used", "_grant", "_ahead", "_total", "_t"]},
    ]
}

/// The refund as one update pipeline: the newest entry begun at or before `at` and counted
/// until after it counts `n` fewer. (Entries counted ahead may reach past the next one's
/// start, so more than one can span `at`; the grant joined the newest.)
fn refund_pipeline(at: i64, n: u32) -> Vec<Document> {
    let open = format!("${OPEN}");
    let spans = |entry: &str| {
        let field = |f: &str| format!("{entry}.{f}");
        doc! {"$and": [
            {"$lte": [{"$ifNull": [field(FIRST), i64::MAX]}, at]},
            {"$gte": [{"$ifNull": [field(rate::T), i64::MIN]}, at]},
        ]}
    };
    let entries = doc! {"$concatArrays": [
        {"$ifNull": [format!("${}", rate::STARTS), []]},
        {"$cond": [{"$eq": [{"$type": &open}, "object"]}, [&open], []]},
    ]};
    let newest = doc! {"$max": {"$map": {
        "input": entries,
        "as": "e",
        "in": {"$cond": [spans("$$e"), format!("$$e.{FIRST}"), null]},
    }}};
    let less = |entry: &str| {
        let field = |f: &str| format!("{entry}.{f}");
        doc! {"$cond": [
            {"$and": [
                spans(entry),
                {"$eq": [field(FIRST), "$_newest"]},
            ]},
            {
                rate::T: field(rate::T),
                rate::N: {"$max": [0_i64, {"$subtract": [field(rate::N), i64::from(n)]}]},
                FIRST: field(FIRST),
            },
            entry,
        ]}
    };
    vec![
        doc! {"$set": {"_newest": newest}},
        doc! {"$set": {
            rate::STARTS: {"$map": {
                "input": {"$ifNull": [format!("${}", rate::STARTS), []]},
                "as": "s",
                "in": less("$$s"),
            }},
            OPEN: {"$cond": [
                {"$eq": [{"$type": format!("${OPEN}")}, "object"]},
                less(&open),
                "$$REMOVE",
            ]},
        }},
        doc! {"$unset": ["_newest"]},
    ]
}

/// What the window, as the grant left it, says this grant got.
fn read_grant(window: &Document, grant_id: ObjectId, limit: &RateLimit) -> Grant {
    let granted = window.get_document(rate::GRANTED).ok();
    let ours = granted.filter(|g| g.get_object_id(rate::GRANT_ID).ok() == Some(grant_id));
    let Some(g) = ours else {
        // Another write came between ours and its reply cannot be: findAndModify returns the
        // document as this update left it. A window written by another tool reads as full.
        return Grant::Starts {
            n: 0,
            ahead: 0,
            at: fleet_time::now(),
            free_in: Some(limit.per),
        };
    };
    let n = u32::try_from(crate::count_value(g.get(rate::N))).unwrap_or(u32::MAX);
    let ahead = u32::try_from(crate::count_value(g.get(rate::AHEAD))).unwrap_or(0);
    let at_ms = millis(g.get(rate::AT));
    let used = millis(g.get("used"))
        .saturating_add(i64::from(n))
        .saturating_add(i64::from(ahead));
    let full = used >= i64::from(limit.starts);
    let per_ms = i64::try_from(limit.per.as_millis()).unwrap_or(i64::MAX);
    let free_in = full.then(|| {
        let oldest = entry_times(window).min().unwrap_or(at_ms);
        let frees_at = oldest.saturating_add(per_ms);
        Duration::from_millis(u64::try_from(frees_at - at_ms).unwrap_or(0))
    });
    Grant::Starts {
        n,
        ahead,
        at: DateTime::from_millis(at_ms),
        free_in,
    }
}

/// The times of a window's entries, `starts` and the open one.
pub(crate) fn entry_times(window: &Document) -> impl Iterator<Item = i64> + '_ {
    let starts = window
        .get_array(rate::STARTS)
        .map(|a| a.as_slice())
        .unwrap_or(&[]);
    let open = window.get_document(OPEN).ok();
    starts
        .iter()
        .filter_map(|e| e.as_document())
        .chain(open)
        .map(|e| millis(e.get(rate::T)))
}

/// A whole number as stored (Int64 from the pipeline, Int32 or Double from another writer).
fn millis(v: Option<&Bson>) -> i64 {
    match v {
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Double(f)) if f.is_finite() => *f as i64,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(starts: u32) -> RateLimit {
        RateLimit {
            starts,
            per: Duration::from_secs(10),
            partition: None,
            max_partitions: 10,
        }
    }

    #[test]
    fn a_grant_is_read_back_by_its_id_and_a_full_window_says_when_it_frees() {
        let id = ObjectId::new();
        let window = doc! {
            "starts": [{"t": 1_000_i64, "n": 3_i64}],
            "open": {"t": 4_000_i64, "n": 2_i64},
            "granted": {"id": id, "n": 2_i64, "at": 4_000_i64, "used": 3_i64},
        };
        assert_eq!(
            read_grant(&window, id, &limit(5)),
            Grant::Starts {
                n: 2,
                ahead: 0,
                at: DateTime::from_millis(4_000),
                free_in: Some(Duration::from_millis(7_000)),
            }
        );
        let Grant::Starts { free_in, .. } = read_grant(&window, id, &limit(6)) else {
            panic!("a grant");
        };
        assert_eq!(free_in, None, "room is left");
        let Grant::Starts { n, .. } = read_grant(&window, ObjectId::new(), &limit(6)) else {
            panic!("a grant");
        };
        assert_eq!(n, 0, "another grant's record grants nothing");
    }

    #[test]
    fn the_pipeline_takes_the_limit_and_the_ask() {
        let p = grant_pipeline(ObjectId::new(), &limit(50), (7, 3), ObjectId::new());
        let text = format!("{p:?}");
        assert!(
            text.contains("Int64(50)") && text.contains("Int64(7)"),
            "{text}"
        );
        assert!(text.contains("10000"), "per in ms: {text}");
        assert!(
            text.contains("Int64(3)") && text.contains("Int64(25)"),
            "ahead, up to half the limit: {text}"
        );
        assert!(text.contains("Int64(500)"), "the horizon in ms: {text}");
    }
}
