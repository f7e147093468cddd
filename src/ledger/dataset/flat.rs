//! Per-example lists as flat little-endian bytes in a snapshot's header.
//!
//! MessagePack writes every integer of a `Vec<u64>` as its own value and every
//! list of a `Vec<Box<[u32]>>` as its own array, and reads them back one by
//! one: for the level history of a million examples (hundreds of megabytes
//! after a hundred million reported norms) that parse dominated a restart. As
//! one byte string each, decoded straight from the borrowed header bytes into
//! the final vectors, the data is copied once each way. Used through
//! `#[serde(with = ...)]`.

use serde::de::{Deserializer, Error, SeqAccess, Visitor};
use serde::ser::Serializer;

/// Deserializes a byte string with `decode`, borrowing it where the format
/// allows (formats without byte strings give a sequence of numbers).
struct DecodeBytes<F>(F);

impl<'de, T, F: FnOnce(&[u8]) -> Result<T, String>> Visitor<'de> for DecodeBytes<F> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a byte string")
    }
    fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<T, E> {
        (self.0)(v).map_err(E::custom)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        let mut bytes = Vec::new();
        while let Some(b) = seq.next_element::<u8>()? {
            bytes.push(b);
        }
        (self.0)(&bytes).map_err(A::Error::custom)
    }
}

fn le_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
}

/// `Vec<u64>` as one byte string.
pub(super) mod u64s {
    use super::*;

    pub fn serialize<S: Serializer>(values: &[u64], s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        s.serialize_bytes(&bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_bytes(DecodeBytes(|bytes: &[u8]| {
            if bytes.len() % 8 != 0 {
                return Err(format!("{} bytes are not whole u64s", bytes.len()));
            }
            Ok(bytes.chunks_exact(8).map(le_u64).collect())
        }))
    }
}

/// `Vec<Box<[u32]>>` as one byte string: the number of lists (u64), every
/// list's length (u32), then every value (u32).
pub(super) mod u32_lists {
    use super::*;

    pub fn serialize<S: Serializer>(lists: &[Box<[u32]>], s: S) -> Result<S::Ok, S::Error> {
        let total: usize = lists.iter().map(|l| l.len()).sum();
        let mut bytes = Vec::with_capacity(8 + lists.len() * 4 + total * 4);
        bytes.extend_from_slice(&(lists.len() as u64).to_le_bytes());
        for l in lists {
            bytes.extend_from_slice(&(l.len() as u32).to_le_bytes());
        }
        for v in lists.iter().flat_map(|l| l.iter()) {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        s.serialize_bytes(&bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Box<[u32]>>, D::Error> {
        d.deserialize_bytes(DecodeBytes(decode))
    }

    fn le_u32(bytes: &[u8]) -> u32 {
        u32::from_le_bytes(bytes.try_into().expect("4 bytes"))
    }

    fn decode(bytes: &[u8]) -> Result<Vec<Box<[u32]>>, String> {
        let short = || "the lists are cut short".to_string();
        let count =
            usize::try_from(le_u64(bytes.get(..8).ok_or_else(short)?)).map_err(|_| short())?;
        let lengths_end = count
            .checked_mul(4)
            .and_then(|l| l.checked_add(8))
            .filter(|&e| e <= bytes.len())
            .ok_or_else(short)?;
        let (lengths, mut values) = bytes[8..].split_at(lengths_end - 8);
        let mut lists = Vec::with_capacity(count);
        for len in lengths.chunks_exact(4) {
            let len = le_u32(len) as usize;
            let take = len
                .checked_mul(4)
                .filter(|&b| b <= values.len())
                .ok_or_else(short)?;
            let (list, rest) = values.split_at(take);
            lists.push(list.chunks_exact(4).map(le_u32).collect());
            values = rest;
        }
        if !values.is_empty() {
            return Err("bytes after the last list".into());
        }
        Ok(lists)
    }
}
