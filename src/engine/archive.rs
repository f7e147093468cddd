//! Owners of an archived, paged-out dataset are answered from the store,
//! one block read per query, without loading the ledger.
//!
//! Before an archived dataset leaves memory, every example's final answer
//! ingredients ([`ArchivedExample`]: RDP vector, flags, threshold, PLD-estimate
//! input) are written to the store in blocks of [`BLOCK`] examples
//! (MessagePack, a CRC-32 per block; `store::archive`), once: an archived
//! dataset never changes, so a later page-out (after a restart, say) finds the
//! archive complete at the dataset's last record and writes nothing. The few
//! kilobytes every answer shares ([`ArchiveSummary`]) stay in memory. A query
//! reads the example's block and answers through the same functions as the
//! live ledger, so the numbers are the same to the bit. A block that cannot be
//! read or does not match is logged and the query falls back to loading the
//! ledger; the log stays the truth.

use super::bounds::blocking;
use super::dataset::{Archive, Dataset};
use super::error::{EngineError, EngineResult};
use super::Engine;
use crate::accounting::Conversion;
use crate::ledger::bounds::combine_worst_case;
use crate::ledger::{ArchivedExample, EstimateInput, ExamplePrivacy, Ledger, WorstCaseBounds};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Examples per stored block: a query reads one block (about 140 KB at 64
/// orders when every example trained below the top threshold).
pub const BLOCK: u64 = 256;

/// Blocks written per store transaction.
const BLOCKS_PER_WRITE: u64 = 32;

/// One example's answer from the archive: its privacy (bounded by the PLD
/// worst case), the worst case, and its PLD-estimate input if asked for.
pub type ArchivedAnswer = (
    ExamplePrivacy,
    WorstCaseBounds,
    Option<Result<EstimateInput, String>>,
);

/// Block `b` of the ledger, encoded.
fn encode_block(ledger: &Ledger, b: u64) -> EngineResult<Vec<u8>> {
    let n = ledger.examples();
    let examples = (b * BLOCK..((b + 1) * BLOCK).min(n))
        .map(|i| ledger.archived_example(i))
        .collect::<Result<Vec<ArchivedExample>, _>>()?;
    rmp_serde::to_vec(&examples)
        .map_err(|e| EngineError::Internal(format!("cannot encode an archive block: {e}")))
}

impl Engine {
    /// Make sure archived dataset `ds` has a complete archive at its last
    /// record, writing it from the ledger (read lock, `O(n × #orders)`) if not,
    /// and keep its summary. Nothing for an active or paged-out dataset.
    pub(super) async fn ensure_archive(&self, ds: &Arc<Dataset>) -> EngineResult<()> {
        if !ds.is_archived() {
            return Ok(());
        }
        let seq = ds.last_seq.load(Ordering::Acquire);
        if ds.archive().is_some_and(|a| a.seq == seq) {
            return Ok(());
        }
        let ledger = ds.ledger.read().await;
        if ds.is_paged_out() || seq != ds.last_seq.load(Ordering::Acquire) {
            return Ok(());
        }
        let blocks = ledger.examples().div_ceil(BLOCK);
        let store = self.store.clone();
        let id = ds.id.clone();
        let existing = tokio::task::spawn_blocking(move || store.archive(&id))
            .await
            .map_err(|_| EngineError::Internal("archive task failed".into()))?
            .map_err(EngineError::store)?;
        if existing != Some((seq, blocks)) {
            let started = std::time::Instant::now();
            for first in (0..blocks).step_by(BLOCKS_PER_WRITE as usize) {
                let last = (first + BLOCKS_PER_WRITE).min(blocks);
                let encoded = blocking(|| {
                    (first..last)
                        .map(|b| Ok((b, encode_block(&ledger, b)?)))
                        .collect::<EngineResult<Vec<_>>>()
                })?;
                let (store, id) = (self.store.clone(), ds.id.clone());
                tokio::task::spawn_blocking(move || store.put_archive_blocks(&id, seq, &encoded))
                    .await
                    .map_err(|_| EngineError::Internal("archive task failed".into()))?
                    .map_err(EngineError::store)?;
            }
            let (store, id) = (self.store.clone(), ds.id.clone());
            tokio::task::spawn_blocking(move || store.complete_archive(&id, seq, blocks))
                .await
                .map_err(|_| EngineError::Internal("archive task failed".into()))?
                .map_err(EngineError::store)?;
            tracing::info!(
                dataset = ds.id,
                seq,
                blocks,
                seconds = started.elapsed().as_secs_f64(),
                "archive written"
            );
        }
        ds.set_archive(Archive {
            seq,
            summary: Arc::new(ledger.archive_summary()),
        });
        Ok(())
    }

    /// The archive of dataset `id` if it is out of memory and has one: its
    /// owners' queries are then answered from the store.
    pub fn archive_to_read(&self, id: &str) -> EngineResult<Option<Archive>> {
        let ds = self.dataset(id)?;
        Ok(ds.archive().filter(|_| ds.is_paged_out()))
    }

    /// Example `example`'s answer from `archive` at `delta` (validated by the
    /// caller), read from the store. `None` when the block cannot be used (the
    /// caller then loads the ledger): the failure is logged.
    pub async fn archived_example_privacy(
        &self,
        id: &str,
        archive: &Archive,
        example: u64,
        delta: f64,
        conversion: Conversion,
        estimate: bool,
    ) -> EngineResult<Option<ArchivedAnswer>> {
        let ds = self.dataset(id)?;
        archive.summary.check_id(example)?;
        let block = example / BLOCK;
        let (store, key) = (self.store.clone(), id.to_string());
        let read = tokio::task::spawn_blocking(move || store.read_archive_block(&key, block))
            .await
            .map_err(|_| EngineError::Internal("archive task failed".into()))?;
        let decoded = match read {
            Ok(Some((seq, bytes))) if seq == archive.seq => {
                rmp_serde::from_slice::<Vec<ArchivedExample>>(&bytes)
                    .map_err(|e| format!("block {block} does not decode: {e}"))
            }
            Ok(Some((seq, _))) => Err(format!(
                "block {block} describes record {seq}, not {}",
                archive.seq
            )),
            Ok(None) => Err(format!("block {block} is missing")),
            Err(e) => Err(e.to_string()),
        };
        let found = decoded.and_then(|examples| {
            examples
                .into_iter()
                .nth((example % BLOCK) as usize)
                .ok_or_else(|| format!("block {block} is short"))
        });
        let archived = match found {
            Ok(x) => x,
            Err(why) => {
                tracing::warn!(dataset = id, why, "archive unusable; loading the ledger");
                metrics::counter!("dpledger_archive_read_failures_total").increment(1);
                return Ok(None);
            }
        };
        let summary = &archive.summary;
        let rdp_worst = summary.worst_case(delta, conversion)?;
        let pld = ds.pld_worst_case_of(
            (summary.steps(), summary.releases()),
            || summary.pld_events(),
            delta,
        );
        let worst = combine_worst_case(rdp_worst, pld);
        let privacy = summary
            .privacy(example, &archived, delta, conversion)?
            .bounded_by(worst.pld.as_ref().map(|p| p.epsilon));
        let input = estimate.then(|| summary.estimate_input(&archived));
        metrics::counter!("dpledger_archive_queries_total").increment(1);
        Ok(Some((privacy, worst, input)))
    }
}
