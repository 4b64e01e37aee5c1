//! Counts over an image feature's records, kept in the manifest.

use serde::{Deserialize, Serialize};

use super::info::{ImageFormat, ImageInfo};

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
