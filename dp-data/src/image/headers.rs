//! Reading an encoded image's headers (its size and channels) without decoding its pixels:
//! what an importer records in a stored image's header.

use std::io::Cursor;

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
    let header = super::jpeg::header(bytes)
        .map_err(|e| e.replace("does not decode as JPEG", "is not a readable JPEG"))?;
    let (width, height) = header.displayed_size();
    Ok(ImageInfo { format: ImageFormat::Jpeg, width, height, channels: header.components })
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
