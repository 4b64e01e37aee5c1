//! Decoding a stored image into 8-bit pixels of the channel count a model takes, in buffers a
//! worker keeps from one image to the next. JPEG through zune-jpeg (baseline, progressive,
//! grayscale, CMYK and YCCK), PNG through `png` (palette, gray-alpha and 16-bit images
//! expanded to 8-bit channels); an EXIF orientation is applied, so that the pixels stand as
//! the photograph was taken. A color image becomes gray by ITU-R 601 luma (as PIL's
//! `convert("L")`); an alpha channel is dropped (as `convert("RGB")`).

use std::io::Cursor;

use zune_jpeg::JpegDecoder;
use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;

use super::{ImageFormat, ImageInfo, MAX_PIXELS};

/// Decoded 8-bit pixels, row-major, channels interleaved.
#[derive(Debug)]
pub(crate) struct Pixels<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) channels: usize,
}

/// One worker's decoder: the buffers it decodes into, grown to the largest image it has seen.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    pixels: Vec<u8>,
    scratch: Vec<u8>,
}

impl Decoder {
    /// Bytes its buffers hold.
    pub(crate) fn bytes(&self) -> u64 {
        (self.pixels.capacity() + self.scratch.capacity()) as u64
    }

    /// Reads `encoded` (a JPEG or PNG file's bytes) as an importer takes it: its header, and
    /// then every pixel, at its own channel count (gray stays gray), so that what an import
    /// accepts is what training can decode. Returns the header an image feature stores.
    pub(crate) fn check(&mut self, encoded: &[u8]) -> Result<ImageInfo, String> {
        let info = ImageInfo::probe(encoded)?;
        let channels = if info.channels >= 3 { 3 } else { 1 };
        self.decode(&info, encoded, channels)?;
        Ok(info)
    }

    /// Decodes `encoded`, whose stored header is `info`, into `channels` (1 or 3) per pixel.
    /// An error says what is wrong: it does not decode, or decodes to another size than its
    /// header says. Nothing a decoder does on any bytes panics out of here.
    pub(crate) fn decode(
        &mut self,
        info: &ImageInfo,
        encoded: &[u8],
        channels: usize,
    ) -> Result<Pixels<'_>, String> {
        let decoded =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match info.format {
                ImageFormat::Jpeg => self.jpeg(encoded, channels),
                ImageFormat::Png => self.png(encoded, channels),
            }))
            .unwrap_or_else(|_| Err("does not decode (the decoder failed)".into()))?;
        let (width, height) = decoded;
        if (width, height) != (info.width, info.height) {
            return Err(format!(
                "decodes to {width}x{height} pixels, but was recorded as {}x{}",
                info.width, info.height
            ));
        }
        let len = width as usize * height as usize * channels;
        Ok(Pixels { data: &self.pixels[..len], width, height, channels })
    }

    fn jpeg(&mut self, encoded: &[u8], channels: usize) -> Result<(u32, u32), String> {
        let fail = |e: &dyn std::fmt::Display| format!("does not decode as JPEG: {e}");
        let mut decoder = JpegDecoder::new(ZCursor::new(encoded));
        decoder.decode_headers().map_err(|e| fail(&e))?;
        // zune-jpeg gives the luma of YCbCr and gray images directly, but CMYK and YCCK ones
        // only as RGB, made gray here.
        let four = decoder.input_colorspace().is_some_and(|c| c.num_components() == 4);
        let luma_here = channels == 1 && four;
        let out = if channels == 1 && !four { ColorSpace::Luma } else { ColorSpace::RGB };
        let options = DecoderOptions::default()
            .jpeg_set_out_colorspace(out)
            .set_strict_mode(true)
            .set_max_width(1 << 16)
            .set_max_height(1 << 16);
        decoder.set_options(options);
        let (width, height) = decoder.dimensions().unwrap_or_default();
        check_pixels(width as u64 * height as u64)?;
        let size = decoder.output_buffer_size().unwrap_or(0);
        let target = if luma_here { &mut self.scratch } else { &mut self.pixels };
        decoder.decode_into(grow(target, size)).map_err(|e| fail(&e))?;
        if luma_here {
            let gray = grow(&mut self.pixels, width * height);
            convert_channels(&self.scratch[..width * height * 3], 3, gray, 1);
        }
        let orientation = decoder.exif().map_or(1, |exif| exif_orientation(exif));
        let (w, h) = (width as u32, height as u32);
        Ok(self.orient(w, h, channels, orientation))
    }

    fn png(&mut self, encoded: &[u8], channels: usize) -> Result<(u32, u32), String> {
        let fail = |e: png::DecodingError| format!("does not decode as PNG: {e}");
        let mut decoder = png::Decoder::new_with_limits(
            Cursor::new(encoded),
            // Pixels are bounded by the header check below instead.
            png::Limits { bytes: usize::MAX },
        );
        decoder.set_transformations(png::Transformations::normalize_to_color8());
        let mut reader = decoder.read_info().map_err(fail)?;
        let (width, height) = (reader.info().width, reader.info().height);
        check_pixels(u64::from(width) * u64::from(height))?;
        let size = reader.output_buffer_size().ok_or("is too large to decode")?;
        let frame = reader.next_frame(grow(&mut self.scratch, size)).map_err(fail)?;
        let have = frame.color_type.samples();
        let pixels = width as usize * height as usize;
        let out = grow(&mut self.pixels, pixels * channels);
        convert_channels(&self.scratch[..pixels * have], have, out, channels);
        Ok((width, height))
    }

    /// Applies EXIF `orientation` (1 to 8) to the decoded `width x height` pixels.
    fn orient(&mut self, width: u32, height: u32, channels: usize, orientation: u16) -> (u32, u32) {
        if !(2..=8).contains(&orientation) {
            return (width, height);
        }
        let (w, h) = (width as usize, height as usize);
        let swapped = orientation >= 5;
        let (ow, oh) = if swapped { (h, w) } else { (w, h) };
        grow(&mut self.scratch, w * h * channels);
        for y in 0..oh {
            for x in 0..ow {
                // Where displayed pixel (x, y) is stored.
                let (sx, sy) = match orientation {
                    2 => (w - 1 - x, y),
                    3 => (w - 1 - x, h - 1 - y),
                    4 => (x, h - 1 - y),
                    5 => (y, x),
                    6 => (y, h - 1 - x),
                    7 => (w - 1 - y, h - 1 - x),
                    _ => (w - 1 - y, x),
                };
                let (to, from) = ((y * ow + x) * channels, (sy * w + sx) * channels);
                self.scratch[to..to + channels]
                    .copy_from_slice(&self.pixels[from..from + channels]);
            }
        }
        std::mem::swap(&mut self.pixels, &mut self.scratch);
        (ow as u32, oh as u32)
    }
}

/// The first `len` bytes of `buffer`, which only ever grows: a smaller image after a larger
/// one costs no zeroing of what the larger one left.
fn grow(buffer: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buffer.len() < len {
        buffer.resize(len, 0);
    }
    &mut buffer[..len]
}

fn check_pixels(pixels: u64) -> Result<(), String> {
    if pixels > MAX_PIXELS {
        return Err(format!(
            "has {pixels} pixels, more than the {MAX_PIXELS} an image may have (a decompression bomb?)"
        ));
    }
    Ok(())
}

/// `have`-channel 8-bit pixels (1 gray, 2 gray-alpha, 3 RGB, 4 RGBA) as `want` (1 or 3).
fn convert_channels(src: &[u8], have: usize, out: &mut [u8], want: usize) {
    let luma = |p: &[u8]| {
        ((u32::from(p[0]) * 299 + u32::from(p[1]) * 587 + u32::from(p[2]) * 114 + 500) / 1000) as u8
    };
    let pixels = src.chunks_exact(have).zip(out.chunks_exact_mut(want));
    match (have, want) {
        (1 | 2, 1) => pixels.for_each(|(p, o)| o[0] = p[0]),
        (1 | 2, _) => pixels.for_each(|(p, o)| o.fill(p[0])),
        (_, 1) => pixels.for_each(|(p, o)| o[0] = luma(p)),
        _ => pixels.for_each(|(p, o)| o.copy_from_slice(&p[..3])),
    }
}

/// The headers of a JPEG: its displayed size (an EXIF orientation of 5 to 8 swaps width and
/// height) and its channels.
pub(crate) fn jpeg_info(bytes: &[u8]) -> Result<ImageInfo, String> {
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
pub(crate) fn png_info(bytes: &[u8]) -> Result<ImageInfo, String> {
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
fn exif_orientation(exif: &[u8]) -> u16 {
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
    fn channels_convert_as_pil_does() {
        let mut out = [0u8; 6];
        convert_channels(&[10, 255, 20, 0], 2, &mut out, 3);
        assert_eq!(out, [10, 10, 10, 20, 20, 20]);
        let mut gray = [0u8; 2];
        convert_channels(&[255, 0, 0, 9, 0, 0, 255, 9], 4, &mut gray, 1);
        assert_eq!(gray, [76, 29]);
    }

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

    #[test]
    fn orientations_map_every_pixel_where_it_is_displayed() {
        // A 3x2 image of pixel values 0..6, one channel.
        let stored: Vec<u8> = (0..6).collect();
        let cases: [(u16, (u32, u32), &[u8]); 8] = [
            (1, (3, 2), &[0, 1, 2, 3, 4, 5]),
            (2, (3, 2), &[2, 1, 0, 5, 4, 3]),
            (3, (3, 2), &[5, 4, 3, 2, 1, 0]),
            (4, (3, 2), &[3, 4, 5, 0, 1, 2]),
            (5, (2, 3), &[0, 3, 1, 4, 2, 5]),
            (6, (2, 3), &[3, 0, 4, 1, 5, 2]),
            (7, (2, 3), &[5, 2, 4, 1, 3, 0]),
            (8, (2, 3), &[2, 5, 1, 4, 0, 3]),
        ];
        for (orientation, size, displayed) in cases {
            let mut decoder = Decoder { pixels: stored.clone(), scratch: Vec::new() };
            assert_eq!(decoder.orient(3, 2, 1, orientation), size, "{orientation}");
            assert_eq!(decoder.pixels, displayed, "{orientation}");
        }
    }
}
