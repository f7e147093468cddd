//! The SQL of sharded datasets (`docs/sharding.md`): the layout of a
//! sharded dataset (its number of examples, of shards, and the creation's
//! canonical specification) is one row of `dpledger_shards`, written once
//! when the dataset is created and never changed; its shards are ordinary
//! datasets with their own leases.

use super::cluster::{ClusterDb, NAME_LOCK_SQL};
use crate::store::StoreError;

/// A sharded dataset's layout as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutRow {
    /// The dataset (the name clients use).
    pub dataset: String,
    /// Its number of examples.
    pub examples: u64,
    /// Its number of shards.
    pub shards: u32,
    /// The creation's canonical specification (configuration, labels), so
    /// that a retried creation can be told from a different one.
    pub spec: String,
}

/// What recording a layout found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutClaim {
    /// Recorded now, or already recorded with the same layout (a retry).
    Recorded,
    /// The name is taken: by an unsharded dataset, or by another layout.
    Taken,
}

impl ClusterDb {
    /// Records `layout` unless its name is taken (see [`LayoutClaim`]).
    pub async fn claim_layout(&self, layout: &LayoutRow) -> Result<LayoutClaim, StoreError> {
        let row = layout.clone();
        self.with_client("cannot record a shard layout", move |c| {
            Box::pin(async move {
                let tx = c.transaction().await?;
                tx.execute(NAME_LOCK_SQL, &[&row.dataset]).await?;
                let plain = tx
                    .query_opt(
                        "SELECT 1 FROM dpledger_leases WHERE dataset = $1",
                        &[&row.dataset],
                    )
                    .await?;
                if plain.is_some() {
                    return Ok(LayoutClaim::Taken);
                }
                let inserted = tx
                    .query_opt(
                        "INSERT INTO dpledger_shards (dataset, examples, shards, spec) \
                         VALUES ($1, $2, $3, $4) ON CONFLICT (dataset) DO NOTHING RETURNING 1",
                        &[
                            &row.dataset,
                            &(row.examples as i64),
                            &(row.shards as i32),
                            &row.spec,
                        ],
                    )
                    .await?;
                let claim = if inserted.is_some() {
                    LayoutClaim::Recorded
                } else {
                    let existing = tx
                        .query_one(
                            "SELECT examples, shards, spec FROM dpledger_shards WHERE dataset = $1",
                            &[&row.dataset],
                        )
                        .await?;
                    let same = existing.try_get::<_, i64>(0)? == row.examples as i64
                        && existing.try_get::<_, i32>(1)? == row.shards as i32
                        && existing.try_get::<_, String>(2)? == row.spec;
                    if same {
                        LayoutClaim::Recorded
                    } else {
                        LayoutClaim::Taken
                    }
                };
                tx.commit().await?;
                Ok(claim)
            })
        })
        .await
    }

    /// The layout of `dataset`, if it is a sharded dataset.
    pub async fn layout(&self, dataset: &str) -> Result<Option<LayoutRow>, StoreError> {
        let dataset = dataset.to_string();
        self.with_client("cannot read a shard layout", move |c| {
            Box::pin(async move {
                let row = c
                    .query_opt(
                        "SELECT examples, shards, spec FROM dpledger_shards WHERE dataset = $1",
                        &[&dataset],
                    )
                    .await?;
                row.map(|r| {
                    Ok(LayoutRow {
                        dataset: dataset.clone(),
                        examples: r.try_get::<_, i64>(0)? as u64,
                        shards: r.try_get::<_, i32>(1)? as u32,
                        spec: r.try_get(2)?,
                    })
                })
                .transpose()
            })
        })
        .await
    }
}
