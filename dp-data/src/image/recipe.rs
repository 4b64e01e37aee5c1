//! Which part of each image training and evaluation samples are cut from, as one choice, with
//! a default by the samples' size as the field's recipes have it. Photographs train on
//! torchvision's `RandomResizedCrop` and evaluate on the centre (ImageNet's recipe); small
//! pictures (CIFAR-sized) train on the whole image shifted by a few pixels (a padded random
//! crop) and evaluate on the whole image (CIFAR's recipe): an 8% crop of a 32-pixel picture
//! keeps a stroke or two of its subject, and nothing a model can learn the class from.

use serde::{Deserialize, Serialize};

use super::ImageInput;
use super::crop::ImageCrop;

/// How samples are cut from encoded images, spelled `resized[:MIN_SCALE]`, `pad:N`, `center`
/// or `none` in configs and on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CropPolicy {
    /// `resized[:MIN_SCALE]`: training samples are random resized crops of `min_scale` to all
    /// of the image's area, of aspect 3/4 to 4/3 (torchvision's `RandomResizedCrop`, whose
    /// least area is 0.08); evaluation samples the centre, 7/8 of the shorter side.
    Resized {
        /// The least fraction of the image's area a crop takes.
        min_scale: f32,
    },
    /// `pad:N`: training samples are the whole image shifted by up to N pixels each way, the
    /// gap filled with zeros (after scaling: the mean); evaluation samples the whole image.
    Pad(usize),
    /// `center`: the centre, 7/8 of the shorter side, in training and evaluation alike.
    Center,
    /// `none`: the whole image, in training and evaluation alike.
    Whole,
}

impl CropPolicy {
    /// The largest sample side that counts as a small picture (CIFAR's 32, Tiny ImageNet's 64).
    pub const SMALL_SIDE: usize = 64;
    /// `RandomResizedCrop`'s least area.
    pub const MIN_SCALE: f32 = 0.08;

    /// The default for samples of `side` pixels: a padded crop of an eighth of the side for
    /// small pictures (CIFAR's 4 pixels at 32), random resized crops for larger ones.
    pub fn for_side(side: usize) -> Self {
        match side <= Self::SMALL_SIDE {
            true => CropPolicy::Pad((side / 8).max(1)),
            false => CropPolicy::Resized { min_scale: Self::MIN_SCALE },
        }
    }

    /// Training's samples of `size x size` and `channels`, unflipped (flips are augmentations
    /// of their own), and before the padded crop's shift ([`CropPolicy::padding`]).
    pub fn train(self, size: usize, channels: usize) -> ImageInput {
        let crop = match self {
            CropPolicy::Resized { min_scale } => {
                ImageCrop::RandomResized { scale: (min_scale, 1.0), ratio: (0.75, 4.0 / 3.0) }
            }
            CropPolicy::Pad(_) | CropPolicy::Whole => ImageCrop::Whole,
            CropPolicy::Center => ImageCrop::EVAL,
        };
        ImageInput { height: size, width: size, channels, crop, flip: false }
    }

    /// Evaluation's (and prediction's) samples of `size x size` and `channels`.
    pub fn eval(self, size: usize, channels: usize) -> ImageInput {
        let crop = match self {
            CropPolicy::Resized { .. } | CropPolicy::Center => ImageCrop::EVAL,
            CropPolicy::Pad(_) | CropPolicy::Whole => ImageCrop::Whole,
        };
        ImageInput { height: size, width: size, channels, crop, flip: false }
    }

    /// The largest shift of a padded crop, which the training pipeline applies to each sample
    /// once made (as a `RandomCrop` transform).
    pub fn padding(self) -> Option<usize> {
        match self {
            CropPolicy::Pad(padding) => Some(padding),
            _ => None,
        }
    }

    /// Whether it can cut samples of `side` pixels; the error says why not.
    pub fn check(self, side: usize) -> Result<(), String> {
        match self {
            CropPolicy::Resized { min_scale } if !(min_scale > 0.0 && min_scale <= 1.0) => {
                Err(format!("resized:{min_scale}: the least area must be in (0, 1]"))
            }
            CropPolicy::Pad(padding) if padding == 0 || padding >= side => Err(format!(
                "pad:{padding}: the shift must be 1 to {} pixels for {side}x{side} samples",
                side.saturating_sub(1)
            )),
            _ => Ok(()),
        }
    }

    /// What it does, in words, for a run's report.
    pub fn describe(self) -> String {
        match self {
            CropPolicy::Resized { min_scale } => format!(
                "random resized crops of {}-100% of the area, the centre at evaluation",
                min_scale * 100.0
            ),
            CropPolicy::Pad(padding) => {
                format!("the whole image shifted by up to {padding} px, whole at evaluation")
            }
            CropPolicy::Center => "the centre (7/8 of the shorter side)".into(),
            CropPolicy::Whole => "the whole image, uncropped".into(),
        }
    }
}

impl std::fmt::Display for CropPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CropPolicy::Resized { min_scale } => write!(f, "resized:{min_scale}"),
            CropPolicy::Pad(padding) => write!(f, "pad:{padding}"),
            CropPolicy::Center => write!(f, "center"),
            CropPolicy::Whole => write!(f, "none"),
        }
    }
}

impl std::str::FromStr for CropPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let wrong = || format!("`{text}` is not resized[:MIN_SCALE], pad:N, center or none");
        let policy = match text.split_once(':') {
            None if text == "resized" => CropPolicy::Resized { min_scale: Self::MIN_SCALE },
            None if text == "center" => CropPolicy::Center,
            None if text == "none" => CropPolicy::Whole,
            Some(("resized", scale)) => {
                CropPolicy::Resized { min_scale: scale.parse().map_err(|_| wrong())? }
            }
            Some(("pad", padding)) => CropPolicy::Pad(padding.parse().map_err(|_| wrong())?),
            _ => return Err(wrong()),
        };
        // Sizes are checked against the samples' side when a run knows it; what needs no
        // side is checked here, where the spelling is.
        policy.check(usize::MAX)?;
        Ok(policy)
    }
}

impl TryFrom<String> for CropPolicy {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl From<CropPolicy> for String {
    fn from(policy: CropPolicy) -> String {
        policy.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_pictures_default_to_a_padded_crop_and_photographs_to_random_resized_crops() {
        assert_eq!(CropPolicy::for_side(32), CropPolicy::Pad(4));
        assert_eq!(CropPolicy::for_side(16), CropPolicy::Pad(2));
        assert_eq!(CropPolicy::for_side(8), CropPolicy::Pad(1));
        assert_eq!(CropPolicy::for_side(64), CropPolicy::Pad(8));
        assert_eq!(CropPolicy::for_side(128), CropPolicy::Resized { min_scale: 0.08 });
        assert_eq!(CropPolicy::for_side(224), CropPolicy::Resized { min_scale: 0.08 });
        // A padded crop samples the whole image, and evaluation sees the whole image too.
        let pad = CropPolicy::Pad(4);
        assert_eq!(
            (pad.train(32, 3).crop, pad.eval(32, 3).crop),
            (ImageCrop::Whole, ImageCrop::Whole)
        );
        assert_eq!(pad.padding(), Some(4));
        let resized = CropPolicy::for_side(224);
        assert_eq!(resized.train(224, 3).crop, ImageCrop::TRAIN);
        assert_eq!((resized.eval(224, 3).crop, resized.padding()), (ImageCrop::EVAL, None));
        assert!(!resized.train(224, 3).flip, "flips are augmentations of their own");
    }

    #[test]
    fn policies_read_back_as_they_are_spelled_and_bad_ones_say_why() {
        for text in ["resized:0.08", "resized:0.5", "pad:4", "center", "none"] {
            assert_eq!(text.parse::<CropPolicy>().unwrap().to_string(), text);
        }
        assert_eq!("resized".parse(), Ok(CropPolicy::Resized { min_scale: 0.08 }));
        for bad in ["pad:0", "pad:x", "resized:0", "resized:1.5", "random", "pad"] {
            let error = bad.parse::<CropPolicy>().unwrap_err();
            assert!(error.contains(bad.split(':').next().unwrap()), "{bad}: {error}");
        }
        let error = CropPolicy::Pad(8).check(8).unwrap_err();
        assert!(error.contains("1 to 7 pixels for 8x8"), "{error}");
    }
}
