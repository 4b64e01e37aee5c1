//! Encoded images (JPEG and PNG) as a feature kind: each record's bytes kept as they were
//! encoded, behind a small header with the image's format, size and channels recorded at
//! import, so that crops are planned without decoding. The pipeline's workers decode them
//! ([`decode`]; JPEG only as far as the crop needs, [`jpeg`]), crop them ([`crop`], as a [`recipe`] chooses) and resample them to the training
//! size ([`resample`]).

#[cfg(feature = "images")]
pub(crate) mod area;
#[cfg(feature = "images")]
pub(crate) mod color;
pub(crate) mod counts;
pub(crate) mod crop;
#[cfg(all(test, feature = "images"))]
mod crop_checks;
#[cfg(feature = "images")]
pub(crate) mod decode;
#[cfg(feature = "images")]
pub(crate) mod exif;
#[cfg(feature = "images")]
pub(crate) mod headers;
pub(crate) mod info;
pub(crate) mod input;
#[cfg(feature = "images")]
pub(crate) mod jpeg;
pub(crate) mod recipe;
#[cfg(feature = "images")]
pub(crate) mod resample;
pub(crate) mod sampler;

pub use counts::ImageCounts;
#[cfg(feature = "images")]
pub use headers::stored_image;
pub use info::{ImageFormat, ImageInfo, MAX_PIXELS};
pub use input::ImageInput;
pub use sampler::ImageSampler;

/// Why an image is not decoded in a build without the `images` feature.
#[cfg(not(feature = "images"))]
pub(crate) const IMAGES_LEFT_OUT: &str = "cannot be decoded: this build of dp-data leaves out its `images` feature, which decodes JPEG and PNG";
