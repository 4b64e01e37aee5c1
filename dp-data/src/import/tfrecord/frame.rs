//! TFRecord framing: each record's length and data, each with a masked CRC32C, in a file
//! that may be GZIP-compressed.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::options::TfRecordCompression;
use crate::error::{Error, Result};
use crate::import::Source;

/// The largest record accepted: a sanity bound far above any real Example. Below it, a record
/// of an uncompressed file must also fit in what is left of the file, and a record of a
/// compressed one is read in chunks as its bytes arrive, so a lying length costs nothing.
const MAX_RECORD: u64 = 1 << 32;

/// TFRecord's CRC mask.
pub(super) fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crate::checksum::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Reads the next record's data into `buf`; returns the offset of its frame, or `None` at the
/// end of the file.
pub(super) fn next_record(source: &mut Source, buf: &mut Vec<u8>) -> Result<Option<u64>> {
    if source.at_end()? {
        return Ok(None);
    }
    let start = source.offset();
    let mut head = [0u8; 12];
    source.read_exact(&mut head, "a record's length and its CRC")?;
    let len = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
    let stored = u32::from_le_bytes(head[8..].try_into().unwrap_or_default());
    let expected = masked_crc(&head[..8]);
    if stored != expected {
        return Err(source.corrupt(
            start + 8,
            format!(
                "record length field: expected the masked CRC32C {expected:#010x} of the length \
                 bytes, found {stored:#010x} (not a TFRecord file, or a corrupt one)"
            ),
        ));
    }
    if len > MAX_RECORD || len.saturating_add(4) > source.max_remaining() {
        return Err(source.corrupt(
            start,
            format!(
                "record length {len} is more than the rest of the file can hold ({} bytes at most)",
                source.max_remaining().saturating_sub(4).min(MAX_RECORD)
            ),
        ));
    }
    source.read_into(buf, len, format_args!("the {len}-byte record starting at byte {start}"))?;
    let mut tail = [0u8; 4];
    source.read_exact(&mut tail, "the record's data CRC")?;
    let stored = u32::from_le_bytes(tail);
    let expected = masked_crc(buf);
    if stored != expected {
        return Err(source.corrupt(
            start + 12 + len,
            format!(
                "record data: expected the masked CRC32C {expected:#010x} of the {len} data bytes, \
                 found {stored:#010x}"
            ),
        ));
    }
    Ok(Some(start))
}

/// Opens a TFRecord file under `compression`.
pub(super) fn open(path: &Path, compression: TfRecordCompression) -> Result<Source> {
    let gzip = match compression {
        TfRecordCompression::None => false,
        TfRecordCompression::Gzip => true,
        TfRecordCompression::Auto => {
            let mut file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
            let mut head = Vec::with_capacity(12);
            file.by_ref()
                .take(12)
                .read_to_end(&mut head)
                .map_err(|e| Error::io(path, "read", e))?;
            let framed = head.len() == 12 && masked_crc(&head[..8]).to_le_bytes() == head[8..12];
            !framed && head.starts_with(&[0x1f, 0x8b])
        }
    };
    Source::open(path, Some(gzip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_known_values() {
        // CRC32C("123456789") = 0xe3069283 (RFC 3720's check value), masked by hand:
        // ((0xe3069283 >> 15) | (0xe3069283 << 17)) + 0xa282ead8 (mod 2^32) = 0xc78ab0e5.
        assert_eq!(crate::checksum::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    fn frame(data: &[u8]) -> Vec<u8> {
        let mut out = (data.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&masked_crc(&out.clone()).to_le_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(&masked_crc(data).to_le_bytes());
        out
    }

    #[test]
    fn reads_frames_and_checks_their_crcs() {
        let file = [frame(b"hello"), frame(b""), frame(b"world!")].concat();
        let mut source = Source::from_bytes(file.clone(), false);
        let mut buf = Vec::new();
        assert_eq!(next_record(&mut source, &mut buf).unwrap(), Some(0));
        assert_eq!(buf, b"hello");
        assert_eq!(next_record(&mut source, &mut buf).unwrap(), Some(21));
        assert_eq!(buf, b"");
        assert_eq!(next_record(&mut source, &mut buf).unwrap(), Some(37));
        assert_eq!(buf, b"world!");
        assert_eq!(next_record(&mut source, &mut buf).unwrap(), None);

        let corrupt = |file: Vec<u8>| -> (u64, String) {
            let mut source = Source::from_bytes(file, false);
            let mut buf = Vec::new();
            loop {
                match next_record(&mut source, &mut buf) {
                    Ok(Some(_)) => continue,
                    Err(Error::Corrupt { offset, what, .. }) => return (offset, what),
                    other => panic!("{other:?}"),
                }
            }
        };
        let mut bad = file.clone();
        bad[21 + 3] ^= 1; // the second record's length
        assert_eq!(corrupt(bad).0, 21 + 8);
        let mut bad = file.clone();
        bad[12] ^= 1; // the first record's data
        let (at, what) = corrupt(bad);
        assert_eq!(at, 12 + 5);
        assert!(what.contains("record data"), "{what}");
        let (at, what) = corrupt(file[..file.len() - 2].to_vec());
        assert_eq!(at, 37);
        assert!(what.contains("more than the rest"), "{what}");
        // Cut after the third record's length: the CRC is missing at 45.
        let (at, what) = corrupt(file[..file.len() - 14].to_vec());
        assert_eq!(at, 45);
        assert!(what.contains("ends 8 bytes into"), "{what}");
        // A length that lies, with a valid CRC, is refused before reading.
        let mut lie = u64::MAX.to_le_bytes().to_vec();
        lie.extend_from_slice(&masked_crc(&lie.clone()).to_le_bytes());
        let (at, what) = corrupt(lie);
        assert_eq!(at, 0);
        assert!(what.contains("more than the rest"), "{what}");
    }
}
