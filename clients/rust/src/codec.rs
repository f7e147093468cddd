//! The compact binary encoding of a step report (`DPLS`, version 1), the body of
//! `POST /v1/datasets/{d}/steps` with `Content-Type: application/octet-stream`.
//!
//! A 4096-example step is about 64 KiB instead of ~150 KiB of JSON, and the server
//! stores exactly these bytes. The layout (little-endian) is documented byte by
//! byte in the server's `src/ledger/wire.rs`:
//!
//! `DPLS`, version `1`, flags (bit 0 part, bit 1 noise multiplier, bit 2 sampling
//! rate, bit 3 delta-encoded ids), `step` u64, [part index u32, count u32],
//! [noise multiplier f64], [sampling rate f64], `n_ids` u64, `n_norms` u64, ids
//! (u64 each, or LEB128 varints of the first id and the positive gaps when the ids
//! are strictly increasing), norms (f64 bits), CRC-32 of everything before it.
//!
//! Norms travel bit for bit, so a binary report and the same report in JSON are the
//! same report to the ledger (a retry in either encoding is recognised).

use crate::types::StepReport;

/// The media type of the binary encoding.
pub const CONTENT_TYPE: &str = "application/octet-stream";

const MAGIC: [u8; 4] = *b"DPLS";
const VERSION: u8 = 1;
const FLAG_PART: u8 = 1 << 0;
const FLAG_NOISE: u8 = 1 << 1;
const FLAG_RATE: u8 = 1 << 2;
const FLAG_DELTA_IDS: u8 = 1 << 3;

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn write_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes the delta encoding of `ids` needs, or `None` when the ids are not
/// strictly increasing (the encoding never reorders ids).
fn delta_len(ids: &[u64]) -> Option<usize> {
    let mut total = 0usize;
    let mut previous = None;
    for &id in ids {
        let value = match previous {
            None => id,
            Some(p) if id > p => id - p,
            Some(_) => return None,
        };
        total += varint_len(value);
        previous = Some(id);
    }
    Some(total)
}

/// Encode a step report. Deterministic; ids are delta-encoded when they are
/// strictly increasing and that is smaller (sorted Poisson batches usually are).
/// Nothing is validated here: the server refuses bad values with a problem naming
/// the field, exactly as for JSON.
pub fn encode_step(report: &StepReport) -> Vec<u8> {
    let raw_len = report.ids.len() * 8;
    let use_delta = matches!(delta_len(&report.ids), Some(len) if len < raw_len);
    let mut out = Vec::with_capacity(48 + raw_len + report.norms.len() * 8);
    let mut flags = 0u8;
    if report.part.is_some() {
        flags |= FLAG_PART;
    }
    if report.noise_multiplier.is_some() {
        flags |= FLAG_NOISE;
    }
    if report.sampling_rate.is_some() {
        flags |= FLAG_RATE;
    }
    if use_delta {
        flags |= FLAG_DELTA_IDS;
    }
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(flags);
    out.extend_from_slice(&report.step.to_le_bytes());
    if let Some(part) = report.part {
        out.extend_from_slice(&part.index.to_le_bytes());
        out.extend_from_slice(&part.count.to_le_bytes());
    }
    if let Some(sigma) = report.noise_multiplier {
        out.extend_from_slice(&sigma.to_bits().to_le_bytes());
    }
    if let Some(rate) = report.sampling_rate {
        out.extend_from_slice(&rate.to_bits().to_le_bytes());
    }
    out.extend_from_slice(&(report.ids.len() as u64).to_le_bytes());
    out.extend_from_slice(&(report.norms.len() as u64).to_le_bytes());
    if use_delta {
        let mut previous = 0u64;
        for (i, &id) in report.ids.iter().enumerate() {
            write_varint(&mut out, if i == 0 { id } else { id - previous });
            previous = id;
        }
    } else {
        for id in &report.ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    for norm in &report.norms {
        out.extend_from_slice(&norm.to_bits().to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Part;

    #[test]
    fn raw_ids_layout_byte_by_byte() {
        // Not increasing: raw u64 ids.
        let report = StepReport::new(7, vec![5, 3], vec![0.5, -0.0]);
        let bytes = encode_step(&report);
        let mut want = b"DPLS".to_vec();
        want.push(1);
        want.push(0);
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(&2u64.to_le_bytes());
        want.extend_from_slice(&2u64.to_le_bytes());
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(&0.5f64.to_bits().to_le_bytes());
        want.extend_from_slice(&(-0.0f64).to_bits().to_le_bytes());
        let crc = crc32fast::hash(&want);
        want.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(bytes, want);
    }

    #[test]
    fn delta_ids_and_optional_fields() {
        let report = StepReport {
            step: 1,
            ids: vec![3, 200, 201],
            norms: vec![1.0, 2.0, 3.0],
            noise_multiplier: Some(1.5),
            sampling_rate: Some(0.25),
            part: Some(Part { index: 1, count: 2 }),
        };
        let bytes = encode_step(&report);
        assert_eq!(&bytes[..4], b"DPLS");
        assert_eq!(
            bytes[5],
            FLAG_PART | FLAG_NOISE | FLAG_RATE | FLAG_DELTA_IDS
        );
        let mut at = 14;
        assert_eq!(bytes[at..at + 4], 1u32.to_le_bytes());
        assert_eq!(bytes[at + 4..at + 8], 2u32.to_le_bytes());
        at += 8;
        assert_eq!(bytes[at..at + 8], 1.5f64.to_bits().to_le_bytes());
        at += 8;
        assert_eq!(bytes[at..at + 8], 0.25f64.to_bits().to_le_bytes());
        at += 8;
        assert_eq!(bytes[at..at + 8], 3u64.to_le_bytes());
        assert_eq!(bytes[at + 8..at + 16], 3u64.to_le_bytes());
        at += 16;
        // 3, then gap 197 (two varint bytes: 0xc5 0x01), then gap 1.
        assert_eq!(bytes[at..at + 4], [3, 0xc5, 0x01, 1]);
        at += 4;
        assert_eq!(bytes.len(), at + 3 * 8 + 4);
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        assert_eq!(crc, crc32fast::hash(body).to_le_bytes());
    }

    #[test]
    fn varints_match_leb128() {
        for (v, want) in [
            (0u64, vec![0u8]),
            (127, vec![0x7f]),
            (128, vec![0x80, 0x01]),
            (u64::MAX, {
                let mut w = vec![0xff; 9];
                w.push(0x01);
                w
            }),
        ] {
            let mut out = Vec::new();
            write_varint(&mut out, v);
            assert_eq!(out, want, "{v}");
            assert_eq!(varint_len(v), want.len());
        }
        assert_eq!(delta_len(&[1, 1]), None);
        assert_eq!(delta_len(&[2, 1]), None);
        assert_eq!(delta_len(&[]), Some(0));
    }
}
