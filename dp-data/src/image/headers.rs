//! Reading an encoded image's headers (its size and channels) without decoding its pixels:
//! what an importer records in a stored image's header.

use std::io::Cursor;

use zune_jpeg::JpegDecoder;
use zune_jpeg::zune_core::bytestream::ZCursor;

use super::info::{ImageFormat, ImageInfo};

impl ImageInfo {
    /// Reads an encoded image's headers. An error says what is wrong: not a JPEG or PNG,
    /// truncated headers, a zero size, more pixels than [`MAX_PIXELS`](crate::MAX_PIXELS).
    pub fn probe(bytes: &[u8]) -> Result<Self, String> {
        let info = match ImageFormat::sniff(bytes) {
            Some(ImageFormat::Jpeg) => jpeg_info(bytes)?,
            Some(ImageFormat::Png) => png_info(bytes)?,
            None => {
                let start = &bytes[..bytes.len().min(8)];
                return Err(format!("is not a JPEG or PNG image (it starts {start:02x?})"));
            }
        };
        info.check()?;
        Ok(info)
    }
}

/// `encoded` (a JPEG or PNG file's bytes) as a dataset stores it, the value a writer takes for
/// an image feature ([`crate::Value::Bytes`]); an error says why it is not an image.
pub fn stored_image(encoded: &[u8]) -> Result<Vec<u8>, String> {
    let info = ImageInfo::probe(encoded)?;
    let mut out = Vec::new();
    info.store(encoded, &mut out);
    Ok(out)
}

/// The headers of a JPEG: its displayed size (an EXIF orientation of 5 to 8 swaps width and
/// height) and its channels.
fn jpeg_info(bytes: &[u8]) -> Result<ImageInfo, String> {
    let decode = || {
        let mut decoder = JpegDecoder::new(ZCursor::new(bytes));
        decoder.decode_headers().map_err(|e| format!("is not a readable JPEG: {e}"))?;
        let info = decoder.info().ok_or("is not a readable JPEG")?;
        let orientation = decoder.exif().map_or(1, |exif| exif_orientation(exif));
        let (width, height) = (u32::from(info.width), u32::from(info.height));
        let (width, height) =
            if (5..=8).contains(&orientation) { (height, width) } else { (width, height) };
        Ok(ImageInfo { format: ImageFormat::Jpeg, width, height, channels: info.components })
    };
    std::panic::catch_unwind(decode).unwrap_or_else(|_| Err("is not a readable JPEG".into()))
}

/// The header of a PNG: its size and channels (a palette counts as color, with alpha when it
/// has a transparency chunk).
fn png_info(bytes: &[u8]) -> Result<ImageInfo, String> {
    let decoder = png::Decoder::new(Cursor::new(bytes));
    let reader = decoder.read_info().map_err(|e| format!("is not a readable PNG: {e}"))?;
    let info = reader.info();
    let channels = match info.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Indexed if info.trns.is_some() => 4,
        png::ColorType::Indexed => 3,
        png::ColorType::Rgba => 4,
    };
    Ok(ImageInfo { format: ImageFormat::Png, width: info.width, height: info.height, channels })
}

/// The orientation tag (0x0112) of an EXIF block (a TIFF structure, after an optional
/// `Exif\0\0`); 1 (as stored) when it has none or cannot be read.
pub(super) fn exif_orientation(exif: &[u8]) -> u16 {
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
