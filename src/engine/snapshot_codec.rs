//! A served dataset as snapshot bytes and back: the ledger's image
//! (`Ledger::write_snapshot`) framed with what the engine keeps beside it (the
//! sequence number it reflects, the archived flag, and the records the release
//! book was built from, kept as stored so that loading parses them exactly as a
//! replay of the log would).
//!
//! Layout: `DPLD`, format (u32 LE), header length (u64 LE), header
//! (MessagePack), the book records' payloads back to back, the ledger image.

use crate::ledger::{read_bytes, Ledger};
use crate::store::RecordKind;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"DPLD";
/// Version of this framing; another version is refused (the log is used instead).
const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Header {
    dataset: String,
    seq: u64,
    archived: bool,
    /// Kind code and payload length of each book record, in log order.
    book: Vec<(u8, u64)>,
}

/// A dataset as a snapshot holds it.
pub(super) struct DatasetImage {
    pub dataset: String,
    pub seq: u64,
    pub archived: bool,
    pub book: Vec<(RecordKind, Arc<[u8]>)>,
    pub ledger: Ledger,
}

/// Frame `ledger` and the engine's state of dataset `dataset` at record `seq`.
pub(super) fn encode(
    dataset: &str,
    seq: u64,
    archived: bool,
    book: &[(RecordKind, Arc<[u8]>)],
    ledger: &Ledger,
) -> Vec<u8> {
    let header = Header {
        dataset: dataset.to_string(),
        seq,
        archived,
        book: book
            .iter()
            .map(|(k, p)| (k.code(), p.len() as u64))
            .collect(),
    };
    let head = rmp_serde::to_vec_named(&header).expect("snapshot header serializes");
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&(head.len() as u64).to_le_bytes());
    out.extend_from_slice(&head);
    for (_, payload) in book {
        out.extend_from_slice(payload);
    }
    ledger.write_snapshot(&mut out);
    out
}

/// The dataset a reader of exactly `len` bytes describes (read while the store
/// still reads and verifies them: see `snapshots.rs`). Nothing allocated is
/// larger than `len`.
pub(super) fn read(reader: &mut dyn Read, len: u64) -> Result<DatasetImage, String> {
    let mut prefix = [0u8; 16];
    reader
        .read_exact(&mut prefix)
        .map_err(|_| "not a dataset snapshot")?;
    if &prefix[..4] != MAGIC {
        return Err("not a dataset snapshot".into());
    }
    let format = u32::from_le_bytes(prefix[4..8].try_into().expect("4 bytes"));
    if format != FORMAT {
        return Err(format!(
            "snapshot format {format}, this build reads {FORMAT}"
        ));
    }
    let head_len = u64::from_le_bytes(prefix[8..16].try_into().expect("8 bytes"));
    let mut left = len
        .checked_sub(16)
        .filter(|&rest| rest >= head_len)
        .ok_or("snapshot header runs past the end")?
        - head_len;
    let head = read_bytes(reader, head_len).ok_or("snapshot header runs past the end")?;
    let header: Header =
        rmp_serde::from_slice(&head).map_err(|e| format!("snapshot header: {e}"))?;
    let mut book = Vec::with_capacity(header.book.len().min(1 << 16));
    for (code, record_len) in header.book {
        let kind = RecordKind::from_code(code).ok_or(format!("unknown record kind {code}"))?;
        left = left
            .checked_sub(record_len)
            .ok_or("a book record runs past the end")?;
        let payload = read_bytes(reader, record_len).ok_or("a book record runs past the end")?;
        book.push((kind, Arc::from(payload)));
    }
    let ledger = Ledger::read_snapshot(reader, left).map_err(|e| e.to_string())?;
    Ok(DatasetImage {
        dataset: header.dataset,
        seq: header.seq,
        archived: header.archived,
        book,
        ledger,
    })
}
