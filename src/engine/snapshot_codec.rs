//! A served dataset as snapshot bytes and back: the ledger's image
//! (`Ledger::write_snapshot`) framed with what the engine keeps beside it (the
//! sequence number it reflects, the archived flag, and the records the release
//! book was built from, kept as stored so that loading parses them exactly as a
//! replay of the log would).
//!
//! Layout: `DPLD`, format (u32 LE), header length (u64 LE), header
//! (MessagePack), the book records' payloads back to back, the ledger image.

use crate::ledger::Ledger;
use crate::store::RecordKind;
use serde::{Deserialize, Serialize};
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

/// The dataset `bytes` describe, or why they cannot be used.
pub(super) fn decode(bytes: &[u8]) -> Result<DatasetImage, String> {
    if bytes.len() < 16 || &bytes[..4] != MAGIC {
        return Err("not a dataset snapshot".into());
    }
    let format = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if format != FORMAT {
        return Err(format!(
            "snapshot format {format}, this build reads {FORMAT}"
        ));
    }
    let head_len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let mut at = usize::try_from(head_len)
        .ok()
        .and_then(|l| l.checked_add(16))
        .filter(|&end| end <= bytes.len())
        .ok_or("snapshot header runs past the end")?;
    let header: Header =
        rmp_serde::from_slice(&bytes[16..at]).map_err(|e| format!("snapshot header: {e}"))?;
    let mut book = Vec::with_capacity(header.book.len());
    for (code, len) in header.book {
        let kind = RecordKind::from_code(code).ok_or(format!("unknown record kind {code}"))?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| at.checked_add(l))
            .filter(|&end| end <= bytes.len())
            .ok_or("a book record runs past the end")?;
        book.push((kind, Arc::from(&bytes[at..end])));
        at = end;
    }
    let ledger = Ledger::from_snapshot(&bytes[at..]).map_err(|e| e.to_string())?;
    Ok(DatasetImage {
        dataset: header.dataset,
        seq: header.seq,
        archived: header.archived,
        book,
        ledger,
    })
}
