//! The rule that splits a step's batch by id range over a sharded dataset's
//! shards, written once for the two places that apply it: the
//! server's node-side split (`src/engine/sharding/split.rs`) and the Rust
//! client's split before sending (`dpledger_client::shard`); both depend on this
//! crate.
//! Both must cut a report into identical parts, so that a part sent by the
//! client and the same part cut by a node (a retry through another path) are
//! one content to the shard: exactly once per part. It works on plain id and
//! norm slices; [`crate::split_step`] applies it to the step protocol's
//! messages.
//!
//! Shard `s` holds the ids `ranges[s]`; it gets the report's ids of its range
//! as its own ids (`id - ranges[s].start`), in the report's order, with their
//! norms, and an empty batch when none is its own.

use std::fmt;
use std::ops::Range;

/// A batch cut into one batch per shard, and where each id came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitIds {
    /// Shard `s`'s ids, as its own ids, in the report's order.
    pub ids: Vec<Vec<u64>>,
    /// Their norms, in the same order.
    pub norms: Vec<Vec<f64>>,
    /// For each shard, the positions in the report of its ids.
    pub positions: Vec<Vec<usize>>,
}

/// Why a batch cannot be split (each shard would refuse its part, or the
/// parts could not be formed). The field it concerns is [`SplitRefusal::field`].
#[derive(Debug, Clone, PartialEq)]
pub enum SplitRefusal {
    /// `ids` and `norms` have different lengths.
    Lengths {
        /// Entries of `ids`.
        ids: usize,
        /// Entries of `norms`.
        norms: usize,
    },
    /// An id appears twice in one report.
    Twice {
        /// The id.
        id: u64,
        /// Its first position.
        first: usize,
        /// Its second position.
        second: usize,
    },
    /// An id outside `0..examples`.
    OutOfRange {
        /// The id.
        id: u64,
        /// The dataset's number of examples.
        examples: u64,
    },
}

impl SplitRefusal {
    /// The request field the refusal concerns.
    pub fn field(&self) -> &'static str {
        match self {
            SplitRefusal::Lengths { .. } => "norms",
            SplitRefusal::Twice { .. } | SplitRefusal::OutOfRange { .. } => "ids",
        }
    }
}

impl fmt::Display for SplitRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitRefusal::Lengths { ids, norms } => {
                write!(f, "has {norms} entries but ids has {ids}")
            }
            SplitRefusal::Twice { id, first, second } => write!(
                f,
                "id {id} appears twice in one report (ids[{first}] and ids[{second}])"
            ),
            SplitRefusal::OutOfRange { id, examples } => write!(
                f,
                "example id {id} is out of range (the dataset has {examples} examples)"
            ),
        }
    }
}

/// The shard holding `id`: the range containing it (`ranges` are contiguous
/// and sorted, from 0), or `None` past the last.
pub fn shard_of(ranges: &[Range<u64>], id: u64) -> Option<usize> {
    let s = ranges.partition_point(|r| r.end <= id);
    (s < ranges.len() && ranges[s].contains(&id)).then_some(s)
}

/// Cuts `ids` (with `norms`) by `ranges`; refuses ids and norms of different
/// lengths, an id twice and an id outside the ranges, before any shard sees
/// the step (a refusal by one shard after the others' acceptance would apply
/// the step in part). Norms are the ledger's to check (finite, `>= 0`): its
/// rule is applied by each caller before splitting, for the same reason.
pub fn split_ids(
    ranges: &[Range<u64>],
    ids: &[u64],
    norms: &[f64],
) -> Result<SplitIds, SplitRefusal> {
    if ids.len() != norms.len() {
        return Err(SplitRefusal::Lengths {
            ids: ids.len(),
            norms: norms.len(),
        });
    }
    let mut seen = std::collections::HashMap::with_capacity(ids.len());
    for (j, &id) in ids.iter().enumerate() {
        if let Some(first) = seen.insert(id, j) {
            return Err(SplitRefusal::Twice {
                id,
                first,
                second: j,
            });
        }
    }
    let k = ranges.len();
    let mut split = SplitIds {
        ids: vec![Vec::new(); k],
        norms: vec![Vec::new(); k],
        positions: vec![Vec::new(); k],
    };
    for (j, (&id, &norm)) in ids.iter().zip(norms).enumerate() {
        let Some(s) = shard_of(ranges, id) else {
            return Err(SplitRefusal::OutOfRange {
                id,
                examples: ranges.last().map_or(0, |r| r.end),
            });
        };
        split.ids[s].push(id - ranges[s].start);
        split.norms[s].push(norm);
        split.positions[s].push(j);
    }
    Ok(split)
}

/// The report's values from each shard's values for its own ids (in shard
/// order): value `j` of shard `s` back at position `positions[s][j]` (the
/// [`SplitIds::positions`] of the split). `None` when a shard answered another
/// number of values than it got ids.
pub fn place<T: Copy + Default, V: AsRef<[T]>>(
    positions: &[Vec<usize>],
    per_shard: &[V],
) -> Option<Vec<T>> {
    if per_shard.len() != positions.len() {
        return None;
    }
    let len = positions.iter().map(Vec::len).sum();
    let mut out = vec![T::default(); len];
    for (values, positions) in per_shard.iter().zip(positions) {
        let values = values.as_ref();
        if values.len() != positions.len() {
            return None;
        }
        for (&j, &v) in positions.iter().zip(values) {
            out[j] = v;
        }
    }
    Some(out)
}

/// Each shard's own ids (sorted) as the dataset's ids (sorted, as the ranges
/// are): a step's retirements.
pub fn dataset_ids<V: AsRef<[u64]>>(ranges: &[Range<u64>], per_shard: &[V]) -> Vec<u64> {
    per_shard
        .iter()
        .zip(ranges)
        .flat_map(|(own, r)| own.as_ref().iter().map(move |&i| i + r.start))
        .collect()
}

/// A shard's refusal `detail` of its part (its start `start`, its ids'
/// positions in the report `positions`, from [`SplitIds`]) with the shard's
/// own ids and positions put back as the dataset's and the report's: `id N`
/// becomes `id N + start`, `ids[j]` becomes `ids[positions[j]]` (the ledger's
/// messages name ids and positions so); the rest is kept as it is.
pub fn dataset_detail(start: u64, positions: &[usize], detail: &str) -> String {
    let digits = |t: &str| t.bytes().take_while(u8::is_ascii_digit).count();
    let mut out = String::with_capacity(detail.len() + 16);
    let mut rest = detail;
    while let Some(c) = rest.chars().next() {
        let boundary = out
            .chars()
            .last()
            .is_none_or(|c| !c.is_alphanumeric() && c != '_');
        if boundary && rest.starts_with("ids[") {
            let n = digits(&rest[4..]);
            let j = rest[4..4 + n].parse::<usize>().ok();
            if let (Some(p), true) = (
                j.and_then(|j| positions.get(j)),
                rest[4 + n..].starts_with(']'),
            ) {
                out.push_str(&format!("ids[{p}]"));
                rest = &rest[5 + n..];
                continue;
            }
        }
        if boundary && rest.starts_with("id ") {
            let n = digits(&rest[3..]);
            if let Ok(id) = rest[3..3 + n].parse::<u64>() {
                out.push_str(&format!("id {}", id.saturating_add(start)));
                rest = &rest[3 + n..];
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_datasets_ids_and_the_reports_positions() {
        // Shard 1 of [0..5, 5..10] holds 7, 9, 5 of [7, 1, 9, 5] as its ids
        // 2, 4, 0, at positions 0, 2, 3.
        let split = split_ids(&[0..5, 5..10], &[7, 1, 9, 5], &[1.0; 4]).unwrap();
        let detail = "id 4 is already in part 1 of this step; parts must be disjoint \
                      (ids[1] and ids[2]); grid 3, valid 0, ids[9], id x";
        assert_eq!(
            dataset_detail(5, &split.positions[1], detail),
            "id 9 is already in part 1 of this step; parts must be disjoint \
             (ids[2] and ids[3]); grid 3, valid 0, ids[9], id x"
        );
        assert_eq!(
            dataset_detail(0, &split.positions[0], "id 1: ids[0]"),
            "id 1: ids[1]"
        );
        assert_eq!(dataset_detail(5, &[], "é id 0 ids[0"), "é id 5 ids[0");
    }

    #[test]
    fn ids_go_to_their_range_as_own_ids_and_come_back_in_place() {
        let ranges = [0..3, 3..6, 6..10];
        let split = split_ids(&ranges, &[9, 0, 4, 7], &[0.5, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(split.ids, vec![vec![0], vec![1], vec![3, 1]]);
        assert_eq!(split.norms[2], vec![0.5, 3.0]);
        let back = place(&split.positions, &[vec![1.0], vec![2.0], vec![9.0, 7.0]]).unwrap();
        assert_eq!(back, vec![9.0, 1.0, 2.0, 7.0]);
        assert!(place(&split.positions, &[vec![1.0], vec![], vec![9.0, 7.0]]).is_none());
        assert_eq!(
            dataset_ids(&ranges, &[vec![], vec![1], vec![0, 3]]),
            vec![4, 6, 9]
        );
        assert_eq!(shard_of(&ranges, 10), None);
        assert_eq!(shard_of(&ranges, 3), Some(1));
        let empty = split_ids(&ranges, &[], &[]).unwrap();
        assert!(empty.ids.iter().all(Vec::is_empty) && empty.ids.len() == 3);
    }

    #[test]
    fn what_cannot_be_split_is_refused() {
        let ranges = [0..5, 5..10];
        let refused = |ids: &[u64], norms: &[f64]| split_ids(&ranges, ids, norms).unwrap_err();
        assert_eq!(refused(&[1], &[]).field(), "norms");
        assert_eq!(refused(&[10], &[1.0]).field(), "ids");
        assert_eq!(
            refused(&[9, 1, 9], &[0.5; 3]),
            SplitRefusal::Twice {
                id: 9,
                first: 0,
                second: 2
            }
        );
    }
}
