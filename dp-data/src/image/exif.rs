//! The EXIF orientation of a photograph: how its stored pixels turn to stand as it was taken.

/// The orientation tag (0x0112) of an EXIF block (a TIFF structure, after an optional
/// `Exif\0\0`); 1 (as stored) when it has none or cannot be read.
pub(crate) fn exif_orientation(exif: &[u8]) -> u16 {
    let tiff = exif.strip_prefix(b"Exif\0\0").unwrap_or(exif);
    let little = match tiff.get(..2) {
        Some(b"II") => true,
        Some(b"MM") => false,
        _ => return 1,
    };
    let u16_at = |i: usize| {
        let b: [u8; 2] = tiff.get(i..i + 2)?.try_into().ok()?;
        Some(if little { u16::from_le_bytes(b) } else { u16::from_be_bytes(b) })
    };
    let u32_at = |i: usize| {
        let b: [u8; 4] = tiff.get(i..i + 4)?.try_into().ok()?;
        Some(if little { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) })
    };
    let find = || {
        let ifd = u32_at(4)? as usize;
        let entries = u16_at(ifd)? as usize;
        (0..entries).find_map(|e| {
            let at = ifd + 2 + 12 * e;
            (u16_at(at)? == 0x0112).then(|| u16_at(at + 8)).flatten()
        })
    };
    find().filter(|o| (1..=8).contains(o)).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exif_orientation_is_read_in_either_byte_order() {
        let tiff = |little: bool, orientation: u16| {
            let u16b = |v: u16| if little { v.to_le_bytes() } else { v.to_be_bytes() };
            let u32b = |v: u32| if little { v.to_le_bytes() } else { v.to_be_bytes() };
            let mut t = Vec::from(*b"Exif\0\0");
            t.extend_from_slice(if little { b"II" } else { b"MM" });
            t.extend_from_slice(&u16b(42));
            t.extend_from_slice(&u32b(8));
            t.extend_from_slice(&u16b(1));
            t.extend_from_slice(&u16b(0x0112));
            t.extend_from_slice(&u16b(3));
            t.extend_from_slice(&u32b(1));
            t.extend_from_slice(&u16b(orientation));
            t.extend_from_slice(&[0, 0]);
            t
        };
        assert_eq!(exif_orientation(&tiff(true, 6)), 6);
        assert_eq!(exif_orientation(&tiff(false, 8)), 8);
        assert_eq!(exif_orientation(&tiff(true, 9)), 1);
        assert_eq!(exif_orientation(&tiff(true, 6)[..14]), 1);
        assert_eq!(exif_orientation(b"garbage"), 1);
    }
}
