//! How a pipeline makes an image feature into its input `x`: the size, channels, crop and flip
//! of each sample.

use serde::{Deserialize, Serialize};

use super::crop::ImageCrop;

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

/// The largest side of an image input.
const MAX_SIDE: usize = 4096;
