//! Coordinate's work-spec scheduler: which queue a node claims from next, and how many tasks.
//!
//! Each queue is a work spec. Ineligible specs are dropped, only the highest priority
//! survives, and among those a weighted draw favours specs running less than their share.
//!
//! Where this differs from Coordinate's `GetWork`: Coordinate picks one spec and returns only
//! its units, so a worker asking for more than that spec has (or than its `max_getwork`)
//! gets fewer and asks again later. Here a node's room is shared draw by draw: once a spec
//! is full, capped by `max_getwork` or out of tasks, the next draw goes to the eligible
//! specs left, lower priorities included, so a node with many threads keeps them busy
//! (work-conserving). Priority still decides each draw: a lower spec only gets room the
//! higher ones cannot use.

use rand::Rng;

/// One queue as the scheduler sees it during a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecState {
    pub priority: i64,
    /// Share of the fleet relative to other specs of the same priority; ≤ 0 never runs.
    pub weight: i64,
    /// The global cap (`threads`, or `max_running`); 0 means paused, as in Disbatch.
    pub cap: u32,
    /// Claimed or running tasks on every node.
    pub running: u32,
    /// Most tasks one node takes from this spec per pick (`max_getwork`); None = no limit.
    pub max_getwork: Option<u32>,
    pub paused: bool,
    /// Believed to have a claimable task (cleared when a claim comes back empty).
    pub available: bool,
}

impl SpecState {
    /// Coordinate's `CanDoWork`: not paused, positive weight, below its cap, and work to do.
    pub fn is_eligible(&self) -> bool {
        !self.paused && self.weight > 0 && self.running < self.cap && self.available
    }
}

/// Picks the spec to claim from: highest priority among the eligible, then a draw where
/// each spec scores `weight·(P+1) − W·running` (its fair share of one more running task
/// minus what it already runs); scores ≤ 0 are never drawn. None when nothing is eligible.
pub fn pick_spec<R: Rng + ?Sized>(specs: &[SpecState], rng: &mut R) -> Option<usize> {
    let top = specs
        .iter()
        .filter(|s| s.is_eligible())
        .map(|s| s.priority)
        .max()?;
    let survivors: Vec<usize> = (0..specs.len())
        .filter(|&i| specs[i].is_eligible() && specs[i].priority == top)
        .collect();
    let total_weight: i128 = survivors.iter().map(|&i| specs[i].weight as i128).sum();
    let total_running: i128 = survivors.iter().map(|&i| specs[i].running as i128).sum();
    let scores: Vec<(usize, i128)> = survivors
        .iter()
        .map(|&i| {
            let s = &specs[i];
            (
                i,
                s.weight as i128 * (total_running + 1) - total_weight * s.running as i128,
            )
        })
        .filter(|(_, score)| *score > 0)
        .collect();
    let sum: i128 = scores.iter().map(|(_, s)| s).sum();
    // The scores sum to W > 0, so at least one is positive; the fallback never runs.
    let Ok(sum) = u128::try_from(sum) else {
        return survivors.first().copied();
    };
    let mut draw = rng.random_range(0..sum.max(1)) as i128;
    for (i, score) in &scores {
        if draw < *score {
            return Some(*i);
        }
        draw -= score;
    }
    scores.last().map(|(i, _)| *i)
}

/// Most tasks the picked spec can take: its room under the cap, `max_getwork`, and the
/// node's own room. This bounds one spec only; `share_room` gives what it cannot take to
/// the other specs (see the module's note on Coordinate).
pub fn claim_count(spec: &SpecState, node_room: u32) -> u32 {
    let room = spec.cap.saturating_sub(spec.running);
    let getwork = spec.max_getwork.unwrap_or(u32::MAX).max(1);
    room.min(getwork).min(node_room)
}

/// Shares a node's room among specs for one round of a pass: Coordinate's pick, made one
/// task at a time over running counts moved by each pick, so weights balance within the pass;
/// each spec's share is then claimed as one batch. A spec takes at most `most[i]` (its free
/// slots) and, with `max_getwork`, at most that many; room a spec cannot take goes to the
/// next eligible ones, lower priorities included (work-conserving, unlike `GetWork`).
pub fn share_room<R: Rng + ?Sized>(
    specs: &[SpecState],
    node_room: u32,
    most: &[u32],
    rng: &mut R,
) -> Vec<u32> {
    let mut specs = specs.to_vec();
    let limits: Vec<u32> = specs
        .iter()
        .zip(most)
        .map(|(s, most)| claim_count(s, u32::MAX).min(*most))
        .collect();
    let mut shares = vec![0u32; specs.len()];
    for (s, limit) in specs.iter_mut().zip(&limits) {
        if *limit == 0 {
            s.available = false;
        }
    }
    let mut room = node_room;
    while room > 0 {
        let Some(i) = pick_spec(&specs, rng) else {
            break;
        };
        shares[i] += 1;
        specs[i].running += 1;
        room -= 1;
        if shares[i] >= limits[i] {
            specs[i].available = false;
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn spec(priority: i64, weight: i64, running: u32) -> SpecState {
        SpecState {
            priority,
            weight,
            cap: 100,
            running,
            max_getwork: None,
            paused: false,
            available: true,
        }
    }

    /// How often each spec is picked over `n` draws with a fixed seed.
    fn shares(specs: &[SpecState], n: usize) -> Vec<f64> {
        let mut rng = StdRng::seed_from_u64(20_261_122);
        let mut hits = vec![0usize; specs.len()];
        for _ in 0..n {
            if let Some(i) = pick_spec(specs, &mut rng) {
                hits[i] += 1;
            }
        }
        hits.iter().map(|h| *h as f64 / n as f64).collect()
    }

    #[test]
    fn priority_is_strictly_first() {
        let specs = [spec(0, 1000, 0), spec(5, 1, 50), spec(3, 20, 0)];
        assert_eq!(shares(&specs, 2000), vec![0.0, 1.0, 0.0]);
        // An ineligible high-priority spec does not block lower ones.
        let mut specs = specs;
        specs[1].available = false;
        assert_eq!(shares(&specs, 2000), vec![0.0, 0.0, 1.0]);
    }

    #[test]
    fn weights_one_to_ten_give_one_eleventh_and_ten_elevenths() {
        let s = shares(&[spec(0, 1, 0), spec(0, 10, 0)], 20_000);
        assert!((s[0] - 1.0 / 11.0).abs() < 0.01, "{s:?}");
        assert!((s[1] - 10.0 / 11.0).abs() < 0.01, "{s:?}");
    }

    #[test]
    fn running_counts_shift_the_pick() {
        // Coordinate's test: weights 1 and 10 with 0 and 2 running → 3/11 vs 8/11.
        let s = shares(&[spec(0, 1, 0), spec(0, 10, 2)], 20_000);
        assert!((s[0] - 3.0 / 11.0).abs() < 0.01, "{s:?}");
        assert!((s[1] - 8.0 / 11.0).abs() < 0.01, "{s:?}");
        // A spec far over its share is never picked.
        let s = shares(&[spec(0, 1, 10), spec(0, 1, 0)], 2_000);
        assert_eq!(s, vec![0.0, 1.0]);
        // Equal weights, nothing running: uniform.
        let s = shares(&[spec(0, 20, 0), spec(0, 20, 0), spec(0, 20, 0)], 30_000);
        assert!(s.iter().all(|x| (x - 1.0 / 3.0).abs() < 0.01), "{s:?}");
    }

    #[test]
    fn paused_weightless_full_and_empty_specs_are_never_picked() {
        let mut paused = spec(9, 20, 0);
        paused.paused = true;
        let weightless = spec(9, 0, 0);
        let mut full = spec(9, 20, 3);
        full.cap = 3;
        let mut zero_threads = spec(9, 20, 0);
        zero_threads.cap = 0;
        let mut empty = spec(9, 20, 0);
        empty.available = false;
        let specs = [paused, weightless, full, zero_threads, empty];
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(pick_spec(&specs, &mut rng), None);
    }

    #[test]
    fn claim_count_honours_cap_max_getwork_and_node_room() {
        let mut s = spec(0, 20, 2);
        s.cap = 10;
        assert_eq!(claim_count(&s, 100), 8);
        s.max_getwork = Some(3);
        assert_eq!(claim_count(&s, 100), 3);
        assert_eq!(claim_count(&s, 2), 2);
        s.running = 10;
        assert_eq!(claim_count(&s, 100), 0);
        s.running = 0;
        s.max_getwork = Some(0);
        assert_eq!(
            claim_count(&s, 100),
            1,
            "max_getwork 0 is treated as 1, never as none"
        );
    }

    #[test]
    fn a_round_shares_the_room_by_weight_within_limits() {
        // Room 22 over weights 1 and 10: each draw sees the updated running counts, so the
        // room splits about 2 : 20.
        let mut rng = StdRng::seed_from_u64(7);
        let specs = [spec(0, 1, 0), spec(0, 10, 0)];
        let shares = share_room(&specs, 22, &[100, 100], &mut rng);
        assert_eq!(shares.iter().sum::<u32>(), 22);
        assert!((1..=4).contains(&shares[0]), "{shares:?}");
        // Free slots, the cap and max_getwork bound a share; the rest goes elsewhere.
        let mut capped = spec(0, 10, 0);
        capped.max_getwork = Some(3);
        let mut full = spec(0, 10, 0);
        full.cap = 2;
        let shares = share_room(&[capped, full, spec(0, 1, 0)], 10, &[100, 100, 1], &mut rng);
        assert_eq!(shares, vec![3, 2, 1]);
        // No room, or nothing eligible: nothing.
        assert_eq!(share_room(&specs, 0, &[5, 5], &mut rng), vec![0, 0]);
        assert_eq!(share_room(&specs, 5, &[0, 0], &mut rng), vec![0, 0]);
        // Unlimited node room ends when every spec reached its limit.
        assert_eq!(share_room(&specs, u32::MAX, &[4, 6], &mut rng), vec![4, 6]);
    }

    #[test]
    fn room_the_top_priority_cannot_take_goes_to_lower_ones() {
        // Coordinate's GetWork would return the 4 top-priority units only.
        let mut rng = StdRng::seed_from_u64(3);
        let specs = [spec(5, 20, 0), spec(0, 20, 0)];
        assert_eq!(share_room(&specs, 10, &[4, 100], &mut rng), vec![4, 6]);
        let mut capped = spec(5, 20, 0);
        capped.max_getwork = Some(2);
        assert_eq!(
            share_room(&[capped, spec(0, 20, 0)], 10, &[100, 100], &mut rng),
            vec![2, 8]
        );
    }
}
