//! The augmentations a config lists, as it spells them (`flip-h`, `flip-v`, `crop:PAD`).

use dp_data::CropPolicy;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A random change to the training inputs (images), drawn per record from the run's seed:
/// `flip-h`, `flip-v` (each with probability 1/2) or `crop:PAD` (pad with zeros, crop a
/// random window of the original size), as configs and the command line spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Augmentation {
    /// Mirror left to right.
    FlipH,
    /// Mirror top to bottom.
    FlipV,
    /// Pad by this many pixels and crop back.
    Crop(usize),
}

impl Augmentation {
    /// The default for encoded images sampled at `side` pixels: flipped left to right when
    /// they are photographs (ImageNet's recipe), as they are when small pictures, which are as
    /// often digits, letters and signs (that a mirror turns into other shapes) as scenes: on
    /// tinted digits of 24-40 pixels flips cost the default `cnn` 11 points (82.0% against
    /// 93.0%). CIFAR-like scenes gain a point or two from `flip-h`.
    pub fn defaults_for_images(side: usize) -> Vec<Augmentation> {
        match side > CropPolicy::SMALL_SIDE {
            true => vec![Augmentation::FlipH],
            false => Vec::new(),
        }
    }

    /// The pipeline transform that applies it.
    pub(crate) fn transform(self) -> Box<dyn dp_data::Transform> {
        let flip = |horizontal| dp_data::RandomFlip { horizontal, vertical: !horizontal, p: 0.5 };
        match self {
            Augmentation::FlipH => Box::new(flip(true)),
            Augmentation::FlipV => Box::new(flip(false)),
            Augmentation::Crop(padding) => Box::new(dp_data::RandomCrop { padding }),
        }
    }
}

impl std::fmt::Display for Augmentation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Augmentation::FlipH => write!(f, "flip-h"),
            Augmentation::FlipV => write!(f, "flip-v"),
            Augmentation::Crop(padding) => write!(f, "crop:{padding}"),
        }
    }
}

impl std::str::FromStr for Augmentation {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name.split_once(':') {
            None if name == "flip-h" => Ok(Augmentation::FlipH),
            None if name == "flip-v" => Ok(Augmentation::FlipV),
            Some(("crop", padding)) => match padding.parse() {
                Ok(padding) if padding > 0 => Ok(Augmentation::Crop(padding)),
                _ => Err(Error::config(
                    "augment",
                    format!("`{name}`: the padding must be a positive number of pixels"),
                )),
            },
            _ => {
                Err(Error::config("augment", format!("`{name}` is not flip-h, flip-v or crop:PAD")))
            }
        }
    }
}

impl TryFrom<String> for Augmentation {
    type Error = Error;

    fn try_from(name: String) -> Result<Self> {
        name.parse()
    }
}

impl From<Augmentation> for String {
    fn from(augmentation: Augmentation) -> String {
        augmentation.to_string()
    }
}
