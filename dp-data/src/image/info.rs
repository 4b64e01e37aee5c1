//! What a stored image is: its format, size and channels, kept in a small header in front of
//! the encoded bytes, so that crops are planned and datasets checked without decoding.

use serde::{Deserialize, Serialize};

/// The most pixels an image may have: PIL's limit (`Image.MAX_IMAGE_PIXELS`), past which an
/// image is taken for a decompression bomb (a small file that decodes to gigabytes).
pub const MAX_PIXELS: u64 = 89_478_485;

/// Bytes of the header in front of each stored image.
pub(crate) const HEADER_LEN: usize = 12;

/// How an image is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// JPEG (JFIF or EXIF; baseline or progressive).
    Jpeg,
    /// PNG (any bit depth and color type).
    Png,
}

impl ImageFormat {
    // Only images probed by their headers are stored, which the `images` feature does.
    #[cfg_attr(not(feature = "images"), allow(dead_code))]
    fn code(self) -> u8 {
        match self {
            ImageFormat::Jpeg => 1,
            ImageFormat::Png => 2,
        }
    }

    fn of_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(ImageFormat::Jpeg),
            2 => Some(ImageFormat::Png),
            _ => None,
        }
    }

    /// The format `bytes` start like, from their signature.
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(ImageFormat::Jpeg)
        } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(ImageFormat::Png)
        } else {
            None
        }
    }
}

/// What an image is, read from its headers without decoding its pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageInfo {
    /// How it is encoded.
    pub format: ImageFormat,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Channels as encoded: 1 (gray), 2 (gray and alpha), 3 (color), 4 (color and alpha, or
    /// CMYK).
    pub channels: u8,
}

impl ImageInfo {
    pub(super) fn check(&self) -> Result<(), String> {
        let pixels = u64::from(self.width) * u64::from(self.height);
        if pixels == 0 {
            return Err(format!(
                "is {}x{} pixels: an image has at least one",
                self.width, self.height
            ));
        }
        if pixels > MAX_PIXELS {
            return Err(format!(
                "is {}x{} pixels, more than the {MAX_PIXELS} an image may have (a decompression bomb?)",
                self.width, self.height
            ));
        }
        if !(1..=4).contains(&self.channels) {
            return Err(format!("has {} channels (1 to 4 expected)", self.channels));
        }
        Ok(())
    }

    /// The image as a dataset stores it: this header, then `encoded` as it is.
    #[cfg_attr(not(feature = "images"), allow(dead_code))]
    pub(crate) fn store(&self, encoded: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.reserve(HEADER_LEN + encoded.len());
        out.extend_from_slice(&[self.format.code(), self.channels, 0, 0]);
        out.extend_from_slice(&self.width.to_le_bytes());
        out.extend_from_slice(&self.height.to_le_bytes());
        out.extend_from_slice(encoded);
    }

    /// The header and the encoded bytes of a stored image, checked as far as the header goes.
    pub(crate) fn stored(bytes: &[u8]) -> Result<(Self, &[u8]), String> {
        let Some((header, encoded)) = bytes.split_first_chunk::<HEADER_LEN>() else {
            return Err(format!("holds {} bytes, fewer than an image's header", bytes.len()));
        };
        let format = ImageFormat::of_code(header[0])
            .ok_or_else(|| format!("names image format {}, which is not one", header[0]))?;
        let u32_at =
            |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let info = ImageInfo { format, channels: header[1], width: u32_at(4), height: u32_at(8) };
        info.check()?;
        Ok((info, encoded))
    }
}

/// Whether an image of `pixels` pixels may be decoded; the error says why not.
#[cfg_attr(not(feature = "images"), allow(dead_code))]
pub(crate) fn check_pixels(pixels: u64) -> Result<(), String> {
    if pixels > MAX_PIXELS {
        return Err(format!(
            "has {pixels} pixels, more than the {MAX_PIXELS} an image may have (a decompression bomb?)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_image_keeps_its_bytes_behind_a_checked_header() {
        let info = ImageInfo { format: ImageFormat::Png, width: 640, height: 480, channels: 3 };
        let mut stored = Vec::new();
        info.store(b"encoded", &mut stored);
        assert_eq!(ImageInfo::stored(&stored).unwrap(), (info, &b"encoded"[..]));
        for (at, byte, what) in [(0, 9, "format"), (1, 7, "channels"), (4, 0, "pixels")] {
            let mut bad = stored.clone();
            bad[at] = byte;
            if what == "pixels" {
                bad[4..8].copy_from_slice(&0u32.to_le_bytes());
            }
            let error = ImageInfo::stored(&bad).unwrap_err();
            assert!(error.contains(what) || error.contains("0x480"), "{what}: {error}");
        }
        assert!(ImageInfo::stored(&stored[..5]).unwrap_err().contains("fewer than"));
        let bomb = ImageInfo { width: 100_000, height: 100_000, ..info };
        bomb.store(b"", &mut stored);
        assert!(ImageInfo::stored(&stored).unwrap_err().contains("decompression bomb"));
    }
}
