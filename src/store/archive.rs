//! Archived datasets' per-example answers, shared by both
//! backends. An archived dataset never changes, so once it is paged out its
//! owners' queries are answered from blocks of per-example data written when it
//! left memory, one block read per query, instead of loading the whole ledger.
//!
//! | table | what |
//! |---|---|
//! | `dpledger_archive_blocks` | `(dataset, block)`: the block's bytes (engine's encoding), the record `seq` it describes, a CRC-32 |
//! | `dpledger_archives` | per dataset: the `seq` and number of blocks of its complete archive |
//!
//! Blocks are written first, then one transaction marks the archive complete
//! and deletes blocks of any other `seq`: a crash in between leaves no archive
//! listed, and the blocks are rewritten at the next page-out. The log stays the
//! truth: a block that fails its CRC is an error the engine answers by loading
//! the ledger instead.

use super::StoreError;

/// `v` as a database integer (saturating).
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A block read back, checked against its stored CRC-32.
pub(crate) fn check_block(
    store: &str,
    dataset: &str,
    block: u64,
    seq: u64,
    crc: i64,
    data: Vec<u8>,
) -> Result<(u64, Vec<u8>), StoreError> {
    if i64::from(crc32fast::hash(&data)) != crc {
        return Err(StoreError::Corrupt {
            store: store.to_string(),
            seq: Some(seq),
            detail: format!("archive block {block} of dataset {dataset:?} fails its CRC-32"),
        });
    }
    Ok((seq, data))
}
