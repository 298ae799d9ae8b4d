//! Contention between nodes, from the DENs' own metrics: tasks claimed, and claims that came to
//! nothing because another node was first (the task, or its slot) or the read found no task.

use serde::Serialize;

use crate::exposition;

/// Counts summed over the fleet's DENs, at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClaimCounts {
    pub claimed: f64,
    pub lost: f64,
    pub slot_taken: f64,
    pub empty: f64,
}

impl ClaimCounts {
    /// Sums one DEN's exposition into these counts.
    fn add(&mut self, text: &str) -> Result<(), String> {
        let e = exposition::check(text)?;
        for s in &e.samples {
            let reason = s
                .labels
                .iter()
                .find(|(k, _)| k == "reason")
                .map(|(_, v)| v.as_str());
            match (s.name.as_str(), reason) {
                ("disbatch_den_claims_total", _) => self.claimed += s.value,
                ("disbatch_den_claim_misses_total", Some("lost")) => self.lost += s.value,
                ("disbatch_den_claim_misses_total", Some("slot_taken")) => {
                    self.slot_taken += s.value
                }
                ("disbatch_den_claim_misses_total", Some("empty")) => self.empty += s.value,
                _ => {}
            }
        }
        Ok(())
    }

    /// Scrapes every DEN's `/metrics` (base URLs as each printed them).
    pub async fn scrape(bases: &[String]) -> anyhow::Result<ClaimCounts> {
        let mut counts = ClaimCounts::default();
        for base in bases {
            counts
                .add(&exposition_of(base).await?)
                .map_err(anyhow::Error::msg)?;
        }
        Ok(counts)
    }

    /// What happened between `before` and these counts, per task run.
    pub fn per_task_since(&self, before: &ClaimCounts, tasks: usize) -> Contention {
        let per = |a: f64, b: f64| (a - b).max(0.0) / tasks.max(1) as f64;
        Contention {
            claimed_per_task: per(self.claimed, before.claimed),
            lost_per_task: per(self.lost, before.lost),
            slot_taken_per_task: per(self.slot_taken, before.slot_taken),
            empty_reads_per_task: per(self.empty, before.empty),
        }
    }
}

async fn exposition_of(base: &str) -> anyhow::Result<String> {
    Ok(reqwest::get(format!("{base}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await?)
}

/// Task ends the DENs counted (`disbatch_den_tasks_finished_total`): how the bench follows a
/// run without reading the database it measures (counting attempts reads every one of them).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TaskEnds {
    pub succeeded: f64,
    /// Any other outcome: failed, retry, timed out, lost, discarded, unknown.
    pub other: f64,
}

impl TaskEnds {
    fn add(&mut self, text: &str) -> Result<(), String> {
        let e = exposition::check(text)?;
        for s in e
            .samples
            .iter()
            .filter(|s| s.name == "disbatch_den_tasks_finished_total")
        {
            match s.labels.iter().find(|(k, _)| k == "outcome") {
                Some((_, o)) if o == "succeeded" => self.succeeded += s.value,
                _ => self.other += s.value,
            }
        }
        Ok(())
    }

    /// Sums every DEN's counts.
    pub async fn scrape(bases: &[String]) -> anyhow::Result<TaskEnds> {
        let mut ends = TaskEnds::default();
        for base in bases {
            ends.add(&exposition_of(base).await?)
                .map_err(anyhow::Error::msg)?;
        }
        Ok(ends)
    }

    /// The ends counted since `before`.
    pub fn since(&self, before: &TaskEnds) -> TaskEnds {
        TaskEnds {
            succeeded: self.succeeded - before.succeeded,
            other: self.other - before.other,
        }
    }
}

/// Claims per task run: 1.00 claimed and nothing else means no node got in another's way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Contention {
    pub claimed_per_task: f64,
    /// Picks another node claimed first (or that changed since the read).
    pub lost_per_task: f64,
    /// Picks refused because another node held the slot.
    pub slot_taken_per_task: f64,
    /// Reads that found nothing to claim.
    pub empty_reads_per_task: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_sum_over_queues_and_reasons() {
        let text = "# TYPE disbatch_den_claims_total counter\n\
            disbatch_den_claims_total{queue=\"a\"} 10\n\
            disbatch_den_claims_total{queue=\"b\"} 5\n\
            # TYPE disbatch_den_claim_misses_total counter\n\
            disbatch_den_claim_misses_total{queue=\"a\",reason=\"lost\"} 3\n\
            disbatch_den_claim_misses_total{queue=\"b\",reason=\"lost\"} 1\n\
            disbatch_den_claim_misses_total{queue=\"a\",reason=\"slot_taken\"} 2\n\
            disbatch_den_claim_misses_total{queue=\"a\",reason=\"empty\"} 7\n";
        let mut c = ClaimCounts::default();
        c.add(text).expect("parses");
        c.add(text).expect("a second node");
        assert_eq!(
            c,
            ClaimCounts {
                claimed: 30.0,
                lost: 8.0,
                slot_taken: 4.0,
                empty: 14.0
            }
        );
        let per = c.per_task_since(&ClaimCounts::default(), 10);
        assert_eq!(per.claimed_per_task, 3.0);
        assert_eq!(per.lost_per_task, 0.8);
        assert!(ClaimCounts::default().add("not metrics{").is_err());
    }

    #[test]
    fn task_ends_split_succeeded_from_every_other_outcome() {
        let text = "# TYPE disbatch_den_tasks_finished_total counter\n\
            disbatch_den_tasks_finished_total{queue=\"a\",outcome=\"succeeded\"} 7\n\
            disbatch_den_tasks_finished_total{queue=\"b\",outcome=\"succeeded\"} 1\n\
            disbatch_den_tasks_finished_total{queue=\"a\",outcome=\"failed\"} 0\n\
            disbatch_den_tasks_finished_total{queue=\"a\",outcome=\"retry\"} 2\n\
            # TYPE disbatch_den_claims_total counter\n\
            disbatch_den_claims_total{queue=\"a\"} 10\n";
        let mut ends = TaskEnds::default();
        ends.add(text).expect("parses");
        assert_eq!(
            ends,
            TaskEnds {
                succeeded: 8.0,
                other: 2.0
            }
        );
        let before = TaskEnds {
            succeeded: 3.0,
            other: 2.0,
        };
        assert_eq!(
            ends.since(&before),
            TaskEnds {
                succeeded: 5.0,
                other: 0.0
            }
        );
    }
}
