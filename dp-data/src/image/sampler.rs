//! Making one sample of a stored image: decode (as much as its crop needs), crop, resample.

use super::crop::Region;
#[cfg(feature = "images")]
use super::decode::Decoder;
use super::info::ImageInfo;
use super::input::ImageInput;
#[cfg(feature = "images")]
use super::resample::Resampler;
use crate::rng::Rng;

/// Makes samples of stored images as an [`ImageInput`] says, in buffers it keeps from one
/// image to the next: what a pipeline's worker runs on each record, and what evaluation and
/// prediction run on a dataset in order.
#[derive(Debug, Default)]
pub struct ImageSampler {
    #[cfg(feature = "images")]
    decoder: Decoder,
    #[cfg(feature = "images")]
    resampler: Resampler,
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

    /// Makes the sample of `stored` (an image feature's value) that `input` says into `out`
    /// (`input.elements()` values) as `a * value + b`: plans its crop, and whether it is
    /// flipped, from the stored size with `rng`, decodes it, and resamples the crop. An error
    /// says why the image cannot be made into one (it does not decode, or not to its size, or
    /// this build leaves out the `images` feature that decodes).
    pub fn sample(
        &mut self,
        stored: &[u8],
        input: &ImageInput,
        affine: (f32, f32),
        rng: &mut Rng,
        out: &mut [f32],
    ) -> Result<(), String> {
        let (info, encoded) = ImageInfo::stored(stored)?;
        let region = input.crop.region(info.width, info.height, rng);
        let flip = input.flip && rng.next_u64() >> 63 == 1;
        self.render(&info, encoded, input, (region, flip), affine, out)
    }
}

#[cfg(feature = "images")]
impl ImageSampler {
    /// Bytes its buffers hold now.
    pub fn bytes(&self) -> u64 {
        self.decoder.bytes() + self.resampler.bytes()
    }

    /// Decodes `encoded` and resamples its crop `region`, mirrored when `flip`, into `out`.
    fn render(
        &mut self,
        info: &ImageInfo,
        encoded: &[u8],
        input: &ImageInput,
        (region, flip): (Region, bool),
        affine: (f32, f32),
        out: &mut [f32],
    ) -> Result<(), String> {
        let size = (input.height, input.width);
        let (pixels, area) =
            self.decoder.decode_region(info, encoded, input.channels, region, size)?;
        self.resampler.resample(&pixels, area, size, flip, affine, &mut out[..input.elements()])
    }
}

/// Without the `images` feature a sampler has no decoder: it holds nothing, and refuses
/// every image, saying so.
#[cfg(not(feature = "images"))]
impl ImageSampler {
    /// Bytes its buffers hold now.
    pub fn bytes(&self) -> u64 {
        0
    }

    fn render(
        &mut self,
        _: &ImageInfo,
        _: &[u8],
        _: &ImageInput,
        _: (Region, bool),
        _: (f32, f32),
        _: &mut [f32],
    ) -> Result<(), String> {
        Err(super::IMAGES_LEFT_OUT.into())
    }
}
