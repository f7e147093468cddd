//! TFRecord framing, the container of TensorBoard event files: each record is
//! `u64 length (LE) | masked crc32c(length) | data | masked crc32c(data)`.
//! Reading checks both checksums, so a test that reads a file back proves the
//! framing TensorBoard itself verifies.

use std::io::{self, Read, Write};

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) lookup table.
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0x82F6_3B78 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32C of `data`, the checksum TFRecord uses (not the IEEE CRC-32).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c = TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// TFRecord's masked CRC: rotate right by 15 and add a constant, so a CRC
/// stored inside data that is itself checksummed does not cancel out.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Write one record.
pub fn write_record<W: Write>(out: &mut W, data: &[u8]) -> io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    out.write_all(&len)?;
    out.write_all(&masked_crc32c(&len).to_le_bytes())?;
    out.write_all(data)?;
    out.write_all(&masked_crc32c(data).to_le_bytes())
}

/// Read one record; `Ok(None)` at a clean end of input, an `InvalidData` error
/// when a checksum does not match or the input ends inside a record.
pub fn read_record<R: Read>(input: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 8];
    let mut got = 0;
    while got < len.len() {
        let n = input.read(&mut len[got..])?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated record length",
            ));
        }
        got += n;
    }
    let mut crc = [0u8; 4];
    input.read_exact(&mut crc)?;
    if u32::from_le_bytes(crc) != masked_crc32c(&len) {
        return Err(invalid("length checksum mismatch"));
    }
    let size = usize::try_from(u64::from_le_bytes(len))
        .map_err(|_| invalid("record length does not fit in memory"))?;
    let mut data = vec![0u8; size];
    input.read_exact(&mut data)?;
    input.read_exact(&mut crc)?;
    if u32::from_le_bytes(crc) != masked_crc32c(&data) {
        return Err(invalid("data checksum mismatch"));
    }
    Ok(Some(data))
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_values() {
        // The CRC catalogue's check value for CRC-32C, and RFC 3720 B.4's
        // 32 bytes of zeros.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
    }

    #[test]
    fn records_round_trip_and_corruption_is_detected() {
        let mut buf = Vec::new();
        write_record(&mut buf, b"hello").unwrap();
        write_record(&mut buf, b"").unwrap();
        assert_eq!(buf.len(), (8 + 4 + 5 + 4) + (8 + 4 + 4));
        let mut r = buf.as_slice();
        assert_eq!(read_record(&mut r).unwrap().unwrap(), b"hello");
        assert_eq!(read_record(&mut r).unwrap().unwrap(), b"");
        assert!(read_record(&mut r).unwrap().is_none());

        let mut bad = buf.clone();
        bad[13] ^= 1; // a byte of "hello"
        let err = read_record(&mut bad.as_slice()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let mut bad = buf.clone();
        bad[0] ^= 1; // the length
        assert!(read_record(&mut bad.as_slice()).is_err());
        assert!(read_record(&mut &buf[..10]).is_err());
    }
}
