//! The `tensorflow.Event` protocol buffer, encoded by hand for the three kinds of
//! event a scalar log needs: `wall_time` (double, field 1), `step` (int64, field
//! 2), and either `file_version` (string, field 3, the first event of a file) or
//! `summary` (field 5) whose repeated `value` (field 1) holds
//! `{tag: string = 1, simple_value: float = 2}`. Decoding skips any other field,
//! so files written by other writers (tensorboardX) read back too.

use std::io;

/// The `file_version` of the first event of every file.
pub const FILE_VERSION: &str = "brain.Event:2";

/// One event of a scalar log.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    /// The training step.
    pub step: i64,
    /// What the event carries.
    pub what: What,
}

/// The payload of an [`Event`].
#[derive(Debug, Clone, PartialEq)]
pub enum What {
    /// The file header, e.g. [`FILE_VERSION`].
    FileVersion(String),
    /// Scalars: `(tag, simple_value)` pairs (TensorBoard stores them as f32).
    Scalars(Vec<(String, f32)>),
    /// Any other event (graphs, images, ...), kept for what it is not.
    Other,
}

const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;
const FIXED32: u64 = 5;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u64, wire: u64) {
    put_varint(out, (field << 3) | wire);
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_key(out, field, LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

impl Event {
    /// The protobuf encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_key(&mut out, 1, FIXED64);
        out.extend_from_slice(&self.wall_time.to_le_bytes());
        put_key(&mut out, 2, VARINT);
        put_varint(&mut out, self.step as u64);
        match &self.what {
            What::FileVersion(v) => put_bytes(&mut out, 3, v.as_bytes()),
            What::Scalars(values) => {
                let mut summary = Vec::new();
                for (tag, value) in values {
                    let mut v = Vec::new();
                    put_bytes(&mut v, 1, tag.as_bytes());
                    put_key(&mut v, 2, FIXED32);
                    v.extend_from_slice(&value.to_le_bytes());
                    put_bytes(&mut summary, 1, &v);
                }
                put_bytes(&mut out, 5, &summary);
            }
            What::Other => {}
        }
        out
    }

    /// Decode an event; fields other than the ones above are skipped.
    pub fn decode(data: &[u8]) -> io::Result<Event> {
        let mut event = Event {
            wall_time: 0.0,
            step: 0,
            what: What::Other,
        };
        let mut r = Fields(data);
        while let Some((field, value)) = r.next_field()? {
            match (field, value) {
                (1, Value::Fixed64(b)) => event.wall_time = f64::from_le_bytes(b),
                (2, Value::Varint(v)) => event.step = v as i64,
                (3, Value::Bytes(b)) => {
                    event.what = What::FileVersion(
                        String::from_utf8(b.to_vec()).map_err(|_| invalid("file_version"))?,
                    )
                }
                (5, Value::Bytes(b)) => event.what = What::Scalars(decode_summary(b)?),
                _ => {}
            }
        }
        Ok(event)
    }
}

/// The scalars of a `Summary`; values without a `simple_value` are left out.
fn decode_summary(data: &[u8]) -> io::Result<Vec<(String, f32)>> {
    let mut out = Vec::new();
    let mut r = Fields(data);
    while let Some((field, value)) = r.next_field()? {
        let (1, Value::Bytes(v)) = (field, value) else {
            continue;
        };
        let (mut tag, mut simple) = (String::new(), None);
        let mut vr = Fields(v);
        while let Some((field, value)) = vr.next_field()? {
            match (field, value) {
                (1, Value::Bytes(b)) => {
                    tag = String::from_utf8(b.to_vec()).map_err(|_| invalid("tag"))?
                }
                (2, Value::Fixed32(b)) => simple = Some(f32::from_le_bytes(b)),
                _ => {}
            }
        }
        if let Some(s) = simple {
            out.push((tag, s));
        }
    }
    Ok(out)
}

enum Value<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// A cursor over the fields of one message.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn varint(&mut self) -> io::Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first().ok_or_else(|| invalid("varint"))?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(invalid("varint too long"))
    }

    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(invalid("truncated field"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn next_field(&mut self) -> io::Result<Option<(u64, Value<'a>)>> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            VARINT => Value::Varint(self.varint()?),
            FIXED64 => Value::Fixed64(self.take(8)?.try_into().expect("8 bytes")),
            LEN => {
                let n = usize::try_from(self.varint()?).map_err(|_| invalid("length"))?;
                Value::Bytes(self.take(n)?)
            }
            FIXED32 => Value::Fixed32(self.take(4)?.try_into().expect("4 bytes")),
            _ => return Err(invalid("unsupported wire type")),
        };
        Ok(Some((key >> 3, value)))
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bad event: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_event_has_the_expected_bytes() {
        let e = Event {
            wall_time: 1.5,
            step: 0,
            what: What::FileVersion(FILE_VERSION.into()),
        };
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 0x00, 0x1a, 13]);
        want.extend_from_slice(b"brain.Event:2");
        assert_eq!(e.encode(), want);
        assert_eq!(Event::decode(&want).unwrap(), e);
    }

    #[test]
    fn scalars_round_trip_with_large_steps() {
        let e = Event {
            wall_time: 1.7e9,
            step: 300_000_000_000,
            what: What::Scalars(vec![("a/b".into(), 0.25), ("c".into(), -3.5)]),
        };
        assert_eq!(Event::decode(&e.encode()).unwrap(), e);
        // A truncated message is an error, not a silent partial event.
        let bytes = e.encode();
        assert!(Event::decode(&bytes[..bytes.len() - 2]).is_err());
    }
}
