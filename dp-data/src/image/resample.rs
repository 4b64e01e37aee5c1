//! A crop of a decoded image resampled to the output size with fast_image_resize's SIMD
//! convolution (bilinear, widened by the scale when shrinking: PIL's antialiased resize,
//! which torchvision's transforms use), then laid out planar as a model takes it.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::area::Area;
use super::decode::Pixels;

/// One worker's resampler: fast_image_resize's scratch and the resampled pixels, kept from
/// one image to the next.
#[derive(Default)]
pub(crate) struct Resampler {
    resizer: Resizer,
    resized: Vec<u8>,
}

impl std::fmt::Debug for Resampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resampler").field("resized", &self.resized.len()).finish_non_exhaustive()
    }
}

impl Resampler {
    /// Bytes its own buffer holds (fast_image_resize's intermediate rows are within the
    /// bound of [`super::ImageSampler::bytes_for`], not counted here).
    pub(crate) fn bytes(&self) -> u64 {
        self.resized.capacity() as u64
    }

    /// Resamples `area` of `pixels` to `height x width` and writes it into `out`
    /// (`[channels, height, width]`) as `a * value + b`, mirrored left to right when `flip`.
    pub(crate) fn resample(
        &mut self,
        pixels: &Pixels<'_>,
        area: Area,
        (height, width): (usize, usize),
        flip: bool,
        (a, b): (f32, f32),
        out: &mut [f32],
    ) -> Result<(), String> {
        let channels = pixels.channels;
        self.resize(pixels, area, (height, width))?;
        let plane = width * height;
        let out = &mut out[..channels * plane];
        for (y, row) in self.resized.chunks_exact(width * channels).enumerate() {
            for c in 0..channels {
                let row_out = &mut out[c * plane + y * width..][..width];
                match channels {
                    3 => planar::<3>(row, c, row_out, (a, b)),
                    _ => planar::<1>(row, c, row_out, (a, b)),
                }
                if flip {
                    row_out.reverse();
                }
            }
        }
        Ok(())
    }

    /// Resamples `area` of `pixels` to `height x width`: the resampled pixels, row-major
    /// with channels interleaved, which [`Resampler::resample`] lays out and the image
    /// importer stores or encodes.
    pub(crate) fn resize(
        &mut self,
        pixels: &Pixels<'_>,
        area: Area,
        (height, width): (usize, usize),
    ) -> Result<&[u8], String> {
        let channels = pixels.channels;
        let pixel_type = if channels == 1 { PixelType::U8 } else { PixelType::U8x3 };
        let fail = |e: &dyn std::fmt::Display| format!("cannot be resampled: {e}");
        let source = ImageRef::new(pixels.width, pixels.height, pixels.data, pixel_type)
            .map_err(|e| fail(&e))?;
        self.resized.resize(width * height * channels, 0);
        let mut resized =
            Image::from_slice_u8(width as u32, height as u32, &mut self.resized, pixel_type)
                .map_err(|e| fail(&e))?;
        let Area { x, y, width: w, height: h } = area;
        let options = ResizeOptions::new()
            .crop(x, y, w, h)
            .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
        self.resizer.resize(&source, &mut resized, &options).map_err(|e| fail(&e))?;
        Ok(&self.resized)
    }
}

/// Channel `c` of a row of `C`-channel pixels as `a * value + b`: the channel count a constant,
/// so that the compiler vectorizes the strided reads (with it a variable, they ran one value
/// at a time, 12% of a worker's time on real photographs).
#[inline(always)]
fn planar<const C: usize>(row: &[u8], c: usize, out: &mut [f32], (a, b): (f32, f32)) {
    for (o, pixel) in out.iter_mut().zip(row.chunks_exact(C)) {
        *o = f32::from(pixel[c]) * a + b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::crop::Region;

    #[test]
    fn a_crop_is_resampled_planar_and_flipped_on_request() {
        // 4x2 RGB: red rises left to right, green is the row, blue constant.
        let data: Vec<u8> =
            (0..2u8).flat_map(|y| (0..4u8).flat_map(move |x| [x * 60, y * 100, 7])).collect();
        let pixels = Pixels { data: &data, width: 4, height: 2, channels: 3 };
        let mut resampler = Resampler::default();
        let mut out = vec![0f32; 3 * 2 * 2];
        // The right half, at its own size: a copy.
        let region = Region { x: 2, y: 0, width: 2, height: 2 };
        resampler.resample(&pixels, region.into(), (2, 2), false, (1.0, 0.0), &mut out).unwrap();
        assert_eq!(out, [120., 180., 120., 180., 0., 0., 100., 100., 7., 7., 7., 7.]);
        resampler.resample(&pixels, region.into(), (2, 2), true, (0.5, 1.0), &mut out).unwrap();
        assert_eq!(&out[..4], &[91., 61., 91., 61.]);
        // The whole image shrunk to one pixel averages it.
        let mut one = vec![0f32; 3];
        let whole = Region { x: 0, y: 0, width: 4, height: 2 };
        resampler.resample(&pixels, whole.into(), (1, 1), false, (1.0, 0.0), &mut one).unwrap();
        assert!(
            (one[0] - 90.0).abs() < 2.0 && (one[1] - 50.0).abs() < 2.0 && one[2] == 7.0,
            "{one:?}"
        );
    }
}
