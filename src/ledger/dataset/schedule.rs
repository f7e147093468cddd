//! The predictable mode's refresh schedule (spec §3.2): which ids are due
//! before which step, refusing refreshes the schedule does not call for, and
//! refusing a step until the refresh due before it has arrived.
//!
//! Thresholds are predictable only if they change at times and for examples
//! fixed by public information: a full pass every `E` steps and/or a
//! round-robin block of `m` ids per step, `(t*m + j) mod n`. A refresh may come
//! in several requests (a full pass over millions of examples); each id due is
//! received once, tracked in a bitset over the due set, which lives only until
//! the step it precedes is applied. Cost: `O(ids)` per refresh request and, for
//! the completeness check of a step, `O(1)` when every due id arrived
//! (otherwise `O(due)` to excuse retired ids).

use super::columns::RETIRED;
use super::Ledger;
use crate::ledger::error::LedgerError;
use crate::ledger::protocol::RefreshDue;
use serde::{Deserialize, Serialize};

/// What of the refresh due before `step` has arrived (part of a snapshot).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct RefreshProgress {
    /// The step the refresh precedes.
    step: u64,
    /// Bit `j` set: the `j`-th due id arrived.
    received_bits: Vec<u64>,
    /// Number of bits set.
    received: u64,
}

/// The ids due before one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Due {
    full: bool,
    first: u64,
    count: u64,
}

impl Due {
    /// Position of `id` in the due set, if it is due.
    fn index_of(&self, id: u64, n: u64) -> Option<u64> {
        // Without a division for ids in range: this runs twice per
        // refreshed id (out-of-range ids are refused by the batch check).
        let j = if self.full {
            id
        } else if id >= n {
            (id + n - self.first) % n
        } else if id >= self.first {
            id - self.first
        } else {
            id + (n - self.first)
        };
        (j < self.count).then_some(j)
    }

    fn describe(&self, n: u64) -> String {
        if self.full {
            format!("a full pass over ids 0..{n}")
        } else if self.first + self.count <= n {
            format!(
                "the round-robin block of ids {}..{}",
                self.first,
                self.first + self.count
            )
        } else {
            format!(
                "the round-robin block of ids {}..{} and 0..{}",
                self.first,
                n,
                self.first + self.count - n
            )
        }
    }
}

impl Ledger {
    /// The ids the public schedule calls for before step `t` (predictable mode).
    fn due_before(&self, t: u64) -> Option<Due> {
        if !self.config.is_predictable() {
            return None;
        }
        let schedule = self.config.refresh?;
        let n = self.n as u64;
        if schedule.full_every.is_some_and(|e| t % e == 0) {
            return Some(Due {
                full: true,
                first: 0,
                count: n,
            });
        }
        schedule.block_before(t, n).map(|(first, count)| Due {
            full: false,
            first,
            count,
        })
    }

    fn received_so_far(&self, t: u64) -> u64 {
        match &self.refresh_progress {
            Some(p) if p.step == t => p.received,
            _ => 0,
        }
    }

    fn was_received(&self, t: u64, j: u64) -> bool {
        match &self.refresh_progress {
            Some(p) if p.step == t => p
                .received_bits
                .get((j / 64) as usize)
                .is_some_and(|w| w >> (j % 64) & 1 == 1),
            _ => false,
        }
    }

    /// The scheduled refresh due before the next step, as the trainer is told
    /// (`None` outside the predictable mode or when nothing is due).
    pub fn refresh_due(&self) -> Option<RefreshDue> {
        let t = self.next_step;
        let due = self.due_before(t)?;
        Some(RefreshDue {
            before_step: t,
            full: due.full,
            first_id: due.first,
            count: due.count,
            received: self.received_so_far(t),
        })
    }

    /// Refuse a refresh the schedule does not call for (predictable mode):
    /// without a schedule, at a step where nothing is due, an id not due, or
    /// one already received. The sampled mode takes refreshes at any time.
    pub(super) fn check_on_schedule(&self, ids: &[u64]) -> Result<(), LedgerError> {
        // An empty refresh changes nothing (a sharded dataset's shards get
        // one when none of their ids are in the request).
        if !self.config.is_predictable() || ids.is_empty() {
            return Ok(());
        }
        let t = self.next_step;
        let n = self.n as u64;
        if self.config.refresh.is_none() {
            return Err(LedgerError::OffSchedule {
                step: t,
                reason: "the dataset declared no refresh schedule at creation, so its thresholds \
                         stay at max_grad_norm (create it with \"refresh\": {\"full_every\": E} \
                         and/or {\"block\": m})"
                    .into(),
            });
        }
        let Some(due) = self.due_before(t) else {
            return Err(LedgerError::OffSchedule {
                step: t,
                reason: format!(
                    "no refresh is due before step {t}; the next is due before step {}",
                    self.next_due_step(t)
                ),
            });
        };
        for (k, &id) in ids.iter().enumerate() {
            let Some(j) = due.index_of(id, n) else {
                return Err(LedgerError::OffSchedule {
                    step: t,
                    reason: format!(
                        "ids[{k}] = {id} is not due; the schedule calls for {}",
                        due.describe(n)
                    ),
                });
            };
            if self.was_received(t, j) {
                return Err(LedgerError::OffSchedule {
                    step: t,
                    reason: format!(
                        "ids[{k}] = {id} was already refreshed before step {t}; each scheduled \
                         id is refreshed once"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The first step after `t` before which a refresh is due.
    fn next_due_step(&self, t: u64) -> u64 {
        match self.config.refresh {
            Some(s) if s.block.is_some() => t + 1,
            Some(s) => s.full_every.map_or(u64::MAX, |e| (t / e + 1) * e),
            None => u64::MAX,
        }
    }

    /// Mark `ids` (checked by [`Ledger::check_on_schedule`]) as received.
    pub(super) fn record_refresh(&mut self, ids: &[u64]) {
        let t = self.next_step;
        let Some(due) = self.due_before(t) else {
            return;
        };
        let n = self.n as u64;
        let progress = match &mut self.refresh_progress {
            Some(p) if p.step == t => p,
            slot => slot.insert(RefreshProgress {
                step: t,
                received_bits: vec![0; due.count.div_ceil(64) as usize],
                received: 0,
            }),
        };
        for &id in ids {
            if let Some(j) = due.index_of(id, n) {
                let word = &mut progress.received_bits[(j / 64) as usize];
                if *word >> (j % 64) & 1 == 0 {
                    *word |= 1 << (j % 64);
                    progress.received += 1;
                }
            }
        }
    }

    /// Refuse step `t` until the refresh due before it has arrived (retired
    /// ids excepted: a retired example is never refreshed).
    pub(super) fn check_refresh_arrived(&self, t: u64) -> Result<(), LedgerError> {
        let Some(due) = self.due_before(t) else {
            return Ok(());
        };
        let received = self.received_so_far(t);
        if received >= due.count {
            return Ok(());
        }
        let n = self.n as u64;
        let missing = (0..due.count)
            .filter(|&j| !self.was_received(t, j))
            .filter(|&j| {
                let id = if due.full { j } else { (due.first + j) % n };
                self.flags[id as usize] & RETIRED == 0
            })
            .count() as u64;
        if missing == 0 {
            return Ok(());
        }
        Err(LedgerError::RefreshDue {
            step: t,
            missing,
            count: due.count,
            due: due.describe(n),
        })
    }

    /// Drop the progress of a refresh whose step has been applied.
    pub(super) fn forget_refresh_before(&mut self, next_step: u64) {
        if self
            .refresh_progress
            .as_ref()
            .is_some_and(|p| p.step < next_step)
        {
            self.refresh_progress = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Due;
    use crate::ledger::{RefreshSchedule, ShardSpan};

    /// The ids a block `(first, count)` over `n` ids names.
    fn ids_of(due: Option<(u64, u64)>, n: u64) -> Vec<u64> {
        let mut ids: Vec<u64> = due.map_or(vec![], |(first, count)| {
            (0..count).map(|j| (first + j) % n).collect()
        });
        ids.sort_unstable();
        ids
    }

    #[test]
    fn each_shard_is_due_exactly_its_part_of_the_datasets_block() {
        for total in 1..14u64 {
            for m in 1..=total {
                let whole = RefreshSchedule {
                    block: Some(m),
                    ..Default::default()
                };
                // Every way to cut the ids into two or three shards.
                for cut1 in 1..total {
                    for cut2 in cut1..=total {
                        let ranges = [(0, cut1), (cut1, cut2), (cut2, total)];
                        for t in 0..2 * total {
                            // The dataset's block, from its definition.
                            let mut want: Vec<u64> = (0..m).map(|j| (t * m + j) % total).collect();
                            want.sort_unstable();
                            let mut got = Vec::new();
                            for &(a, b) in ranges.iter().filter(|(a, b)| a < b) {
                                let shard = RefreshSchedule {
                                    shard: Some(ShardSpan {
                                        start: a,
                                        dataset_examples: total,
                                    }),
                                    ..whole
                                };
                                let due = shard.block_before(t, b - a);
                                assert!(due.is_none_or(|(f, c)| f < b - a && c >= 1 && c <= b - a));
                                got.extend(ids_of(due, b - a).into_iter().map(|i| i + a));
                            }
                            got.sort_unstable();
                            assert_eq!(got, want, "n {total} m {m} shards {ranges:?} t {t}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_block_wraps_around_the_id_space() {
        let due = Due {
            full: false,
            first: 8,
            count: 4,
        };
        let n = 10;
        let due_ids: Vec<u64> = (0..n).filter(|&i| due.index_of(i, n).is_some()).collect();
        assert_eq!(due_ids, vec![0, 1, 8, 9]);
        assert_eq!(due.index_of(8, n), Some(0));
        assert_eq!(due.index_of(1, n), Some(3));
        assert!(due.describe(n).contains("8..10 and 0..2"));
    }

    #[test]
    fn a_full_pass_covers_every_id() {
        let due = Due {
            full: true,
            first: 0,
            count: 5,
        };
        assert!((0..5).all(|i| due.index_of(i, 5) == Some(i)));
        assert_eq!(due.index_of(5, 5), None);
    }
}
