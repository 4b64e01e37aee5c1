//! How a run augments its training inputs: the augmentations a config lists (flips, padded
//! crops) and, for encoded images, the crop policy training and evaluation samples are cut by.
//! Both are resolved once, when the run is planned, from what the config says and, where it
//! is silent, from the input: encoded images train on the standard recipe for their size
//! ([`CropPolicy::for_side`], [`Augmentation::defaults_for_images`]); arrays train as they
//! are. The run
//! saves what was resolved, so a resumed run and evaluation from its directory cut their
//! samples the same way.

use dp_data::{CropPolicy, ImageInput, Transform};

use crate::config::{Augmentation, TrainConfig};
use crate::error::{Error, Result};

impl TrainConfig {
    /// What the training samples are made with, in words: the crop policy and the
    /// augmentations.
    pub fn augmentation(&self) -> String {
        describe(self)
    }

    /// The training inputs' augmentations, as pipeline transforms: the crop policy's padded
    /// crop, then the listed augmentations.
    pub fn augmentations(&self) -> Vec<Box<dyn dp_data::Transform>> {
        transforms(self)
    }
}

/// What [`resolve`] needs to know of a run's input.
pub(crate) struct InputKind<'a> {
    /// The feature's name.
    pub(crate) feature: &'a str,
    /// Its samples' shape (`[channels, size, size]` for encoded images).
    pub(crate) shape: &'a [usize],
    /// Encoded images.
    pub(crate) image: bool,
    pub(crate) sparse: bool,
}

/// `config` with its crop policy and augmentations resolved for `input` (see the module's
/// docs); refuses a crop policy on an input that is not encoded images, and either on samples
/// they cannot cut.
pub(crate) fn resolve(mut config: TrainConfig, input: InputKind<'_>) -> Result<TrainConfig> {
    let side = input.image.then(|| input.shape[1]);
    config.crop = match (config.crop, side) {
        (Some(crop), Some(side)) => {
            crop.check(side).map_err(|why| Error::config("crop", why))?;
            Some(crop)
        }
        (None, Some(side)) => Some(CropPolicy::for_side(side)),
        (Some(crop), None) => {
            return Err(Error::config(
                "crop",
                format!(
                    "`{crop}` cuts encoded images (JPEG, PNG); `{}` is an array, which \
                     `augment = [\"crop:PAD\"]` (--augment crop:PAD) shifts instead",
                    input.feature
                ),
            ));
        }
        (None, None) => None,
    };
    let default = side.map_or_else(Vec::new, Augmentation::defaults_for_images);
    let augment = config.augment.get_or_insert(default);
    if input.sparse && !augment.is_empty() {
        return Err(Error::config(
            "augment",
            "a sparse input takes no augmentations (they transform dense images)",
        ));
    }
    for transform in transforms(&config) {
        transform
            .check(input.shape)
            .map_err(|why| Error::config("augment", format!("{}: {why}", transform.describe())))?;
    }
    Ok(config)
}

/// The training inputs' transforms after scaling: the crop policy's padded crop, then the
/// augmentations in the order listed.
pub(crate) fn transforms(config: &TrainConfig) -> Vec<Box<dyn Transform>> {
    let padded = config.crop.and_then(CropPolicy::padding).map(Augmentation::Crop);
    let listed = config.augment.iter().flatten().copied();
    padded.into_iter().chain(listed).map(Augmentation::transform).collect()
}

/// How training (`train`) or evaluation samples an encoded-image input of `shape`
/// (`[channels, size, size]`). A run saved without a crop policy was cut as `resized` cuts.
pub(crate) fn image_input(config: &TrainConfig, shape: &[usize], train: bool) -> ImageInput {
    let crop = config.crop.unwrap_or(CropPolicy::Resized { min_scale: CropPolicy::MIN_SCALE });
    let (channels, size) = (shape[0], shape[1]);
    match train {
        true => crop.train(size, channels),
        false => crop.eval(size, channels),
    }
}

/// What a run's training samples are, in words: the crop and the augmentations.
pub(crate) fn describe(config: &TrainConfig) -> String {
    let listed: Vec<String> = config.augment.iter().flatten().map(|a| a.to_string()).collect();
    let listed = if listed.is_empty() { "no other augmentation".into() } else { listed.join(", ") };
    match config.crop {
        Some(crop) => format!("crop {crop} ({}); {listed}", crop.describe()),
        None => listed,
    }
}
