//! `dpledger compact`: an operator's request to drop the payloads of log
//! records that a snapshot stands in for. The snapshot used is the
//! dataset's newest one that reads back, verifies *and* decodes into a ledger,
//! checked before anything is removed; it is then pinned (never pruned). What
//! an audit needs stays: that snapshot, every record after it, and every
//! compacted row with its sequence number and CRC-32 (plus a SHA-256 over
//! them in `dpledger_compactions`). See `store::snapshots`.

use super::snapshots::load_newest;
use crate::store::{CompactionInfo, SnapshotInfo, Store};

/// What a compaction did to one dataset.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompactOutcome {
    /// The dataset.
    pub dataset: String,
    /// The compaction record after this run (`None`: nothing to do, see `note`).
    pub compaction: Option<CompactionInfo>,
    /// Why nothing was done, when nothing was.
    pub note: Option<String>,
}

/// Compact `dataset` (or every dataset) of `store` up to its newest verified
/// snapshot. Safe while a server runs on the store: only records already
/// covered by a snapshot change, and the server never reads them again.
pub fn compact_store(
    store: &dyn Store,
    dataset: Option<&str>,
) -> anyhow::Result<Vec<CompactOutcome>> {
    let catalogue = store.snapshots()?;
    let previous = store.compactions()?;
    let mut ids: Vec<String> = store
        .dataset_starts()?
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| dataset.is_none_or(|d| d == id))
        .collect();
    if let Some(d) = dataset {
        if ids.is_empty() {
            anyhow::bail!("no dataset {d:?} in {}", store.describe());
        }
    }
    ids.dedup();
    let mut outcomes = Vec::new();
    for id in ids {
        let candidates: Vec<&SnapshotInfo> = catalogue.iter().filter(|s| s.dataset == id).collect();
        let done = previous
            .iter()
            .find(|c| c.dataset == id)
            .map_or(0, |c| c.upto);
        let (compaction, note) = match load_newest(store, &candidates) {
            None => (
                None,
                Some("no snapshot verifies: nothing compacted".to_string()),
            ),
            Some((info, _)) if info.seq <= done => {
                (None, Some(format!("already compacted up to seq {done}")))
            }
            Some((info, _)) => (Some(store.compact(&info)?), None),
        };
        outcomes.push(CompactOutcome {
            dataset: id,
            compaction,
            note,
        });
    }
    Ok(outcomes)
}
