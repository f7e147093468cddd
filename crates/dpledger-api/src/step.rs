//! The step protocol's messages (spec §3): what a trainer reports for a step and
//! what the ledger answers, as JSON bodies. The server and the Rust client both
//! use these definitions, so a field added to one side is added to the other,
//! and the retry hash and the merge of a sharded dataset's due refreshes are
//! computed alike on both. The doc comments are also the descriptions of the
//! server's OpenAPI document (feature `openapi`).

use crate::error::InvalidArgument;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use xxhash_rust::xxh3::Xxh3;

/// One part of a step that data-parallel workers report separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Part {
    /// Which part this is, `0..count`.
    pub index: u32,
    /// How many parts the step has; every part must say the same.
    pub count: u32,
}

impl Part {
    /// A step reported in one piece.
    pub const WHOLE: Part = Part { index: 0, count: 1 };
}

/// What the trainer reports for one step (or one part of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StepReport {
    /// Step number; steps are applied in order from 0.
    pub step: u64,
    /// Ids of the examples in the batch (distinct). Empty for an empty batch.
    #[serde(default)]
    pub ids: Vec<u64>,
    /// Their observed, unclipped gradient norms (finite, `>= 0`), same order.
    #[serde(default)]
    pub norms: Vec<f64>,
    /// Noise multiplier of this step when it differs from the dataset's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_multiplier: Option<f64>,
    /// Sampling rate of this step when it differs from the default (Poisson only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_rate: Option<f64>,
    /// Present when the step is reported in several parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<Part>,
}

impl StepReport {
    /// A whole-step report with the dataset's default hyperparameters.
    pub fn new(step: u64, ids: Vec<u64>, norms: Vec<f64>) -> Self {
        Self {
            step,
            ids,
            norms,
            noise_multiplier: None,
            sampling_rate: None,
            part: None,
        }
    }

    /// The part this report is (a whole step is part 0 of 1).
    pub fn part_or_whole(&self) -> Part {
        self.part.unwrap_or(Part::WHOLE)
    }

    /// xxh3 of a canonical encoding of every field, used to recognise retries.
    ///
    /// A missing `part` encodes as part 0 of 1 and `-0.0` as `0.0`, so reports that
    /// mean the same thing hash the same.
    pub fn content_hash(&self) -> u64 {
        let mut h = Xxh3::new();
        h.update(b"dpledger.step.v1");
        h.update(&self.step.to_le_bytes());
        let part = self.part_or_whole();
        h.update(&part.index.to_le_bytes());
        h.update(&part.count.to_le_bytes());
        for opt in [self.noise_multiplier, self.sampling_rate] {
            match opt {
                None => h.update(&[0]),
                Some(x) => {
                    h.update(&[1]);
                    h.update(&(x + 0.0).to_bits().to_le_bytes());
                }
            }
        }
        h.update(&(self.ids.len() as u64).to_le_bytes());
        let mut buf = [0u8; 2048];
        for chunk in self.ids.chunks(256) {
            for (slot, id) in buf.chunks_exact_mut(8).zip(chunk) {
                slot.copy_from_slice(&id.to_le_bytes());
            }
            h.update(&buf[..chunk.len() * 8]);
        }
        h.update(&(self.norms.len() as u64).to_le_bytes());
        for chunk in self.norms.chunks(256) {
            for (slot, g) in buf.chunks_exact_mut(8).zip(chunk) {
                slot.copy_from_slice(&(g + 0.0).to_bits().to_le_bytes());
            }
            h.update(&buf[..chunk.len() * 8]);
        }
        h.digest()
    }
}

/// Refuses a norm that is not a finite number >= 0 (field `norms`): the rule
/// every reported batch keeps, checked by the ledger and, before any shard
/// sees a step, wherever a sharded dataset's report is split (a node, or the
/// Rust client before sending).
pub fn check_norms(norms: &[f64]) -> Result<(), InvalidArgument> {
    match norms
        .iter()
        .enumerate()
        .find(|(_, g)| !(g.is_finite() && **g >= 0.0))
    {
        Some((j, g)) => Err(InvalidArgument::new(
            "norms",
            format!("norms[{j}] = {g}: every norm must be a finite number >= 0"),
        )),
        None => Ok(()),
    }
}

/// The ledger's answer to a step report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepOutcome {
    /// The step reported.
    pub step: u64,
    /// True when this answers a retry: the report was already applied (or, for a
    /// part, already received) and nothing changed.
    pub duplicate: bool,
    /// The part answered (absent for a whole step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<Part>,
    /// True once the step has been applied (also in the answer to a retry of
    /// any part of an applied step); false for parts still waiting for other
    /// parts.
    pub complete: bool,
    /// New clipping thresholds `v_{b_i}` of the reported ids, in report order: the
    /// trainer must clip each example at this value from the next step on (0 for
    /// retired examples).
    pub thresholds: Vec<f64>,
    /// Ids the individual filter retires: from the next step on their threshold is
    /// 0 (the trainer must stop sampling them or clip them to zero). Sorted; only
    /// in the answer of the part that completes the step.
    pub retired: Vec<u64>,
    /// Predictable mode: the scheduled refresh due before the next step, if
    /// any (only in the answer of the part that completes the step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_due: Option<RefreshDue>,
}

/// The refresh that the public schedule calls for before a step (predictable
/// mode, spec §3.2): the trainer computes these examples' unclipped norms at
/// the current model and sends them before it clips the step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RefreshDue {
    /// The step the refresh must arrive before (its thresholds apply from it).
    pub before_step: u64,
    /// True for a full pass (every example); false for a round-robin block.
    pub full: bool,
    /// The block's first id: the ids due are `(first_id + j) mod examples` for
    /// `j < count` (a full pass: `0..examples`).
    pub first_id: u64,
    /// How many ids are due (retired ids may be left out).
    pub count: u64,
    /// How many of them have arrived so far.
    pub received: u64,
}

impl RefreshDue {
    /// The ids due, given the dataset's number of examples: what a trainer
    /// computes fresh norms of before `before_step`.
    pub fn ids(&self, examples: u64) -> Vec<u64> {
        (0..self.count)
            .map(|j| (self.first_id + j) % examples.max(1))
            .collect()
    }

    /// A sharded dataset's due refresh from its shards' (each in its own ids;
    /// `ranges[s]` is shard `s`'s range of the dataset's ids, in id order):
    /// a full pass over all of them, or the dataset's round-robin block (each
    /// shard is due its part of it, one cyclic range of its own ids), with
    /// what has arrived summed; `None` when no shard has one due. Only the
    /// shards due before the earliest step count (a shard none of whose ids
    /// were due may have applied a step the others held). From a subset of
    /// the shards (a thresholds answer over some ids), the due ids of those
    /// shards only.
    pub fn merge<'a>(
        ranges: &[Range<u64>],
        parts: impl IntoIterator<Item = (usize, Option<&'a RefreshDue>)>,
    ) -> Option<Self> {
        let total = ranges.last().map_or(0, |r| r.end);
        let parts: Vec<(usize, &RefreshDue)> = parts
            .into_iter()
            .filter_map(|(s, due)| due.map(|d| (s, d)))
            .collect();
        // The dataset's next step is its shards' earliest: a shard that
        // already applied it (it had no id due) tells of a later refresh.
        let next = parts.iter().map(|(_, d)| d.before_step).min()?;
        let mut merged: Option<RefreshDue> = None;
        let mut pieces: Vec<Range<u64>> = Vec::new();
        for (s, due) in parts.into_iter().filter(|(_, d)| d.before_step == next) {
            let Some(range) = ranges.get(s) else {
                continue;
            };
            let n = range.end - range.start;
            let (first, count) = (due.first_id % n.max(1), due.count.min(n));
            if first + count <= n {
                pieces.push(range.start + first..range.start + first + count);
            } else {
                pieces.push(range.start + first..range.end);
                pieces.push(range.start..range.start + first + count - n);
            }
            merged = Some(match merged {
                None => due.clone(),
                Some(a) => RefreshDue {
                    full: a.full && due.full,
                    received: a.received + due.received,
                    ..a
                },
            });
        }
        let mut merged = merged?;
        pieces.sort_unstable_by_key(|p| p.start);
        let mut joined: Vec<Range<u64>> = Vec::with_capacity(pieces.len());
        for p in pieces.into_iter().filter(|p| !p.is_empty()) {
            match joined.last_mut() {
                Some(last) if p.start <= last.end => last.end = last.end.max(p.end),
                _ => joined.push(p),
            }
        }
        merged.count = joined.iter().map(|p| p.end - p.start).sum();
        merged.first_id = match joined.as_slice() {
            _ if merged.full => 0,
            // A block that wraps past the dataset's last id.
            [head, .., tail] if head.start == 0 && tail.end == total => tail.start,
            [first, ..] => first.start,
            [] => 0,
        };
        Some(merged)
    }
}

/// The answer to a full-batch refresh.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RefreshOutcome {
    /// The step from which the new thresholds apply (the next step).
    pub effective_step: u64,
    /// New thresholds of the refreshed ids, in report order.
    pub thresholds: Vec<f64>,
    /// Ids the individual filter retires before `effective_step` because a raised
    /// threshold would let the next step push them over budget.
    pub retired: Vec<u64>,
    /// Predictable mode: what of the scheduled refresh is still due before
    /// `effective_step` (`received == count` once complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_due: Option<RefreshDue>,
}

#[cfg(test)]
mod refresh_due_tests {
    use super::RefreshDue;
    use std::ops::Range;

    /// Shard `range`'s part of the dataset's block `ids`, in its own ids, as
    /// one cyclic range (what a shard's ledger says is due).
    fn shard_due(range: &Range<u64>, ids: &[u64], t: u64) -> Option<RefreshDue> {
        let n = range.end - range.start;
        let local: Vec<u64> = (0..n)
            .filter(|i| ids.contains(&(range.start + i)))
            .collect();
        let first = *local
            .iter()
            .find(|&&f| !local.contains(&((f + n - 1) % n)))
            .or(local.first())?;
        Some(RefreshDue {
            before_step: t,
            full: false,
            first_id: if local.len() as u64 == n { 0 } else { first },
            count: local.len() as u64,
            received: 1,
        })
    }

    #[test]
    fn shards_parts_of_a_block_merge_into_the_datasets_block() {
        let total = 11u64;
        let ranges = [0..3, 3..4, 4..9, 9..11];
        for m in 1..=total {
            for t in 0..total {
                let first = (t * m) % total;
                let ids: Vec<u64> = (0..m).map(|j| (first + j) % total).collect();
                let parts: Vec<Option<RefreshDue>> =
                    ranges.iter().map(|r| shard_due(r, &ids, t)).collect();
                let merged = RefreshDue::merge(
                    &ranges,
                    parts.iter().enumerate().map(|(s, d)| (s, d.as_ref())),
                )
                .expect("some shard is due");
                let mut got = merged.ids(total);
                let mut want = ids.clone();
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "m {m} t {t}: {merged:?}");
                if m < total {
                    assert_eq!(merged.first_id, first, "m {m} t {t}");
                }
                let shards_due = parts.iter().flatten().count() as u64;
                assert_eq!((merged.full, merged.received), (false, shards_due));
            }
        }
    }

    #[test]
    fn full_passes_of_the_shards_merge_into_one() {
        let ranges = [0..4, 4..10];
        let full = |n| RefreshDue {
            before_step: 5,
            full: true,
            first_id: 0,
            count: n,
            received: 2,
        };
        let (a, b) = (full(4), full(6));
        let merged = RefreshDue::merge(&ranges, [(0, Some(&a)), (1, Some(&b))]).unwrap();
        assert_eq!(
            merged,
            RefreshDue {
                before_step: 5,
                full: true,
                first_id: 0,
                count: 10,
                received: 4
            }
        );
        assert_eq!(RefreshDue::merge(&ranges, [(0, None), (1, None)]), None);
        // A shard that applied step 5 (none of its ids were due) tells of
        // the refresh before step 6: the dataset's is still the one before 5.
        let ahead = RefreshDue {
            before_step: 6,
            ..full(6)
        };
        let merged = RefreshDue::merge(&ranges, [(0, Some(&a)), (1, Some(&ahead))]).unwrap();
        assert_eq!((merged.before_step, merged.count), (5, 4));
    }
}
