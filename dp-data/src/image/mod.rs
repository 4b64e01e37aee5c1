//! Encoded images (JPEG and PNG) as a feature kind: each record's bytes kept as they were
//! encoded, behind a small header with the image's format, size and channels recorded at
//! import, so that crops are planned without decoding. The pipeline's workers decode them
//! ([`decode`]), crop them ([`crop`], as a [`recipe`] chooses) and resample them to the training
//! size ([`resample`]).

pub(crate) mod crop;
pub(crate) mod decode;
pub(crate) mod recipe;
pub(crate) mod resample;

use serde::{Deserialize, Serialize};

use crop::ImageCrop;

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
    /// Reads an encoded image's headers. An error says what is wrong: not a JPEG or PNG,
    /// truncated headers, a zero size, more pixels than [`MAX_PIXELS`].
    pub fn probe(bytes: &[u8]) -> Result<Self, String> {
        let info = match ImageFormat::sniff(bytes) {
            Some(ImageFormat::Jpeg) => decode::jpeg_info(bytes)?,
            Some(ImageFormat::Png) => decode::png_info(bytes)?,
            None => {
                let start = &bytes[..bytes.len().min(8)];
                return Err(format!("is not a JPEG or PNG image (it starts {start:02x?})"));
            }
        };
        info.check()?;
        Ok(info)
    }

    fn check(&self) -> Result<(), String> {
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

/// `encoded` (a JPEG or PNG file's bytes) as a dataset stores it, the value a writer takes for
/// an image feature ([`crate::Value::Bytes`]); an error says why it is not an image.
pub fn stored_image(encoded: &[u8]) -> Result<Vec<u8>, String> {
    let info = ImageInfo::probe(encoded)?;
    let mut out = Vec::new();
    info.store(encoded, &mut out);
    Ok(out)
}

/// How a pipeline makes an image input into `x`: each image decoded, cut by `crop`,
/// resampled to `height x width`, mirrored left to right half the time when `flip`, and laid
/// out `[channels, height, width]`, its values `0..=255` (a leading affine transform, such as
/// [`crate::Normalize`], is folded in).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ImageInput {
    /// Output height in pixels.
    pub height: usize,
    /// Output width in pixels.
    pub width: usize,
    /// Output channels: 1 (gray) or 3 (RGB).
    pub channels: usize,
    /// Which part of each image a sample is made from.
    pub crop: ImageCrop,
    /// Mirror each sample left to right with probability 1/2.
    pub flip: bool,
}

impl ImageInput {
    /// Training's: `size x size` samples from torchvision's `RandomResizedCrop`, flipped at
    /// random.
    pub fn train(size: usize, channels: usize) -> Self {
        ImageInput { height: size, width: size, channels, crop: ImageCrop::TRAIN, flip: true }
    }

    /// Evaluation's: the centre (224 of 256) resampled to `size x size`.
    pub fn eval(size: usize, channels: usize) -> Self {
        ImageInput { height: size, width: size, channels, crop: ImageCrop::EVAL, flip: false }
    }

    /// Values per sample.
    pub fn elements(&self) -> usize {
        self.channels * self.height * self.width
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if !(1..=MAX_SIDE).contains(&self.height) || !(1..=MAX_SIDE).contains(&self.width) {
            return Err(format!(
                "an image size of {}x{} is outside 1..={MAX_SIDE}",
                self.height, self.width
            ));
        }
        if !matches!(self.channels, 1 | 3) {
            return Err(format!("{} image channels: 1 (gray) or 3 (RGB)", self.channels));
        }
        self.crop.check()
    }
}

/// Makes samples of stored images as an [`ImageInput`] says, in buffers it keeps from one
/// image to the next: what a pipeline's worker runs on each record, and what evaluation and
/// prediction run on a dataset in order.
#[derive(Debug, Default)]
pub struct ImageSampler {
    decoder: decode::Decoder,
    resampler: resample::Resampler,
}

impl ImageSampler {
    /// A sampler whose buffers grow to the largest image it meets.
    pub fn new() -> Self {
        Self::default()
    }

    /// What its buffers grow to for images of at most `pixels` pixels sampled as `input`,
    /// estimated from above: the decoded pixels (3 bytes each), the decoder's scratch (a
    /// PNG's 4 bytes a pixel, or the rotated copy), the resampler's intermediate rows (3
    /// bytes a pixel when shrinking, the output's width when enlarging) and its output.
    pub fn bytes_for(pixels: u64, input: &ImageInput) -> u64 {
        pixels.saturating_mul(10).saturating_add(4 * input.elements() as u64)
    }

    /// Bytes its buffers hold now.
    pub fn bytes(&self) -> u64 {
        self.decoder.bytes() + self.resampler.bytes()
    }

    /// Makes the sample of `stored` (an image feature's value) that `input` says into `out`
    /// (`input.elements()` values) as `a * value + b`: plans its crop, and whether it is
    /// flipped, from the stored size with `rng`, decodes it, and resamples the crop. An error
    /// says why the image cannot be made into one (it does not decode, or not to its size).
    pub fn sample(
        &mut self,
        stored: &[u8],
        input: &ImageInput,
        affine: (f32, f32),
        rng: &mut crate::Rng,
        out: &mut [f32],
    ) -> Result<(), String> {
        let (info, encoded) = ImageInfo::stored(stored)?;
        let region = input.crop.region(info.width, info.height, rng);
        let flip = input.flip && rng.next_u64() >> 63 == 1;
        let pixels = self.decoder.decode(&info, encoded, input.channels)?;
        let size = (input.height, input.width);
        self.resampler.resample(&pixels, region, size, flip, affine, &mut out[..input.elements()])
    }
}

/// The largest side of an image input.
const MAX_SIDE: usize = 4096;

/// Counts over an image feature's records, kept in the manifest: what the trainer picks a
/// channel count from and `data inspect` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ImageCounts {
    /// Images counted.
    pub images: u64,
    /// JPEG images among them.
    pub jpeg: u64,
    /// PNG images among them.
    pub png: u64,
    /// Images with color (3 or 4 channels) among them.
    pub color: u64,
    /// The smallest and largest width.
    pub width: (u32, u32),
    /// The smallest and largest height.
    pub height: (u32, u32),
    /// The shorter side's count per power-of-two bucket: `sides[k]` images have a shorter
    /// side in `2^k..2^(k+1)`.
    pub sides: Vec<u64>,
    /// Encoded bytes over all images.
    pub bytes: u64,
    /// The most pixels of one image: what a worker's decode buffers grow to.
    #[serde(default)]
    pub most_pixels: u64,
}

impl ImageCounts {
    /// Counts one image of `encoded` bytes.
    pub(crate) fn add(&mut self, info: &ImageInfo, encoded: usize) {
        let first = self.images == 0;
        self.images += 1;
        match info.format {
            ImageFormat::Jpeg => self.jpeg += 1,
            ImageFormat::Png => self.png += 1,
        }
        self.color += u64::from(info.channels >= 3);
        let range =
            |(lo, hi): (u32, u32), v: u32| if first { (v, v) } else { (lo.min(v), hi.max(v)) };
        self.width = range(self.width, info.width);
        self.height = range(self.height, info.height);
        let bucket = info.width.min(info.height).ilog2() as usize;
        if self.sides.len() <= bucket {
            self.sides.resize(bucket + 1, 0);
        }
        self.sides[bucket] += 1;
        self.bytes += encoded as u64;
        self.most_pixels = self.most_pixels.max(u64::from(info.width) * u64::from(info.height));
    }

    /// The channels a model sees: 3 when any image has color, else 1.
    pub fn channels(&self) -> usize {
        if self.color > 0 { 3 } else { 1 }
    }

    /// The side of the square samples a model takes by default: the typical (median)
    /// shorter side, rounded down to a power of two, between 8 and 224 (torchvision's
    /// ImageNet size): 32 for CIFAR-sized images, 224 for photographs.
    pub fn sample_size(&self) -> usize {
        let half = self.images.div_ceil(2);
        let mut seen = 0;
        let bucket = self.sides.iter().position(|&n| {
            seen += n;
            seen >= half
        });
        (1usize << bucket.unwrap_or(0)).clamp(8, 224)
    }
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

    #[test]
    fn counts_gather_sizes_formats_and_color() {
        let image = |width, height, channels| ImageInfo {
            format: ImageFormat::Jpeg,
            width,
            height,
            channels,
        };
        let mut all = ImageCounts::default();
        for info in [image(300, 200, 3), image(640, 480, 1), image(40, 1000, 3)] {
            all.add(&info, 10);
        }
        assert_eq!((all.images, all.jpeg, all.png, all.bytes), (3, 3, 0, 30));
        assert_eq!(
            (all.width, all.height, all.color, all.channels()),
            ((40, 640), (200, 1000), 2, 3)
        );
        assert_eq!(all.sides, vec![0, 0, 0, 0, 0, 1, 0, 1, 1]);
        // The median shorter side is 200 (in 128..256); photographs of 2000 are cut to 224.
        assert_eq!(all.sample_size(), 128);
        let mut large = ImageCounts::default();
        large.add(&image(3000, 2000, 3), 1);
        assert_eq!(large.sample_size(), 224);
        let mut gray = ImageCounts::default();
        gray.add(&image(8, 8, 1), 1);
        assert_eq!(gray.channels(), 1);
    }
}
