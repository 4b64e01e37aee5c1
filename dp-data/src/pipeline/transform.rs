//! Per-record transforms: normalization and augmentation, each drawing its randomness from the
//! record's own stream so the output does not depend on which worker ran it or when.

use std::fmt::Debug;

use serde::{Deserialize, Serialize};

use crate::FeatureStats;
use crate::rng::Rng;

/// A record as transforms see it: its input as `f32` in row-major `shape` (`[H, W]` or
/// `[C, H, W]` for images), and its label.
#[derive(Debug)]
pub struct Sample<'a> {
    /// The input values.
    pub x: &'a mut [f32],
    /// The shape of `x` (the input feature's shape).
    pub shape: &'a [usize],
    /// The label.
    pub label: &'a mut i64,
}

/// A per-record transform. Implementations must be pure functions of the sample and the
/// random stream, so results do not depend on the worker count, prefetching or resumption.
pub trait Transform: Send + Sync + Debug {
    /// A description that changes whenever the transform's output would (it is part of the
    /// pipeline's configuration hash, which resumption checks).
    fn describe(&self) -> String;

    /// Transforms `sample` in place.
    fn apply(&self, sample: &mut Sample<'_>, rng: &mut Rng);

    /// `Some((a, b))` if the transform is `x = a * x + b` elementwise with no randomness: the
    /// pipeline then folds it into the conversion to `f32` instead of making another pass.
    fn as_affine(&self) -> Option<(f32, f32)> {
        None
    }

    /// Whether the transform can apply to inputs of `shape` (checked once, when a pipeline is
    /// built); the error says why not.
    fn check(&self, _shape: &[usize]) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// `x = (x * scale - mean) / std`: e.g. `scale = 1/255` turns `u8` pixels into `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    /// Applied first.
    pub scale: f32,
    /// Subtracted after scaling.
    pub mean: f32,
    /// Divided by last.
    pub std: f32,
}

impl Normalize {
    /// Pixels in `0..=255` to `[0, 1]`, then standardized with `mean` and `std`.
    pub fn pixels(mean: f32, std: f32) -> Self {
        Normalize { scale: 1.0 / 255.0, mean, std }
    }
}

impl Normalize {
    fn affine(&self) -> (f32, f32) {
        (self.scale / self.std, -self.mean / self.std)
    }
}

impl Transform for Normalize {
    fn describe(&self) -> String {
        format!("normalize(scale={}, mean={}, std={})", self.scale, self.mean, self.std)
    }

    fn apply(&self, sample: &mut Sample<'_>, _rng: &mut Rng) {
        let (a, b) = self.affine();
        for v in sample.x.iter_mut() {
            *v = *v * a + b;
        }
    }

    fn as_affine(&self) -> Option<(f32, f32)> {
        Some(self.affine())
    }
}

/// Per-feature scaling, `x[i] = (x[i] - offset[i]) / scale[i]`: scikit-learn's
/// `StandardScaler` (the mean and standard deviation) or `MinMaxScaler` (the minimum and the
/// range) applied to each element of the input; a single offset and scale apply to every
/// element alike, and one per channel of a `[C, H, W]` image to each of its planes
/// (torchvision's `Normalize(mean, std)`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureScaling {
    /// Subtracted from each element.
    pub offset: Vec<f32>,
    /// Divides each element after that.
    pub scale: Vec<f32>,
}

impl FeatureScaling {
    /// Offsets and scales given, each one per element or one for all; every scale must be a
    /// positive number and every offset finite.
    pub fn new(offset: Vec<f32>, scale: Vec<f32>) -> std::result::Result<Self, String> {
        if offset.len() != scale.len() || offset.is_empty() {
            return Err(format!(
                "{} offsets (means) and {} scales (standard deviations): give as many of each, one per element or one for all",
                offset.len(),
                scale.len()
            ));
        }
        if let Some(i) = scale.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(format!("scale {i} is {}: scales must be positive numbers", scale[i]));
        }
        if let Some(i) = offset.iter().position(|o| !o.is_finite()) {
            return Err(format!("offset {i} is {}: offsets must be finite", offset[i]));
        }
        Ok(FeatureScaling { offset, scale })
    }

    /// Zero mean and unit variance per element; an element that never varies is only centered
    /// (scale 1), as `StandardScaler` does.
    pub fn standard(stats: &FeatureStats) -> Self {
        Self::from_stats(&stats.mean, stats.std.iter().copied())
    }

    /// Each element to `[0, 1]` over the range seen; a constant element is only shifted to 0.
    pub fn min_max(stats: &FeatureStats) -> Self {
        Self::from_stats(&stats.min, stats.max.iter().zip(&stats.min).map(|(max, min)| max - min))
    }

    fn from_stats(offset: &[f64], spread: impl Iterator<Item = f64>) -> Self {
        // A spread too small to divide by in f32 counts as none.
        let scale = spread.map(|s| if s > 1e-12 && s.is_finite() { s as f32 } else { 1.0 });
        FeatureScaling {
            offset: offset.iter().map(|&o| o as f32).collect(),
            scale: scale.collect(),
        }
    }
}

impl Transform for FeatureScaling {
    fn describe(&self) -> String {
        let mut crc = crate::checksum::Crc32c::new();
        for v in self.offset.iter().chain(&self.scale) {
            crc.update(&v.to_le_bytes());
        }
        format!("scale(elements={}, crc32c={:08x})", self.offset.len(), crc.value())
    }

    fn apply(&self, sample: &mut Sample<'_>, _rng: &mut Rng) {
        // One value per element, or per plane (a channel; one plane for a single value).
        let per = (sample.x.len() / self.offset.len()).max(1);
        for ((plane, offset), scale) in sample.x.chunks_mut(per).zip(&self.offset).zip(&self.scale)
        {
            plane.iter_mut().for_each(|v| *v = (*v - offset) / scale);
        }
    }

    fn as_affine(&self) -> Option<(f32, f32)> {
        match (&self.offset[..], &self.scale[..]) {
            ([offset], [scale]) => Some((1.0 / scale, -offset / scale)),
            _ => None,
        }
    }

    fn check(&self, shape: &[usize]) -> std::result::Result<(), String> {
        let elements: usize = shape.iter().product();
        match (self.offset.len(), shape) {
            (1, _) => Ok(()),
            (n, _) if n == elements => Ok(()),
            (n, [channels, _, _]) if n == *channels => Ok(()),
            (n, _) => Err(format!(
                "{n} offsets and scales for inputs of {elements} elements {shape:?}: give one for all, one per element, or one per channel of an image"
            )),
        }
    }
}

/// The last two dimensions as (height, width), and how many planes of that size `x` holds.
fn planes(shape: &[usize]) -> (usize, usize, usize) {
    match shape {
        [.., h, w] => (shape[..shape.len() - 2].iter().product(), *h, *w),
        [w] => (1, 1, *w),
        [] => (1, 1, 1),
    }
}

/// Mirrors images left-right and/or up-down, each with probability `p`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomFlip {
    /// Flip left-right.
    pub horizontal: bool,
    /// Flip up-down.
    pub vertical: bool,
    /// Probability of each flip.
    pub p: f32,
}

/// Flips and crops move pixels: they take images, `[H, W]` or `[C, H, W]`.
fn check_image(shape: &[usize]) -> std::result::Result<(), String> {
    match shape {
        [h, w] | [_, h, w] if *h > 0 && *w > 0 => Ok(()),
        _ => Err(format!("takes images ([H, W] or [C, H, W]), the inputs are {shape:?}")),
    }
}

impl Transform for RandomFlip {
    fn describe(&self) -> String {
        format!("flip(h={}, v={}, p={})", self.horizontal, self.vertical, self.p)
    }

    fn check(&self, shape: &[usize]) -> std::result::Result<(), String> {
        check_image(shape)
    }

    fn apply(&self, sample: &mut Sample<'_>, rng: &mut Rng) {
        // Draw both decisions whatever is enabled, so enabling one does not shift the other.
        let (flip_h, flip_v) = (rng.next_f32() < self.p, rng.next_f32() < self.p);
        let (n, h, w) = planes(sample.shape);
        for plane in sample.x.chunks_exact_mut(h * w).take(n) {
            if self.horizontal && flip_h {
                plane.chunks_exact_mut(w).for_each(<[f32]>::reverse);
            }
            if self.vertical && flip_v {
                for y in 0..h / 2 {
                    let (top, bottom) = plane.split_at_mut((h - 1 - y) * w);
                    top[y * w..(y + 1) * w].swap_with_slice(&mut bottom[..w]);
                }
            }
        }
    }
}

/// Pads images with `padding` zeros on every side, then crops a random window of the original
/// size: a random shift of up to `padding` pixels in each direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandomCrop {
    /// The padding (the largest shift).
    pub padding: usize,
}

impl Transform for RandomCrop {
    fn describe(&self) -> String {
        format!("crop(padding={})", self.padding)
    }

    fn check(&self, shape: &[usize]) -> std::result::Result<(), String> {
        check_image(shape)?;
        let (_, h, w) = planes(shape);
        if self.padding >= h.min(w) {
            return Err(format!("a padding of {} leaves nothing of {h}x{w} images", self.padding));
        }
        Ok(())
    }

    fn apply(&self, sample: &mut Sample<'_>, rng: &mut Rng) {
        let span = 2 * self.padding as u64 + 1;
        let dy = rng.below(span) as isize - self.padding as isize;
        let dx = rng.below(span) as isize - self.padding as isize;
        let (n, h, w) = planes(sample.shape);
        let (hi, wi) = (h as isize, w as isize);
        for plane in sample.x.chunks_exact_mut(h * w).take(n) {
            // out[y][x] = in[y + dy][x + dx], zero outside. Walking away from the source
            // direction reads every input before it is overwritten, so no scratch is needed.
            for j in 0..hi {
                let y = if dy >= 0 { j } else { hi - 1 - j };
                for i in 0..wi {
                    let x = if dx >= 0 { i } else { wi - 1 - i };
                    let (sy, sx) = (y + dy, x + dx);
                    let value = if (0..hi).contains(&sy) && (0..wi).contains(&sx) {
                        plane[(sy * wi + sx) as usize]
                    } else {
                        0.0
                    };
                    plane[(y * wi + x) as usize] = value;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(t: &dyn Transform, x: &mut [f32], shape: &[usize], seed: u64) {
        let mut label = 0;
        t.apply(&mut Sample { x, shape, label: &mut label }, &mut Rng::new(seed));
    }

    #[test]
    fn normalize_scales_then_standardizes() {
        let mut x = [0.0, 255.0, 127.5];
        run(&Normalize::pixels(0.5, 0.25), &mut x, &[3], 0);
        assert_eq!(x, [-2.0, 2.0, 0.0]);
    }

    #[test]
    fn feature_scaling_scales_each_element_by_its_own_statistics() {
        // Three columns a thousand times apart in scale, and one constant column.
        let stats = FeatureStats {
            records: 4,
            mean: vec![2.0, 2000.0, 0.002, 7.0],
            std: vec![1.0, 1000.0, 0.001, 0.0],
            min: vec![1.0, 1000.0, 0.001, 7.0],
            max: vec![3.0, 3000.0, 0.003, 7.0],
        };
        let mut x = [3.0, 1000.0, 0.002, 7.0];
        run(&FeatureScaling::standard(&stats), &mut x, &[4], 0);
        assert_eq!(x, [1.0, -1.0, 0.0, 0.0]);
        let mut x = [3.0, 1000.0, 0.002, 7.0];
        run(&FeatureScaling::min_max(&stats), &mut x, &[4], 0);
        for (got, want) in x.iter().zip([1.0, 0.0, 0.5, 0.0]) {
            assert!((got - want).abs() < 1e-6, "{x:?}");
        }
        let one = FeatureScaling::new(vec![1.0], vec![2.0]).unwrap();
        let mut x = [3.0, 5.0];
        run(&one, &mut x, &[2], 0);
        assert_eq!((x, one.as_affine()), ([1.0, 2.0], Some((0.5, -0.5))));
        assert!(FeatureScaling::standard(&stats).check(&[4]).is_ok());
        let error = FeatureScaling::standard(&stats).check(&[2, 3]).unwrap_err();
        assert!(error.contains("4 offsets and scales for inputs of 6 elements"), "{error}");
        for (offset, scale, says) in [
            (vec![0.0], vec![0.0], "scale 0 is 0"),
            (vec![0.0, 1.0], vec![1.0], "2 offsets (means) and 1 scales"),
            (vec![f32::NAN], vec![1.0], "offset 0 is NaN"),
        ] {
            let error = FeatureScaling::new(offset, scale).unwrap_err();
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn flips_mirror_each_plane() {
        let always = RandomFlip { horizontal: true, vertical: true, p: 1.0 };
        let mut x: Vec<f32> = (0..12).map(|v| v as f32).collect(); // 2 planes of 2x3
        run(&always, &mut x, &[2, 2, 3], 1);
        assert_eq!(x, [5.0, 4.0, 3.0, 2.0, 1.0, 0.0, 11.0, 10.0, 9.0, 8.0, 7.0, 6.0]);
        let never = RandomFlip { p: 0.0, ..always };
        let mut y: Vec<f32> = (0..12).map(|v| v as f32).collect();
        run(&never, &mut y, &[2, 2, 3], 1);
        assert_eq!(y, (0..12).map(|v| v as f32).collect::<Vec<_>>());
    }

    #[test]
    fn crop_shifts_within_the_padding_and_fills_zeros() {
        let crop = RandomCrop { padding: 2 };
        let original: Vec<f32> = (1..=25).map(|v| v as f32).collect(); // 5x5, no zeros
        let mut shifts = std::collections::HashSet::new();
        for seed in 0..200 {
            let mut x = original.clone();
            run(&crop, &mut x, &[5, 5], seed);
            // Find the shift: where did the original top-left value go?
            let kept: Vec<_> = x.iter().filter(|&&v| v != 0.0).collect();
            assert!(kept.len() >= 9, "at most 2 rows and 2 columns are lost");
            // Every kept value keeps its neighbours' relative order (a pure shift).
            let pos = |v: f32| x.iter().position(|&u| u == v);
            if let (Some(a), Some(b)) = (pos(13.0), pos(14.0)) {
                assert_eq!(b, a + 1);
            }
            shifts.insert(x.iter().position(|&v| v == 13.0));
        }
        assert!(shifts.len() >= 20, "shifts seen: {}", shifts.len());
    }

    #[test]
    fn rng_is_deterministic_and_below_stays_in_range() {
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
            assert!(a.below(7) < 7);
            assert!((0.0..1.0).contains(&a.next_f32()));
            b.below(7);
            b.next_f32();
        }
    }
}
