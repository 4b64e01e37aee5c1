//! Colour conversions the decoders do not: RGB to gray, CMYK to RGB or gray.

/// The ITU-R 601 luma of an RGB pixel, rounded, as PIL's `convert("L")`.
pub(crate) fn luma(p: &[u8]) -> u8 {
    ((u32::from(p[0]) * 299 + u32::from(p[1]) * 587 + u32::from(p[2]) * 114 + 500) / 1000) as u8
}

/// CMYK pixels (4 bytes each, inverted as Adobe stores them when `inverted`) as RGB or gray
/// (`channels`), in place from the front, as Pillow converts them: `R = (255 - C) (255 - K)
/// / 255` on uninverted values.
pub(crate) fn cmyk_to(pixels: &mut [u8], channels: usize, inverted: bool) {
    let count = pixels.len() / 4;
    for i in 0..count {
        let p = &pixels[4 * i..4 * i + 4];
        // Each 255 less its ink, as the conversion multiplies them.
        let (c, m, y, k) = match inverted {
            true => (p[0], p[1], p[2], p[3]),
            false => (255 - p[0], 255 - p[1], 255 - p[2], 255 - p[3]),
        };
        let scale = |v: u8| ((u32::from(v) * u32::from(k) + 127) / 255) as u8;
        let rgb = [scale(c), scale(m), scale(y)];
        if channels == 1 {
            pixels[i] = luma(&rgb);
        } else {
            pixels[3 * i..3 * i + 3].copy_from_slice(&rgb);
        }
    }
}
