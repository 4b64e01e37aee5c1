//! Decoding a stored image into 8-bit pixels of the channel count a model takes, in buffers a
//! worker keeps from one image to the next. JPEG through libjpeg-turbo (`jpeg.rs`: baseline,
//! progressive, grayscale, CMYK and YCCK; for a crop only what it covers, scaled down in the
//! DCT domain when it is at least twice the sample's size), PNG through `png` (palette,
//! gray-alpha and 16-bit images expanded to 8-bit channels); an EXIF orientation is applied,
//! so that the pixels stand as the photograph was taken. A color image becomes gray by
//! ITU-R 601 luma (as PIL's `convert("L")`); an alpha channel is dropped (as
//! `convert("RGB")`).

use std::io::Cursor;

use super::area::{Area, stored_pixel};
use super::color::luma;
use super::crop::Region;
use super::info::{ImageFormat, ImageInfo, check_pixels};
use super::jpeg::{self, Window};

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

    /// Decodes `region` (of the displayed image) of `encoded`, whose stored header is
    /// `info`, for a sample of `size` (height, width): a JPEG only as far as the region
    /// needs, at the smallest DCT scale (1/2, 1/4, 1/8) that leaves the region at least
    /// `size`; anything else whole. Returns the pixels and where the region lies in them.
    pub(crate) fn decode_region(
        &mut self,
        info: &ImageInfo,
        encoded: &[u8],
        channels: usize,
        region: Region,
        size: (usize, usize),
    ) -> Result<(Pixels<'_>, Area), String> {
        if info.format != ImageFormat::Jpeg {
            return Ok((self.decode(info, encoded, channels)?, region.into()));
        }
        let region = Area::from(region);
        let plan = |header: &jpeg::Header| Some(window(header, region, size));
        let (header, decoded) = jpeg::decode(encoded, plan, channels, &mut self.pixels)?;
        let displayed = header.displayed_size();
        if displayed != (info.width, info.height) {
            return Err(format!(
                "decodes to {}x{} pixels, but was recorded as {}x{}",
                displayed.0, displayed.1, info.width, info.height
            ));
        }
        let (o, stored) = (header.orientation, (f64::from(header.width), f64::from(header.height)));
        let area = region.to_stored(o, stored).scaled(decoded.denom, (decoded.x, decoded.y));
        let (width, height) = (decoded.width, decoded.height);
        let area = area.to_displayed(o, (f64::from(width), f64::from(height)));
        let (w, h) = self.orient(width, height, channels, o);
        let len = w as usize * h as usize * channels;
        Ok((Pixels { data: &self.pixels[..len], width: w, height: h, channels }, area))
    }

    /// Decodes a JPEG whole, oriented.
    fn jpeg(&mut self, encoded: &[u8], channels: usize) -> Result<(u32, u32), String> {
        let (header, decoded) = jpeg::decode(encoded, |_| None, channels, &mut self.pixels)?;
        Ok(self.orient(decoded.width, decoded.height, channels, header.orientation))
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
                let (sx, sy) = stored_pixel(orientation, (w, h), (x, y));
                let (to, from) = ((y * ow + x) * channels, (sy * w + sx) * channels);
                self.scratch[to..to + channels]
                    .copy_from_slice(&self.pixels[from..from + channels]);
            }
        }
        std::mem::swap(&mut self.pixels, &mut self.scratch);
        (ow as u32, oh as u32)
    }
}

/// The window of a JPEG with `header` to decode for a sample of `size` (height, width) cut
/// from `region` of the displayed image: the region in stored pixels, at the smallest DCT
/// scale (1/2, 1/4, 1/8) that leaves it at least `size`.
fn window(header: &jpeg::Header, region: Area, size: (usize, usize)) -> Window {
    let o = header.orientation;
    let stored = (f64::from(header.width), f64::from(header.height));
    let area = region.to_stored(o, stored);
    let (height, width) =
        if o >= 5 { (size.1 as f64, size.0 as f64) } else { (size.0 as f64, size.1 as f64) };
    let mut denom = 1;
    while denom < 8
        && area.width / f64::from(2 * denom) >= width
        && area.height / f64::from(2 * denom) >= height
    {
        denom *= 2;
    }
    // The resampling filter reaches past the region's edges by up to its step (one output
    // pixel's span, plus the bilinear taps): decoded too, as a whole decode has them, so
    // that the edges come out the same.
    let margin_x = (area.width / width).ceil() + 2.0;
    let margin_y = (area.height / height).ceil() + 2.0;
    Window {
        x0: (area.x - margin_x).max(0.0).floor() as u32,
        y0: (area.y - margin_y).max(0.0).floor() as u32,
        x1: (area.x + area.width + margin_x).min(stored.0).ceil() as u32,
        y1: (area.y + area.height + margin_y).min(stored.1).ceil() as u32,
        denom,
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

/// `have`-channel 8-bit pixels (1 gray, 2 gray-alpha, 3 RGB, 4 RGBA) as `want` (1 or 3).
fn convert_channels(src: &[u8], have: usize, out: &mut [u8], want: usize) {
    let pixels = src.chunks_exact(have).zip(out.chunks_exact_mut(want));
    match (have, want) {
        (1 | 2, 1) => pixels.for_each(|(p, o)| o[0] = p[0]),
        (1 | 2, _) => pixels.for_each(|(p, o)| o.fill(p[0])),
        (_, 1) => pixels.for_each(|(p, o)| o[0] = luma(p)),
        _ => pixels.for_each(|(p, o)| o.copy_from_slice(&p[..3])),
    }
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
