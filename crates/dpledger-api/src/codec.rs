//! Compact binary encoding of one step report (or one part of it): format `DPLS`,
//! version 1.
//!
//! The same bytes are the binary body of the step endpoint (`POST
//! /v1/datasets/{d}/steps` with `Content-Type: application/octet-stream`, which
//! the Rust client sends with [`encode_step`]) and, on the server, the payload of
//! the `StepPart` records in its store (the server reuses this module as
//! `ledger::wire` and `store::codec`), so the format is fixed, versioned and
//! documented here byte by byte, once for both sides. A step of 4096 examples is
//! about 64 KiB in raw form instead of ~150 KiB of JSON, and decoding it is a bounds-
//! checked copy.
//!
//! # Layout (all integers little-endian)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic, the ASCII bytes `DPLS` |
//! | 4 | 1 | version, `1` |
//! | 5 | 1 | flags: bit 0 part present, bit 1 noise multiplier present, bit 2 sampling rate present, bit 3 ids delta-encoded; bits 4–7 must be 0 |
//! | 6 | 8 | `step`, u64 |
//! | … | 4 + 4 | if bit 0: part `index`, u32, then part `count`, u32 |
//! | … | 8 | if bit 1: `noise_multiplier`, f64 (IEEE 754 bits) |
//! | … | 8 | if bit 2: `sampling_rate`, f64 (IEEE 754 bits) |
//! | … | 8 | `n_ids`, u64: number of ids |
//! | … | 8 | `n_norms`, u64: number of norms |
//! | … | | ids: if bit 3 is clear, `n_ids` × u64; if set, see below |
//! | … | 8 × `n_norms` | norms, f64 (IEEE 754 bits, copied bit for bit: NaN payloads and `-0.0` survive) |
//! | end − 4 | 4 | CRC-32 (IEEE 802.3, as `crc32fast`/zlib compute it) of every preceding byte |
//!
//! Optional fields appear in the order of their flag bits, only when the bit is set.
//! Nothing may follow the CRC.
//!
//! **Two counts.** The ledger requires `ids` and `norms` to have the same length;
//! the format carries both counts so that [`StepPayload::encode`] never has to drop
//! or invent data: a mismatch is transported faithfully and refused by the ledger
//! with a message naming both lengths.
//!
//! **Delta-encoded ids (bit 3).** Allowed only when the ids are strictly increasing:
//! the first id as an unsigned LEB128 varint, then `n_ids − 1` gaps
//! `ids[i] − ids[i−1] >= 1`, each an unsigned LEB128 varint (7 bits per byte, low
//! groups first, high bit = "more bytes follow"; at most 10 bytes, no superfluous
//! trailing zero groups). No zig-zag is needed because gaps are positive. Poisson
//! batches from a large dataset have gaps around `n / batch`, so sorted ids cost 2–3
//! bytes instead of 8. [`StepPayload::encode`] uses it automatically when the ids
//! are strictly increasing and it is smaller; writers that do not want to implement
//! varints (a Python client: `numpy.asarray(ids, '<u8').tobytes()`) always send
//! bit 3 clear. The order of ids is never changed by the encoding.
//!
//! # Decoding is defensive
//!
//! [`StepPayload::decode`] rejects a wrong magic, an unknown version or flag bit, a
//! truncated buffer, a count that the remaining bytes cannot hold (checked before
//! anything is allocated, so a forged `n` of 2^60 costs nothing), malformed or
//! overflowing varints, non-increasing delta ids, trailing bytes and a CRC mismatch.
//! It never panics. It does not judge the values (finite norms, part index below
//! count, ...): that is the ledger's validation.

use std::fmt;

use crate::step::StepReport;

/// The media type of the binary encoding (the step endpoint's
/// `Content-Type`), so that a sender and the server name it alike.
pub const CONTENT_TYPE: &str = "application/octet-stream";

/// The four magic bytes that open every encoded step payload.
pub const MAGIC: [u8; 4] = *b"DPLS";
/// The format version this build writes and reads.
pub const VERSION: u8 = 1;

const FLAG_PART: u8 = 1 << 0;
const FLAG_NOISE: u8 = 1 << 1;
const FLAG_RATE: u8 = 1 << 2;
const FLAG_DELTA_IDS: u8 = 1 << 3;
const KNOWN_FLAGS: u8 = FLAG_PART | FLAG_NOISE | FLAG_RATE | FLAG_DELTA_IDS;
const CRC_LEN: usize = 4;
/// A u64 LEB128 varint never needs more than 10 bytes.
const MAX_VARINT_LEN: usize = 10;

/// One step report (or one part of it) in the form the ledger consumes, see the
/// [module documentation](self) for its binary encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPayload {
    /// Step number; steps are applied in order from 0.
    pub step: u64,
    /// `(index, count)` when the step is reported in several parts.
    pub part: Option<(u32, u32)>,
    /// Noise multiplier of this step when it differs from the dataset's default.
    pub noise_multiplier: Option<f64>,
    /// Sampling rate of this step when it differs from the dataset's default.
    pub sampling_rate: Option<f64>,
    /// Ids of the examples in the batch, in the trainer's order.
    pub ids: Vec<u64>,
    /// Their unclipped gradient norms, same order; kept bit for bit.
    pub norms: Vec<f64>,
}

/// Why bytes are not a valid step payload. Every variant says where the problem is
/// (an offset or an index) so a client can fix its encoder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The input ends before a field that the header announces.
    #[error(
        "step payload truncated: {field} needs {needed} bytes at offset {offset}, \
         only {available} remain"
    )]
    Truncated {
        /// The field that does not fit.
        field: &'static str,
        /// Where it starts.
        offset: usize,
        /// Bytes it needs.
        needed: usize,
        /// Bytes left in the input.
        available: usize,
    },
    /// The first four bytes are not `DPLS`: this is not a step payload at all.
    #[error("not a step payload: expected magic bytes \"DPLS\", found {found}")]
    BadMagic {
        /// The bytes found, in hex.
        found: HexBytes,
    },
    /// A payload from a newer (or unknown) format version.
    #[error("unsupported step payload version {found}: this build reads version {supported}")]
    UnsupportedVersion {
        /// Version byte found.
        found: u8,
        /// Version this build supports.
        supported: u8,
    },
    /// Flag bits this version does not define are set.
    #[error("step payload has unknown flag bits {bits:#04x} (version 1 defines bits 0-3 only)")]
    UnknownFlags {
        /// The undefined bits that were set.
        bits: u8,
    },
    /// A declared count cannot fit in the bytes that remain (a forged or corrupt
    /// length); refused before allocating anything.
    #[error(
        "step payload declares {n_ids} ids and {n_norms} norms at offset {offset}, which need at \
         least {needed} bytes, but only {available} remain"
    )]
    CountTooLarge {
        /// Declared number of ids.
        n_ids: u64,
        /// Declared number of norms.
        n_norms: u64,
        /// Offset of the first count.
        offset: usize,
        /// Minimum bytes those counts need (saturated at `u64::MAX`).
        needed: u64,
        /// Bytes left after the counts.
        available: usize,
    },
    /// A delta-encoded id is malformed.
    #[error("malformed delta-encoded id {index} at offset {offset}: {reason}")]
    BadId {
        /// Position of the id in the list.
        index: u64,
        /// Offset of its varint.
        offset: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// Bytes remain between the norms and the CRC trailer.
    #[error("step payload has {extra} unexpected bytes after the norms (offset {offset})")]
    TrailingBytes {
        /// How many bytes are left over.
        extra: usize,
        /// Where they start.
        offset: usize,
    },
    /// The CRC-32 trailer does not match the content: the bytes were damaged.
    #[error(
        "step payload checksum mismatch: trailer says {stored:#010x}, content has {computed:#010x}"
    )]
    Checksum {
        /// CRC in the trailer.
        stored: u32,
        /// CRC of the content.
        computed: u32,
    },
}

/// Bytes shown in hex in an error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HexBytes(pub Vec<u8>);

impl fmt::Display for HexBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("nothing");
        }
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl StepPayload {
    /// Encodes the payload in format version 1 (see the [module documentation](self)).
    ///
    /// Deterministic: equal payloads give equal bytes. Delta-encodes the ids when they
    /// are strictly increasing and that is smaller than 8 bytes per id.
    pub fn encode(&self) -> Vec<u8> {
        encode_fields(Fields {
            step: self.step,
            part: self.part,
            noise_multiplier: self.noise_multiplier,
            sampling_rate: self.sampling_rate,
            ids: &self.ids,
            norms: &self.norms,
        })
    }

    /// Decodes bytes written by [`encode`](Self::encode) (or any conforming writer),
    /// checking everything listed in the [module documentation](self). Allocates at
    /// most in proportion to `bytes.len()`.
    pub fn decode(bytes: &[u8]) -> Result<StepPayload, CodecError> {
        let mut r = Reader { bytes, pos: 0 };
        let magic = r.take(4, "magic").map_err(|e| match e {
            CodecError::Truncated { .. } if bytes != &MAGIC[..bytes.len().min(4)] => {
                CodecError::BadMagic {
                    found: HexBytes(bytes.to_vec()),
                }
            }
            other => other,
        })?;
        if magic != MAGIC {
            return Err(CodecError::BadMagic {
                found: HexBytes(magic.to_vec()),
            });
        }
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(CodecError::UnsupportedVersion {
                found: version,
                supported: VERSION,
            });
        }
        let flags = r.u8("flags")?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(CodecError::UnknownFlags {
                bits: flags & !KNOWN_FLAGS,
            });
        }
        let step = r.u64("step")?;
        let part = if flags & FLAG_PART != 0 {
            let index = r.u32("part index")?;
            let count = r.u32("part count")?;
            Some((index, count))
        } else {
            None
        };
        let noise_multiplier = if flags & FLAG_NOISE != 0 {
            Some(f64::from_bits(r.u64("noise_multiplier")?))
        } else {
            None
        };
        let sampling_rate = if flags & FLAG_RATE != 0 {
            Some(f64::from_bits(r.u64("sampling_rate")?))
        } else {
            None
        };
        let counts_offset = r.pos;
        let n_ids = r.u64("n_ids")?;
        let n_norms = r.u64("n_norms")?;
        let delta = flags & FLAG_DELTA_IDS != 0;
        // Minimum size of what follows: every id takes at least 1 (delta) or 8 bytes.
        let id_min = if delta { 1u64 } else { 8 };
        let needed = n_ids
            .checked_mul(id_min)
            .and_then(|v| v.checked_add(n_norms.checked_mul(8)?))
            .and_then(|v| v.checked_add(CRC_LEN as u64));
        let available = r.remaining();
        match needed {
            Some(needed) if needed <= available as u64 => {}
            needed => {
                return Err(CodecError::CountTooLarge {
                    n_ids,
                    n_norms,
                    offset: counts_offset,
                    needed: needed.unwrap_or(u64::MAX),
                    available,
                })
            }
        }
        // Both counts are now bounded by the input length, so they fit in usize.
        let n_ids = usize::try_from(n_ids).unwrap_or(usize::MAX);
        let n_norms = usize::try_from(n_norms).unwrap_or(usize::MAX);
        let mut ids = Vec::with_capacity(n_ids);
        if delta {
            let mut previous = 0u64;
            for index in 0..n_ids {
                let offset = r.pos;
                let value = r.varint(index as u64)?;
                let id = if index == 0 {
                    value
                } else if value == 0 {
                    return Err(CodecError::BadId {
                        index: index as u64,
                        offset,
                        reason: "gap of 0: delta-encoded ids must be strictly increasing",
                    });
                } else {
                    previous.checked_add(value).ok_or(CodecError::BadId {
                        index: index as u64,
                        offset,
                        reason: "id exceeds u64::MAX",
                    })?
                };
                ids.push(id);
                previous = id;
            }
        } else {
            let raw = r.take(n_ids * 8, "ids")?;
            ids.extend(raw.chunks_exact(8).map(le_u64));
        }
        let raw = r.take(n_norms * 8, "norms")?;
        let norms: Vec<f64> = raw
            .chunks_exact(8)
            .map(|c| f64::from_bits(le_u64(c)))
            .collect();
        let body_end = r.pos;
        let extra = r.remaining();
        if extra < CRC_LEN {
            return Err(CodecError::Truncated {
                field: "crc32 trailer",
                offset: body_end,
                needed: CRC_LEN,
                available: extra,
            });
        }
        if extra > CRC_LEN {
            return Err(CodecError::TrailingBytes {
                extra: extra - CRC_LEN,
                offset: body_end,
            });
        }
        let stored = r.u32("crc32 trailer")?;
        let computed = crc32fast::hash(&bytes[..body_end]);
        if stored != computed {
            return Err(CodecError::Checksum { stored, computed });
        }
        Ok(StepPayload {
            step,
            part,
            noise_multiplier,
            sampling_rate,
            ids,
            norms,
        })
    }
}

impl From<&StepReport> for StepPayload {
    /// The payload of a report: the same fields, the batch copied.
    fn from(report: &StepReport) -> StepPayload {
        StepPayload {
            step: report.step,
            part: report.part.map(|p| (p.index, p.count)),
            noise_multiplier: report.noise_multiplier,
            sampling_rate: report.sampling_rate,
            ids: report.ids.clone(),
            norms: report.norms.clone(),
        }
    }
}

impl From<StepPayload> for StepReport {
    /// The report a payload (durable, or a binary HTTP body) encodes.
    fn from(payload: StepPayload) -> StepReport {
        StepReport {
            step: payload.step,
            ids: payload.ids,
            norms: payload.norms,
            noise_multiplier: payload.noise_multiplier,
            sampling_rate: payload.sampling_rate,
            part: payload
                .part
                .map(|(index, count)| crate::step::Part { index, count }),
        }
    }
}

/// Encodes a [`StepReport`] as the binary step body, byte for byte what
/// [`StepPayload::encode`] writes for the same fields (so a report sent in this
/// encoding and the same report in JSON are one report to the ledger, and a
/// retry in either encoding is recognised). Deterministic; ids are
/// delta-encoded when they are strictly increasing and that is smaller (sorted
/// Poisson batches usually are). Nothing is validated here: the server refuses
/// bad values with a problem naming the field, exactly as for JSON.
pub fn encode_step(report: &StepReport) -> Vec<u8> {
    encode_fields(Fields {
        step: report.step,
        part: report.part.map(|p| (p.index, p.count)),
        noise_multiplier: report.noise_multiplier,
        sampling_rate: report.sampling_rate,
        ids: &report.ids,
        norms: &report.norms,
    })
}

/// The fields of one payload, borrowed: the one encoder serves both an owned
/// [`StepPayload`] and a [`StepReport`] without copying the batch.
struct Fields<'a> {
    step: u64,
    part: Option<(u32, u32)>,
    noise_multiplier: Option<f64>,
    sampling_rate: Option<f64>,
    ids: &'a [u64],
    norms: &'a [f64],
}

/// Writes format version 1 (see the [module documentation](self)).
fn encode_fields(f: Fields<'_>) -> Vec<u8> {
    let delta_len = delta_encoded_len(f.ids);
    let raw_len = f.ids.len().saturating_mul(8);
    let use_delta = matches!(delta_len, Some(len) if len < raw_len);
    let ids_len = if use_delta {
        delta_len.unwrap_or(raw_len)
    } else {
        raw_len
    };
    let capacity = 14usize
        .saturating_add(8 + 16 + 16)
        .saturating_add(ids_len)
        .saturating_add(f.norms.len().saturating_mul(8))
        .saturating_add(CRC_LEN);
    let mut out = Vec::with_capacity(capacity);
    let mut flags = 0u8;
    if f.part.is_some() {
        flags |= FLAG_PART;
    }
    if f.noise_multiplier.is_some() {
        flags |= FLAG_NOISE;
    }
    if f.sampling_rate.is_some() {
        flags |= FLAG_RATE;
    }
    if use_delta {
        flags |= FLAG_DELTA_IDS;
    }
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(flags);
    out.extend_from_slice(&f.step.to_le_bytes());
    if let Some((index, count)) = f.part {
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
    }
    if let Some(sigma) = f.noise_multiplier {
        out.extend_from_slice(&sigma.to_bits().to_le_bytes());
    }
    if let Some(rate) = f.sampling_rate {
        out.extend_from_slice(&rate.to_bits().to_le_bytes());
    }
    out.extend_from_slice(&(f.ids.len() as u64).to_le_bytes());
    out.extend_from_slice(&(f.norms.len() as u64).to_le_bytes());
    if use_delta {
        let mut previous = 0u64;
        for (i, &id) in f.ids.iter().enumerate() {
            let value = if i == 0 { id } else { id - previous };
            write_varint(&mut out, value);
            previous = id;
        }
    } else {
        for id in f.ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    for norm in f.norms {
        out.extend_from_slice(&norm.to_bits().to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Size of the delta encoding of `ids`, or `None` when they are not strictly
/// increasing (or empty, where it saves nothing).
fn delta_encoded_len(ids: &[u64]) -> Option<usize> {
    let (&first, rest) = ids.split_first()?;
    let mut len = varint_len(first);
    let mut previous = first;
    for &id in rest {
        if id <= previous {
            return None;
        }
        len += varint_len(id - previous);
        previous = id;
    }
    Some(len)
}

fn varint_len(value: u64) -> usize {
    let bits = 64 - value.leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn le_u64(chunk: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&chunk[..8]);
    u64::from_le_bytes(b)
}

/// Bounds-checked cursor over the input.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], CodecError> {
        let available = self.remaining();
        if len > available {
            return Err(CodecError::Truncated {
                field,
                offset: self.pos,
                needed: len,
                available,
            });
        }
        let slice = &self.bytes[self.pos..self.pos + len];
        self.pos += len;
        Ok(slice)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, CodecError> {
        Ok(self.take(1, field)?[0])
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, CodecError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4, field)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, CodecError> {
        Ok(le_u64(self.take(8, field)?))
    }

    fn varint(&mut self, index: u64) -> Result<u64, CodecError> {
        let offset = self.pos;
        let mut value = 0u64;
        for i in 0..MAX_VARINT_LEN {
            let byte = self.take(1, "delta-encoded id")?[0];
            let group = u64::from(byte & 0x7f);
            if i == MAX_VARINT_LEN - 1 && byte > 0x01 {
                return Err(CodecError::BadId {
                    index,
                    offset,
                    reason: "varint exceeds u64::MAX",
                });
            }
            value |= group << (7 * i);
            if byte & 0x80 == 0 {
                if i > 0 && byte == 0 {
                    return Err(CodecError::BadId {
                        index,
                        offset,
                        reason: "varint has superfluous trailing zero bytes",
                    });
                }
                return Ok(value);
            }
        }
        Err(CodecError::BadId {
            index,
            offset,
            reason: "varint longer than 10 bytes",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::Part;
    use rand::{Rng, SeedableRng};

    #[test]
    fn encode_step_writes_a_reports_fields_byte_by_byte() {
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
    fn encode_step_delta_ids_and_optional_fields() {
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
    fn encode_step_is_the_payloads_encoding() {
        for (ids, part) in [
            (vec![], None),
            (vec![9, 1, 4], Some(Part { index: 0, count: 3 })),
            (vec![1, 2, 1 << 50], None),
            ((0..300).map(|i| i * 7).collect(), Some(Part::WHOLE)),
        ] {
            let norms: Vec<f64> = ids.iter().map(|&i| i as f64 * 0.5).collect();
            let report = StepReport {
                step: 3,
                ids,
                norms,
                noise_multiplier: Some(0.9),
                sampling_rate: None,
                part,
            };
            let bytes = encode_step(&report);
            let payload = StepPayload::decode(&bytes).unwrap();
            assert_eq!(payload.encode(), bytes);
            assert_eq!(payload.part, part.map(|p| (p.index, p.count)));
            assert_eq!(payload.ids, report.ids);
        }
    }

    fn sample(ids: Vec<u64>) -> StepPayload {
        let norms = ids.iter().map(|&i| i as f64 * 0.25 + 0.125).collect();
        StepPayload {
            step: 42,
            part: Some((1, 3)),
            noise_multiplier: Some(1.1),
            sampling_rate: Some(0.01),
            ids,
            norms,
        }
    }

    fn assert_bit_identical(a: &StepPayload, b: &StepPayload) {
        assert_eq!(a.step, b.step);
        assert_eq!(a.part, b.part);
        assert_eq!(
            a.noise_multiplier.map(f64::to_bits),
            b.noise_multiplier.map(f64::to_bits)
        );
        assert_eq!(
            a.sampling_rate.map(f64::to_bits),
            b.sampling_rate.map(f64::to_bits)
        );
        assert_eq!(a.ids, b.ids);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.norms), bits(&b.norms));
    }

    #[test]
    fn round_trip_all_field_combinations() {
        for mask in 0..8u8 {
            let p = StepPayload {
                step: u64::MAX - u64::from(mask),
                part: (mask & 1 != 0).then_some((7, 9)),
                noise_multiplier: (mask & 2 != 0).then_some(0.7),
                sampling_rate: (mask & 4 != 0).then_some(1e-7),
                ids: vec![5, 3, u64::MAX, 0],
                norms: vec![0.0, -0.0, f64::INFINITY, 1e-308],
            };
            let bytes = p.encode();
            assert_eq!(&bytes[..4], b"DPLS");
            assert_eq!(bytes[4], 1);
            assert_eq!(bytes[5] & FLAG_DELTA_IDS, 0, "unsorted ids are raw");
            let q = StepPayload::decode(&bytes).expect("decodes");
            assert_bit_identical(&p, &q);
        }
    }

    #[test]
    fn empty_batch_round_trips() {
        let p = StepPayload {
            step: 0,
            part: None,
            noise_multiplier: None,
            sampling_rate: None,
            ids: vec![],
            norms: vec![],
        };
        let bytes = p.encode();
        assert_eq!(bytes.len(), 4 + 1 + 1 + 8 + 8 + 8 + 4);
        assert_eq!(StepPayload::decode(&bytes).unwrap(), p);
    }

    #[test]
    fn exact_layout_of_a_small_payload() {
        let p = StepPayload {
            step: 0x0102,
            part: Some((1, 2)),
            noise_multiplier: None,
            sampling_rate: Some(0.5),
            ids: vec![9, 1],
            norms: vec![2.0, 1.0],
        };
        let b = p.encode();
        let mut expected = b"DPLS".to_vec();
        expected.push(1);
        expected.push(0b0101);
        expected.extend_from_slice(&0x0102u64.to_le_bytes());
        expected.extend_from_slice(&1u32.to_le_bytes());
        expected.extend_from_slice(&2u32.to_le_bytes());
        expected.extend_from_slice(&0.5f64.to_le_bytes());
        expected.extend_from_slice(&2u64.to_le_bytes());
        expected.extend_from_slice(&2u64.to_le_bytes());
        expected.extend_from_slice(&9u64.to_le_bytes());
        expected.extend_from_slice(&1u64.to_le_bytes());
        expected.extend_from_slice(&2.0f64.to_le_bytes());
        expected.extend_from_slice(&1.0f64.to_le_bytes());
        let crc = crc32fast::hash(&expected);
        expected.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(b, expected);
    }

    #[test]
    fn sorted_ids_are_delta_encoded_and_smaller() {
        let ids: Vec<u64> = (0..4096u64).map(|i| 1_000_000 + i * 244).collect();
        let p = sample(ids);
        let bytes = p.encode();
        assert_ne!(bytes[5] & FLAG_DELTA_IDS, 0);
        assert!(bytes.len() < 4096 * 8 + 4096 * 3, "len {}", bytes.len());
        assert_bit_identical(&p, &StepPayload::decode(&bytes).unwrap());
        // Extreme gaps, including the largest representable id.
        let p = sample(vec![0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX]);
        let q = StepPayload::decode(&p.encode()).unwrap();
        assert_bit_identical(&p, &q);
    }

    #[test]
    fn nan_payloads_and_signed_zero_survive() {
        let nan_bits = [
            0x7ff8_0000_0000_0000u64,
            0x7ff0_0000_0000_0001, // signalling NaN
            0xfff8_dead_beef_0001, // negative NaN with payload
            0x7fff_ffff_ffff_ffff,
            0x8000_0000_0000_0000, // -0.0
            0x0000_0000_0000_0001, // smallest subnormal
        ];
        let norms: Vec<f64> = nan_bits.iter().map(|&b| f64::from_bits(b)).collect();
        let p = StepPayload {
            step: 1,
            part: None,
            noise_multiplier: Some(f64::from_bits(0x7ff4_0000_0000_0000)),
            sampling_rate: Some(f64::NAN),
            ids: (0..norms.len() as u64).collect(),
            norms,
        };
        let q = StepPayload::decode(&p.encode()).unwrap();
        assert_bit_identical(&p, &q);
        let got: Vec<u64> = q.norms.iter().map(|x| x.to_bits()).collect();
        assert_eq!(got, nan_bits);
    }

    #[test]
    fn mismatched_lengths_are_transported_not_truncated() {
        let p = StepPayload {
            step: 3,
            part: None,
            noise_multiplier: None,
            sampling_rate: None,
            ids: vec![1, 2, 3],
            norms: vec![0.5],
        };
        let q = StepPayload::decode(&p.encode()).unwrap();
        assert_eq!(q.ids.len(), 3);
        assert_eq!(q.norms.len(), 1);
    }

    #[test]
    fn every_truncation_is_an_error() {
        for p in [
            sample((0..50).map(|i| i * 3 + 1).collect()), // delta
            sample(vec![9, 3, 7, 1]),                     // raw
        ] {
            let bytes = p.encode();
            for len in 0..bytes.len() {
                let err = StepPayload::decode(&bytes[..len]).unwrap_err();
                assert!(
                    matches!(
                        err,
                        CodecError::Truncated { .. }
                            | CodecError::CountTooLarge { .. }
                            | CodecError::BadMagic { .. }
                    ),
                    "len {len}: {err}"
                );
            }
            assert!(StepPayload::decode(&bytes).is_ok());
        }
    }

    #[test]
    fn trailing_bytes_and_flipped_bits_are_errors() {
        let p = sample((0..20).map(|i| i * 1000).collect());
        let bytes = p.encode();
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            StepPayload::decode(&longer),
            Err(CodecError::TrailingBytes { extra: 1, .. })
        ));
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[i] ^= 1 << bit;
                assert!(
                    StepPayload::decode(&damaged).is_err(),
                    "flip of bit {bit} of byte {i} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn header_errors_are_specific() {
        assert!(matches!(
            StepPayload::decode(b"{\"step\": 1}"),
            Err(CodecError::BadMagic { .. })
        ));
        assert!(matches!(
            StepPayload::decode(b"PK"),
            Err(CodecError::BadMagic { .. })
        ));
        assert!(matches!(
            StepPayload::decode(b"DP"),
            Err(CodecError::Truncated { .. })
        ));
        let mut b = sample(vec![1]).encode();
        b[4] = 2;
        assert_eq!(
            StepPayload::decode(&b),
            Err(CodecError::UnsupportedVersion {
                found: 2,
                supported: 1
            })
        );
        let mut b = sample(vec![1]).encode();
        b[5] |= 0x40;
        assert_eq!(
            StepPayload::decode(&b),
            Err(CodecError::UnknownFlags { bits: 0x40 })
        );
        let msg = StepPayload::decode(b"XXXXX").unwrap_err().to_string();
        assert!(msg.contains("58 58 58 58"), "{msg}");
    }

    #[test]
    fn huge_declared_counts_are_refused_without_allocating() {
        for (n_ids, n_norms, flags) in [
            (u64::MAX, 0u64, 0u8),
            (0, u64::MAX, 0),
            (1 << 60, 1 << 60, FLAG_DELTA_IDS),
            (u64::MAX / 8 + 1, 0, 0),
            (2, 0, 0), // needs 16 bytes, 4 available
        ] {
            let mut b = b"DPLS".to_vec();
            b.push(1);
            b.push(flags);
            b.extend_from_slice(&7u64.to_le_bytes());
            b.extend_from_slice(&n_ids.to_le_bytes());
            b.extend_from_slice(&n_norms.to_le_bytes());
            let crc = crc32fast::hash(&b);
            b.extend_from_slice(&crc.to_le_bytes());
            let err = StepPayload::decode(&b).unwrap_err();
            assert!(
                matches!(err, CodecError::CountTooLarge { .. }),
                "{n_ids} {n_norms}: {err}"
            );
        }
    }

    fn delta_payload(varints: &[&[u8]]) -> Vec<u8> {
        let mut b = b"DPLS".to_vec();
        b.push(1);
        b.push(FLAG_DELTA_IDS);
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&(varints.len() as u64).to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        for v in varints {
            b.extend_from_slice(v);
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn malformed_varints_are_refused() {
        // Valid: 300 then gap 1.
        let ok = StepPayload::decode(&delta_payload(&[&[0xac, 0x02], &[0x01]])).unwrap();
        assert_eq!(ok.ids, vec![300, 301]);
        let cases: [(&[&[u8]], &str); 5] = [
            (&[&[0x05], &[0x00]], "strictly increasing"),
            (&[&[0x80, 0x00]], "superfluous"),
            (
                &[&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]],
                "exceeds",
            ),
            (
                &[
                    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                    &[0x01],
                ],
                "exceeds u64::MAX",
            ),
            (&[&[0x81, 0x80, 0x00]], "superfluous"),
        ];
        for (varints, needle) in cases {
            let err = StepPayload::decode(&delta_payload(varints)).unwrap_err();
            assert!(err.to_string().contains(needle), "{err}");
        }
    }

    #[test]
    fn random_payloads_round_trip_and_random_garbage_never_panics() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(7);
        for _ in 0..300 {
            let n = rng.random_range(0..200usize);
            let mut ids: Vec<u64> = (0..n)
                .map(|_| rng.random::<u64>() >> rng.random_range(0..64))
                .collect();
            if rng.random_bool(0.5) {
                ids.sort_unstable();
                ids.dedup();
            }
            let norms: Vec<f64> = (0..ids.len())
                .map(|_| f64::from_bits(rng.random()))
                .collect();
            let p = StepPayload {
                step: rng.random(),
                part: rng.random_bool(0.5).then(|| (rng.random(), rng.random())),
                noise_multiplier: rng.random_bool(0.5).then(|| f64::from_bits(rng.random())),
                sampling_rate: rng.random_bool(0.5).then(|| f64::from_bits(rng.random())),
                ids,
                norms,
            };
            let bytes = p.encode();
            assert_bit_identical(&p, &StepPayload::decode(&bytes).unwrap());
            let len = rng.random_range(0..bytes.len() + 8);
            let garbage: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let _ = StepPayload::decode(&garbage);
            let mut header_kept = bytes.clone();
            for b in header_kept.iter_mut().skip(6) {
                if rng.random_bool(0.05) {
                    *b = rng.random();
                }
            }
            let _ = StepPayload::decode(&header_kept);
        }
    }
}
