//! The coordinator's commit of a change across shards (`docs/sharding.md`,
//! "The change protocol", step 2): one record per shard in one PostgreSQL
//! transaction, each fenced by the epoch its owner prepared under, with the
//! decision `commit`; and the stored answer of a change made before under an
//! idempotency key. Only the coordinator (`coordinator.rs`) commits.

use super::protocol::{CrossCommit, ShardRecordKind};
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::Engine;
use crate::ledger::IdempotencyKey;
use crate::store::cluster as stored;
use crate::store::Record;

impl Engine {
    /// The coordinator's commit of change `id` across shards (module note,
    /// step 2): one record of `kind` for each of `shards` (name, epoch its
    /// owner prepared under, its payload: labels after creation give each
    /// shard its examples' part), the key stored under the sharded dataset's
    /// name. Only the coordinator (`engine::sharding`) commits.
    pub(in crate::engine) async fn commit_each_across(
        &self,
        id: &str,
        kind: ShardRecordKind,
        shards: Vec<(String, u64, Vec<u8>)>,
        key: Option<(String, IdempotencyKey)>,
    ) -> EngineResult<CrossCommit> {
        let node = self.node()?;
        let records = shards
            .into_iter()
            .map(|(dataset, epoch, payload)| {
                let record = Record {
                    dataset,
                    kind: kind.into(),
                    step: None,
                    part: None,
                    payload,
                };
                (record, epoch)
            })
            .collect();
        match node.changes.commit_across(id, records, key).await {
            Ok(c) => Ok(c.into()),
            // Unknown: decide it (abort unless the commit landed).
            // The commit's answer was lost but PostgreSQL decided it: the
            // coordinator still holds the answer, so the caller gets it.
            Err(e) => match node.changes.decide(id).await {
                Ok(stored::Decision::Committed) => {
                    tracing::warn!(change = %id, error = %e, "a commit across shards answered an error but was committed");
                    Ok(CrossCommit::Committed(Vec::new()))
                }
                Ok(stored::Decision::Aborted) => Err(EngineError::Unavailable(format!(
                    "the change across shards was not committed ({e}): retry"
                ))),
                // Neither the commit nor its decision answered: whether the
                // shards were charged is unknown (a retry with the same
                // Idempotency-Key is answered from the stored key).
                Err(decide) => Err(EngineError::Store(
                    crate::store::StoreError::OutcomeUnknown {
                        store: "postgres".into(),
                        detail: format!(
                            "the commit of a change across shards failed ({e}) and its decision \
                         could not be read ({decide})"
                        ),
                    },
                )),
            },
        }
    }

    /// A change stored under sharded dataset `dataset` with idempotency key
    /// `key`, if any (read from the store; the coordinator's, which keeps the
    /// store's type inside the engine).
    pub(in crate::engine) async fn sharded_key(
        &self,
        dataset: &str,
        key: &str,
    ) -> EngineResult<Option<crate::store::StoredKey>> {
        let (store, dataset, key) = (self.store.clone(), dataset.to_string(), key.to_string());
        tokio::task::spawn_blocking(move || store.find_key(&dataset, &key))
            .await
            .map_err(|_| EngineError::Internal("reading a key stopped".into()))?
            .map_err(EngineError::store)
    }
}
