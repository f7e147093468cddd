//! Per-example lists as flat little-endian bytes in a snapshot's header.
//!
//! MessagePack writes every integer of a `Vec<u64>` as its own value and every
//! list of a `Vec<Box<[u64]>>` as its own array, and reads them back one by
//! one: for the level history of a million examples that parse (and the
//! snapshot's size) grew with the run, and dominated a restart. As byte strings
//! the same data is one copy each way. Used through `#[serde(with = ...)]`.

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeTuple, Serializer};
use serde::Deserialize;

/// A byte string read from any serde format (formats without byte strings
/// give a sequence of numbers).
struct Bytes(Vec<u8>);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = seq.next_element()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_bytes(V).map(Bytes)
    }
}

fn to_bytes<const W: usize>(values: impl Iterator<Item = [u8; W]>, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len * W);
    values.for_each(|v| out.extend_from_slice(&v));
    out
}

fn from_bytes<T, const W: usize, E: serde::de::Error>(
    bytes: &[u8],
    decode: fn([u8; W]) -> T,
) -> Result<Vec<T>, E> {
    if bytes.len() % W != 0 {
        return Err(E::custom(format!(
            "{} bytes are not a whole number of {W}-byte values",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(W)
        .map(|c| decode(c.try_into().expect("W bytes")))
        .collect())
}

/// `Vec<u64>` as one byte string.
pub(super) mod u64s {
    use super::*;

    pub fn serialize<S: Serializer>(values: &[u64], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&to_bytes(
            values.iter().map(|v| v.to_le_bytes()),
            values.len(),
        ))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        from_bytes(&Bytes::deserialize(d)?.0, u64::from_le_bytes)
    }
}

/// `Vec<Box<[u64]>>` as two byte strings: every list's length (u32), then
/// every value.
pub(super) mod u64_lists {
    use super::*;

    pub fn serialize<S: Serializer>(lists: &[Box<[u64]>], s: S) -> Result<S::Ok, S::Error> {
        let lengths = to_bytes(
            lists.iter().map(|l| (l.len() as u32).to_le_bytes()),
            lists.len(),
        );
        let total = lists.iter().map(|l| l.len()).sum();
        let values = to_bytes(lists.iter().flatten().map(|v| v.to_le_bytes()), total);
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&Raw(&lengths))?;
        t.serialize_element(&Raw(&values))?;
        t.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Box<[u64]>>, D::Error> {
        use serde::de::Error;
        let (Bytes(lengths), Bytes(values)) = <(Bytes, Bytes)>::deserialize(d)?;
        let lengths: Vec<u32> = from_bytes(&lengths, u32::from_le_bytes)?;
        let values: Vec<u64> = from_bytes(&values, u64::from_le_bytes)?;
        let total: u64 = lengths.iter().map(|&l| l as u64).sum();
        if total != values.len() as u64 {
            return Err(D::Error::custom("list lengths do not add up to the values"));
        }
        let mut at = 0;
        Ok(lengths
            .into_iter()
            .map(|l| {
                let list: Box<[u64]> = values[at..at + l as usize].into();
                at += l as usize;
                list
            })
            .collect())
    }
}

/// Bytes that serialize as a byte string.
struct Raw<'a>(&'a [u8]);

impl serde::Serialize for Raw<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}
