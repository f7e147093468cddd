//! A release as the log keeps it: what viewers are served, plus the examples
//! it left out of its input (spec §6), which only a replay of the log needs.
//! Which examples were left out depends on their ledgers, so it is kept out
//! of every served answer.

use super::Release;
use serde::{Deserialize, Serialize};

/// The durable record of one release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseRecord {
    /// The release as served.
    #[serde(flatten)]
    pub release: Release,
    /// The examples left out of its input, as runs of consecutive ids
    /// (absent: none, as in records written before examples could be left out).
    #[serde(default, skip_serializing_if = "LeftOut::is_empty")]
    pub left_out: LeftOut,
}

/// Sorted example ids stored as half-open runs `[start, end)`: examples near
/// their budget often have neighbouring ids (a refresh block, a label), and a
/// run costs what one id does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeftOut(Vec<[u32; 2]>);

impl LeftOut {
    /// The runs of `ids` (sorted, distinct).
    pub fn from_ids(ids: &[u32]) -> Self {
        let mut runs: Vec<[u32; 2]> = Vec::new();
        for &id in ids {
            match runs.last_mut() {
                Some(run) if run[1] == id => run[1] = id + 1,
                _ => runs.push([id, id + 1]),
            }
        }
        Self(runs)
    }

    /// The ids, sorted; `Err` when the runs are not increasing and disjoint.
    pub fn ids(&self) -> Result<Vec<u32>, String> {
        let mut ids = Vec::new();
        let mut floor = 0u32;
        for (k, &[start, end]) in self.0.iter().enumerate() {
            if start >= end || (k > 0 && start < floor) {
                return Err(format!(
                    "left_out run {k} [{start}, {end}) is empty or overlaps the run before"
                ));
            }
            ids.extend(start..end);
            floor = end;
        }
        Ok(ids)
    }

    /// Whether no example was left out.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many examples were left out (the runs' lengths; a malformed run
    /// counts as none, as [`LeftOut::ids`] refuses it).
    pub fn count(&self) -> u64 {
        self.0
            .iter()
            .map(|&[start, end]| u64::from(end.saturating_sub(start)))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_round_trip_the_ids() {
        let ids = [0, 1, 2, 5, 7, 8];
        let runs = LeftOut::from_ids(&ids);
        assert_eq!(runs.0, vec![[0, 3], [5, 6], [7, 9]]);
        assert_eq!(runs.ids().unwrap(), ids);
        assert_eq!(runs.count(), ids.len() as u64);
        assert!(LeftOut::from_ids(&[]).is_empty());
    }

    #[test]
    fn overlapping_runs_are_refused() {
        assert!(LeftOut(vec![[0, 3], [2, 4]]).ids().is_err());
        assert!(LeftOut(vec![[3, 3]]).ids().is_err());
    }
}
