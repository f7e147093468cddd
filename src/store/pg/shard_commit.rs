//! One change written to several shards' logs in one PostgreSQL transaction
//! (a sharded dataset's release or release budget), with a decision
//! row that makes its outcome single: the transaction inserts `(id, 'commit')`
//! into `dpledger_decisions` first, then one record per shard, each fenced by
//! that shard's epoch by the `dpledger_fence` trigger. A shard owner that must
//! know the outcome without the coordinator ([`ClusterDb::decide`]) inserts
//! `(id, 'abort')` unless a row exists: the primary key makes the two inserts
//! conflict, so PostgreSQL lets exactly one of them land (an insert meeting the
//! other's uncommitted row waits for its transaction to end). The table
//! `dpledger_decisions(id, outcome, created)` is created with the cluster
//! tables (`cluster.rs`); decided rows are pruned after
//! [`DECISIONS_KEPT`] ([`ClusterDb::prune_decisions`]). The cluster's node
//! secret (`dpledger_node_secret`, the key of the node mark that the
//! protocol's node-to-node calls carry) is read here too. See
//! `docs/sharding.md`, "The change protocol", and `docs/cluster.md`,
//! "Node-to-node authentication".

use super::cluster::{ClusterDb, FENCED_SQLSTATE};
use crate::store::{record_checksum, IdempotencyKey, Record, StoreError};
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// How long a decided change's row is kept: far longer than anything that
/// can still ask for its decision. An owner holds a prepared change at most
/// 5 s plus 1 s per 10^6 examples of its shard (72 minutes for the largest
/// ledger there is, 2^32 examples) and then decides it, retrying
/// PostgreSQL until it answers or the shard is lost; a coordinator decides
/// right after its commit; a node mark (which any replayed prepare or decide
/// needs) is stale after 60 s. A day is 20 times the longest of them: a row
/// pruned after it can never be asked for again, except by a process frozen
/// for a day, whose lease and epoch are long gone (its writes are fenced).
/// A coordinator frozen between prepare and commit cannot commit a change
/// whose `abort` row was pruned: a commit is refused in its transaction once
/// the change is older than [`CHANGE_COMMITS_WITHIN`] (half a day).
pub const DECISIONS_KEPT: Duration = Duration::from_secs(24 * 3600);
/// How old a change may be when it commits: half of [`DECISIONS_KEPT`]. A
/// change's id carries the time it was made ([`new_change_id`]); a commit of
/// an older one is refused in its transaction (as decided), so a coordinator
/// frozen between its prepare and its commit can never commit a change whose
/// `abort` row was pruned meanwhile.
pub const CHANGE_COMMITS_WITHIN: Duration = Duration::from_secs(12 * 3600);
/// Hex digits of a change id's time (milliseconds since 1970, 48 bits).
const ID_TIME_DIGITS: usize = 12;

/// A fresh change id: the time in milliseconds (12 hex digits) then 80
/// random bits (20 hex digits), so that a commit can tell its age.
pub fn new_change_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let random = rand::random::<u128>() & ((1u128 << 80) - 1);
    format!("{:012x}{random:020x}", ms & ((1u64 << 48) - 1))
}

/// The time a change id was made ([`new_change_id`]), if it carries one.
fn change_time_ms(id: &str) -> Option<i64> {
    let digits = id.get(..ID_TIME_DIGITS)?;
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    i64::from_str_radix(digits, 16).ok()
}

/// Bytes of the cluster's node secret.
const SECRET_BYTES: usize = 32;

/// What [`ClusterDb::commit_across`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrossCommit {
    /// Every record is in the log: their sequence numbers, in order (empty
    /// when the commit was known only from its decision row).
    Committed(Vec<u64>),
    /// Nothing was written: a shard's epoch is no longer its lease's (named).
    Fenced(String),
    /// Nothing was written: the change was already decided (an owner aborted
    /// it when its wait ran out).
    Decided,
    /// Nothing was written: the idempotency key is stored already.
    KeyUsed,
}

/// A change's decision as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Its records are in the logs.
    Committed,
    /// None of its records is, nor ever will be.
    Aborted,
}

impl ClusterDb {
    /// Appends `records` (each with the epoch of its shard's owner) in one
    /// transaction decided as `id`, with the idempotency `key` of the change
    /// stored under `key_dataset`. An error other than the refusals of
    /// [`CrossCommit`] leaves the outcome unknown: ask [`ClusterDb::decide`].
    pub async fn commit_across(
        &self,
        id: &str,
        records: Vec<(Record, u64)>,
        key: Option<(String, IdempotencyKey)>,
    ) -> Result<CrossCommit, StoreError> {
        let id = id.to_string();
        self.with_client("cannot commit a change across shards", move |c| {
            Box::pin(async move {
                let tx = c.transaction().await?;
                let refused = |e: &tokio_postgres::Error| -> Option<CrossCommit> {
                    let db = e.as_db_error()?;
                    if db.code().code() == FENCED_SQLSTATE {
                        return Some(CrossCommit::Fenced(db.message().to_string()));
                    }
                    if *db.code() == SqlState::UNIQUE_VIOLATION {
                        return match db.constraint() {
                            Some("dpledger_decisions_pkey") => Some(CrossCommit::Decided),
                            Some("dpledger_idempotency_pkey") => Some(CrossCommit::KeyUsed),
                            _ => None,
                        };
                    }
                    None
                };
                // Too old to commit (or not made by `new_change_id`): its
                // owners decided it long ago, and an `abort` row may be gone.
                let now_ms: i64 = tx
                    .query_one(
                        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                        &[],
                    )
                    .await?
                    .try_get(0)?;
                let fresh = change_time_ms(&id).is_some_and(|made| {
                    now_ms.saturating_sub(made) < CHANGE_COMMITS_WITHIN.as_millis() as i64
                });
                if !fresh {
                    return Ok(CrossCommit::Decided);
                }
                if let Err(e) = tx
                    .execute(
                        "INSERT INTO dpledger_decisions (id, outcome) VALUES ($1, 'commit')",
                        &[&id],
                    )
                    .await
                {
                    return refused(&e).ok_or(e);
                }
                let last: i64 = tx
                    .query_one(
                        "SELECT value FROM dpledger_meta WHERE key = 'last_seq' FOR UPDATE",
                        &[],
                    )
                    .await?
                    .try_get(0)?;
                let mut seqs = Vec::with_capacity(records.len());
                for (i, (record, epoch)) in records.iter().enumerate() {
                    let seq = last + 1 + i as i64;
                    let crc = i64::from(record_checksum(record));
                    let kind = i16::from(record.kind.code());
                    let step = record.step.map(|s| s as i64);
                    let part = record.part.map(i64::from);
                    if let Err(e) = tx
                        .execute(
                            "INSERT INTO dpledger_events \
                             (seq, dataset, kind, step, part, payload, crc, epoch) \
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                            &[
                                &seq,
                                &record.dataset,
                                &kind,
                                &step,
                                &part,
                                &record.payload,
                                &crc,
                                &(*epoch as i64),
                            ],
                        )
                        .await
                    {
                        return refused(&e).ok_or(e);
                    }
                    seqs.push(seq as u64);
                }
                tx.execute(
                    "UPDATE dpledger_meta SET value = $1 WHERE key = 'last_seq'",
                    &[&(last + records.len() as i64)],
                )
                .await?;
                if let Some((dataset, k)) = &key {
                    if let Err(e) = tx
                        .execute(
                            "INSERT INTO dpledger_idempotency (dataset, key, seq, request, answer) \
                             VALUES ($1, $2, $3, $4, $5)",
                            &[&dataset, &k.key, &(last + 1), &k.request, &k.answer],
                        )
                        .await
                    {
                        return refused(&e).ok_or(e);
                    }
                }
                tx.commit().await?;
                Ok(CrossCommit::Committed(seqs))
            })
        })
        .await
    }

    /// The outcome of change `id`, deciding it aborted when nothing decided it
    /// yet (an insert that waits for a commit in flight, then loses to it).
    pub async fn decide(&self, id: &str) -> Result<Decision, StoreError> {
        let id = id.to_string();
        self.with_client("cannot decide a change across shards", move |c| {
            Box::pin(async move {
                c.execute(
                    "INSERT INTO dpledger_decisions (id, outcome) VALUES ($1, 'abort') \
                     ON CONFLICT (id) DO NOTHING",
                    &[&id],
                )
                .await?;
                let outcome: String = c
                    .query_one(
                        "SELECT outcome FROM dpledger_decisions WHERE id = $1",
                        &[&id],
                    )
                    .await?
                    .try_get(0)?;
                Ok(if outcome == "commit" {
                    Decision::Committed
                } else {
                    Decision::Aborted
                })
            })
        })
        .await
    }

    /// Deletes decided changes older than `kept` (at most `batch` rows per
    /// call, so that one call stays short); the number deleted.
    pub async fn prune_decisions(&self, kept: Duration, batch: i64) -> Result<u64, StoreError> {
        let secs = kept.as_secs_f64();
        self.with_client("cannot prune dpledger_decisions", move |c| {
            Box::pin(async move {
                c.execute(
                    "DELETE FROM dpledger_decisions WHERE id IN (SELECT id FROM \
                     dpledger_decisions WHERE created < now() - make_interval(secs => $1) \
                     ORDER BY created LIMIT $2)",
                    &[&secs, &batch],
                )
                .await
            })
        })
        .await
    }

    /// The cluster's node secret: made here (`fresh`, random) by the first
    /// node to ask, the stored one for every other (`INSERT ... ON CONFLICT
    /// DO NOTHING`, then read). Never logged.
    pub async fn node_secret(&self, fresh: [u8; SECRET_BYTES]) -> Result<Vec<u8>, StoreError> {
        self.with_client("cannot read the node secret", move |c| {
            Box::pin(async move {
                let fresh = fresh.to_vec();
                c.execute(
                    "INSERT INTO dpledger_node_secret (id, secret) VALUES (1, $1) \
                     ON CONFLICT (id) DO NOTHING",
                    &[&fresh],
                )
                .await?;
                c.query_one("SELECT secret FROM dpledger_node_secret WHERE id = 1", &[])
                    .await?
                    .try_get(0)
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_id_carries_its_time() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let id = new_change_id();
        assert_eq!(id.len(), 32);
        let made = change_time_ms(&id).unwrap();
        assert!((made - before).abs() < 60_000, "{made} vs {before}");
        assert_ne!(new_change_id()[12..], id[12..]);
        assert_eq!(change_time_ms("abc123"), None);
        assert_eq!(change_time_ms(&"z".repeat(32)), None);
    }
}
