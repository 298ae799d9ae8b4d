//! What a claimer pass pays per queue for its lane: laid out afresh (as before the cache) and
//! from the cache when the queue's sharers are unchanged. Run: `cargo bench -p disbatch-den`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use disbatch_den::claimer::lanes::{Lane, LaneCache};

/// Mean time per call of `f`, over at least `budget`.
fn per_call(budget: Duration, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut calls = 0u32;
    while start.elapsed() < budget || calls < 3 {
        f();
        calls += 1;
    }
    start.elapsed() / calls
}

fn main() {
    let budget = Duration::from_millis(500);
    println!("sharers  weights   fresh layout  cached");
    for nodes in [10usize, 100, 1000] {
        for (kind, weight) in [
            ("equal", (|_| 8) as fn(usize) -> u64),
            ("unequal", |i| 1 + (i as u64 * 7) % 64),
        ] {
            let names: Vec<String> = (0..nodes).map(|i| format!("node-{i:04}")).collect();
            let sharers: Vec<(&str, u64)> = names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.as_str(), weight(i)))
                .collect();
            let me = names[nodes / 2].as_str();
            let fresh = per_call(budget, || {
                black_box(Lane::weighted(me, 8, sharers.iter().copied()));
            });
            let mut cache = LaneCache::default();
            let cached = per_call(budget, || {
                black_box(cache.lane(1u32, me, 8, sharers.iter().copied()));
            });
            println!("{nodes:>7}  {kind:<8} {fresh:>13.1?}  {cached:>8.1?}");
        }
    }
}
