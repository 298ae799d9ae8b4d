//! Lanes: how the nodes sharing a queue divide its slots and its tasks among themselves,
//! each in proportion to its weight (the room it can give the queue), without talking.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

/// Longest cycle of slots over which weights are laid out; larger weights are scaled down to
/// it, so a lane costs at most this many entries however large `threads` or `maxthreads` are.
const MAX_CYCLE: u64 = 1024;
/// Queues whose lanes a `LaneCache` keeps; past this it starts afresh (queues come and go).
const MAX_CACHED: usize = 4096;

/// This node's share of a queue: the positions it owns in a repeating cycle of slots, laid out
/// so that every stretch of slots is divided about in proportion to the nodes' weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    /// Whether each position of the cycle is this node's.
    table: Arc<[bool]>,
    /// The positions this node owns, ascending.
    owned: Arc<[u32]>,
    /// Nodes sharing the queue, this one included.
    nodes: u32,
}

impl Lane {
    /// A node alone on its queue.
    pub fn sole() -> Lane {
        Lane {
            table: Arc::from([true]),
            owned: Arc::from([0]),
            nodes: 1,
        }
    }

    /// Lane `index` of `of` equal ones: every `of`-th slot from `index`.
    pub fn striped(index: u32, of: u32) -> Lane {
        let of = of.max(1);
        let table: Vec<bool> = (0..of).map(|p| p == index).collect();
        Lane::from_table(table, of)
    }

    /// The lane of `me` among `sharers` (node → weight; `me` counted once, with `my_weight`
    /// when it is not among them). Nodes that see the same sharers and weights agree on every
    /// lane: the layout depends only on the names and weights, in name order.
    pub fn weighted<'a>(
        me: &str,
        my_weight: u64,
        sharers: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Lane {
        Lane::laid_out(me, &weights_of(me, my_weight, sharers))
    }

    /// The lane of `me` among `weights` (node → weight, `me` among them).
    fn laid_out(me: &str, weights: &BTreeMap<&str, u64>) -> Lane {
        let nodes = u32::try_from(weights.len()).unwrap_or(u32::MAX);
        if weights.len() == 1 {
            return Lane::sole();
        }
        let units = cycle_units(&weights.values().copied().collect::<Vec<_>>());
        let index = weights.keys().position(|n| *n == me).unwrap_or(0);
        let table = smooth_round_robin(&units)
            .into_iter()
            .map(|owner| owner == index)
            .collect();
        Lane::from_table(table, nodes)
    }

    fn from_table(table: Vec<bool>, nodes: u32) -> Lane {
        let owned: Vec<u32> = (0..table.len())
            .filter(|p| table[*p])
            .map(|p| u32::try_from(p).unwrap_or(u32::MAX))
            .collect();
        Lane {
            table: Arc::from(table),
            owned: Arc::from(owned),
            nodes,
        }
    }

    fn cycle(&self) -> u64 {
        self.table.len().max(1) as u64
    }

    /// Whether slot (or task key) `i` falls in this lane.
    pub fn owns(&self, i: u64) -> bool {
        self.table
            .get((i % self.cycle()) as usize)
            .copied()
            .unwrap_or(false)
    }

    /// How many of the slots below `threads` are this lane's.
    pub fn slots_below(&self, threads: u32) -> u64 {
        let cycle = self.cycle();
        let full = u64::from(threads) / cycle;
        let rest = u64::from(threads) % cycle;
        let partial = self.owned.iter().filter(|p| u64::from(**p) < rest).count() as u64;
        full * self.owned.len() as u64 + partial
    }

    /// The `k`-th slot of this lane (from 0), if the lane has any.
    pub fn nth_slot(&self, k: u64) -> Option<u64> {
        let per = self.owned.len() as u64;
        let at = usize::try_from(k % per.max(1)).ok()?;
        let position = u64::from(*self.owned.get(at)?);
        Some((k / per) * self.cycle() + position)
    }

    /// How many candidates to read per task wanted so that about one falls in this lane: the
    /// inverse of its share, but never more than the nodes sharing the queue (a node with a
    /// tiny share takes others' tasks rather than read ever more of them).
    pub fn spread(&self) -> u32 {
        let own = self.owned.len().max(1) as u64;
        let inverse = self.cycle().div_ceil(own);
        u32::try_from(inverse)
            .unwrap_or(u32::MAX)
            .clamp(1, self.nodes.max(1))
    }

    /// Nodes sharing the queue, this one included.
    pub fn nodes(&self) -> u32 {
        self.nodes
    }
}

/// Lanes laid out before, each beside the weights it came from: a lane is laid out again only
/// when its queue's sharers or their weights change, not on each of the claimer's passes (a
/// layout costs the cycle times the sharers: about a million steps for 1 000 unequal nodes).
#[derive(Debug, Clone)]
pub struct LaneCache<K> {
    lanes: HashMap<K, CachedLane>,
}

#[derive(Debug, Clone)]
struct CachedLane {
    me: String,
    weights: Vec<(String, u64)>,
    lane: Lane,
}

impl<K> Default for LaneCache<K> {
    fn default() -> Self {
        LaneCache {
            lanes: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq> LaneCache<K> {
    /// `Lane::weighted` for the queue `key`, from the cache when nothing it depends on changed.
    pub fn lane<'a>(
        &mut self,
        key: K,
        me: &str,
        my_weight: u64,
        sharers: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Lane {
        let weights = weights_of(me, my_weight, sharers);
        if let Some(c) = self.lanes.get(&key) {
            let same = c.me == me
                && c.weights.len() == weights.len()
                && c.weights
                    .iter()
                    .zip(&weights)
                    .all(|((n, w), (m, v))| n == m && w == v);
            if same {
                return c.lane.clone();
            }
        }
        let lane = Lane::laid_out(me, &weights);
        if self.lanes.len() >= MAX_CACHED && !self.lanes.contains_key(&key) {
            self.lanes.clear();
        }
        let weights = weights.iter().map(|(n, w)| (n.to_string(), *w)).collect();
        self.lanes.insert(
            key,
            CachedLane {
                me: me.to_string(),
                weights,
                lane: lane.clone(),
            },
        );
        lane
    }
}

/// `sharers` by name, with `me` among them (at `my_weight` when it is not already).
fn weights_of<'a, 'b: 'a>(
    me: &'a str,
    my_weight: u64,
    sharers: impl IntoIterator<Item = (&'b str, u64)>,
) -> BTreeMap<&'a str, u64> {
    let mut weights: BTreeMap<&'a str, u64> = sharers
        .into_iter()
        .map(|(n, w)| (n as &'a str, w))
        .collect();
    weights.entry(me).or_insert(my_weight);
    weights
}

/// Weights reduced to small whole units with the same proportions: divided by their common
/// divisor and, when their sum is over `MAX_CYCLE`, scaled down to it (each node keeps at least
/// one unit: a node that serves a queue always owns some of it).
fn cycle_units(weights: &[u64]) -> Vec<u64> {
    let weights: Vec<u64> = weights.iter().map(|w| (*w).max(1)).collect();
    let divisor = weights.iter().copied().fold(0, gcd).max(1);
    let units: Vec<u64> = weights.iter().map(|w| w / divisor).collect();
    let sum: u128 = units.iter().map(|u| u128::from(*u)).sum();
    if sum <= u128::from(MAX_CYCLE) {
        return units;
    }
    units
        .iter()
        .map(|u| {
            let scaled = u128::from(*u) * u128::from(MAX_CYCLE) / sum;
            u64::try_from(scaled).unwrap_or(MAX_CYCLE).max(1)
        })
        .collect()
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Nginx's smooth weighted round robin over one cycle (the sum of `units`): the owner of each
/// position, interleaved so that every prefix is close to the weights' proportions (a queue
/// with fewer `threads` than the cycle is still shared in proportion).
fn smooth_round_robin(units: &[u64]) -> Vec<usize> {
    let total: i128 = units.iter().map(|u| i128::from(*u)).sum();
    let mut current = vec![0i128; units.len()];
    let mut owners = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for _ in 0..total {
        for (c, u) in current.iter_mut().zip(units) {
            *c += i128::from(*u);
        }
        let best = (0..current.len())
            .max_by_key(|i| (current[*i], std::cmp::Reverse(*i)))
            .unwrap_or(0);
        current[best] -= total;
        owners.push(best);
    }
    owners
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(lanes: &[Lane], threads: u32) -> Vec<usize> {
        (0..threads)
            .map(|s| {
                let owning: Vec<usize> = (0..lanes.len())
                    .filter(|i| lanes[*i].owns(u64::from(s)))
                    .collect();
                assert_eq!(owning.len(), 1, "slot {s} has one owner: {owning:?}");
                owning[0]
            })
            .collect()
    }

    fn lanes_of(weights: &[(&str, u64)]) -> Vec<Lane> {
        weights
            .iter()
            .map(|(me, w)| Lane::weighted(me, *w, weights.iter().copied()))
            .collect()
    }

    #[test]
    fn equal_weights_are_stripes() {
        let lanes = lanes_of(&[("c", 4), ("a", 4), ("b", 4)]);
        assert_eq!(lanes[1], Lane::striped(0, 3));
        assert_eq!(lanes[2], Lane::striped(1, 3));
        assert_eq!(lanes[0], Lane::striped(2, 3));
        assert_eq!(Lane::weighted("a", 7, []), Lane::sole());
        assert_eq!(Lane::weighted("b", 1, [("a", 1)]), Lane::striped(1, 2));
    }

    #[test]
    fn shares_follow_the_weights_in_every_stretch_of_slots() {
        let lanes = lanes_of(&[("a", 2), ("b", 8), ("c", 6)]);
        let slots = owners(&lanes, 64);
        let count = |n: usize, upto: usize| slots[..upto].iter().filter(|o| **o == n).count();
        // 2:8:6 over 16 slots is exactly 2, 8, 6; over 64, 8, 32, 24.
        assert_eq!([count(0, 16), count(1, 16), count(2, 16)], [2, 8, 6]);
        assert_eq!([count(0, 64), count(1, 64), count(2, 64)], [8, 32, 24]);
        // A queue with fewer threads than the cycle is still divided about in proportion.
        assert_eq!([count(0, 4), count(1, 4), count(2, 4)], [1, 2, 1]);
        assert_eq!([count(0, 8), count(1, 8), count(2, 8)], [1, 4, 3]);
        for (i, lane) in lanes.iter().enumerate() {
            assert_eq!(lane.slots_below(64), count(i, 64) as u64);
            assert_eq!(lane.slots_below(13), count(i, 13) as u64);
            let listed: Vec<u64> = (0..lane.slots_below(64))
                .filter_map(|k| lane.nth_slot(k))
                .collect();
            let owned: Vec<u64> = (0..64).filter(|s| lane.owns(*s)).collect();
            assert_eq!(listed, owned, "nth_slot lists the lane in order");
        }
        assert_eq!(
            lanes[0].spread(),
            3,
            "a 1/8 share reads at most one per node"
        );
        assert_eq!(lanes[1].spread(), 2);
        assert_eq!(Lane::sole().spread(), 1);
    }

    #[test]
    fn huge_and_odd_weights_stay_bounded_and_give_everyone_a_share() {
        let lanes = lanes_of(&[("a", u64::MAX), ("b", 1), ("c", 0), ("d", 1 << 40)]);
        let cycle = lanes[0].cycle();
        assert!(cycle <= MAX_CYCLE + 4, "{cycle}");
        for lane in &lanes {
            assert!(lane.slots_below(u32::MAX) > 0, "every sharer owns slots");
        }
        owners(&lanes, 5000);
        // Slots near u32::MAX are counted and listed without overflow.
        let last = lanes[0].nth_slot(lanes[0].slots_below(u32::MAX) - 1);
        assert!(last.is_some_and(|s| s < u64::from(u32::MAX)));
    }

    #[test]
    fn the_cache_lays_a_lane_out_again_only_when_its_inputs_change() {
        let mut cache = LaneCache::default();
        let fresh = |me: &str, w: u64, s: &[(&str, u64)]| Lane::weighted(me, w, s.iter().copied());
        let mut check = |q: u32, me: &str, w: u64, s: &[(&str, u64)]| {
            let cached = cache.lane(q, me, w, s.iter().copied());
            assert_eq!(cached, fresh(me, w, s), "queue {q}, {me}, {s:?}");
        };
        check(1, "b", 2, &[("a", 1)]);
        check(1, "b", 2, &[("a", 1)]);
        check(1, "b", 2, &[("a", 3)]);
        check(1, "b", 2, &[("a", 3), ("c", 3)]);
        check(1, "b", 2, &[("c", 3)]);
        check(1, "a", 2, &[("c", 3)]);
        check(1, "a", 5, &[("c", 3)]);
        check(2, "a", 5, &[]);
        check(1, "a", 5, &[("c", 3)]);
        for q in 0..(MAX_CACHED as u32 + 10) {
            check(q, "a", 1, &[("b", 1)]);
        }
        assert!(cache.lanes.len() <= MAX_CACHED);
    }

    #[test]
    fn a_node_missing_from_the_sharers_uses_its_own_weight() {
        let mine = Lane::weighted("b", 3, [("a", 1)]);
        let theirs = Lane::weighted("a", 1, [("b", 3)]);
        let lanes = [theirs, mine];
        let slots = owners(&lanes, 8);
        assert_eq!(slots.iter().filter(|o| **o == 1).count(), 6);
    }
}
