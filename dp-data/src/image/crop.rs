//! Which part of an image a sample is made from: torchvision's `RandomResizedCrop` (Inception's
//! augmentation), a centred crop, or the whole image, planned from the stored size alone.

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// A region of an image, in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) x: u32,
    pub(crate) y: u32,
    pub(crate) width: u32,
    pub(crate) height: u32,
}

/// How a sample is cut from its image before it is resampled to the output size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ImageCrop {
    /// A region of random area (a fraction of the image's in `scale`) and aspect ratio
    /// (log-uniform in `ratio`), at a random place: torchvision's `RandomResizedCrop`, whose
    /// defaults are `scale = (0.08, 1)`, `ratio = (3/4, 4/3)`.
    RandomResized {
        /// The fraction of the image's area, least and most.
        scale: (f32, f32),
        /// Width over height, least and most.
        ratio: (f32, f32),
    },
    /// The centred square whose side is `fraction` of the shorter side: torchvision's
    /// evaluation transform (`Resize(256)`, `CenterCrop(224)`) is `fraction = 0.875`.
    Center {
        /// The crop's side over the shorter side.
        fraction: f32,
    },
    /// The whole image (resampled to the output size whatever its aspect, as torchvision's
    /// `Resize((h, w))`): what small pictures train and evaluate on, where a crop would cut
    /// away the subject.
    Whole,
}

impl ImageCrop {
    /// Training's default: `RandomResizedCrop`'s.
    pub const TRAIN: ImageCrop =
        ImageCrop::RandomResized { scale: (0.08, 1.0), ratio: (0.75, 4.0 / 3.0) };
    /// Evaluation's default: the centre, 224 of 256.
    pub const EVAL: ImageCrop = ImageCrop::Center { fraction: 0.875 };

    /// Whether the crop's parameters are in range; the error says which is not.
    pub(crate) fn check(&self) -> Result<(), String> {
        let in_unit = |v: f32| v > 0.0 && v <= 1.0;
        match *self {
            ImageCrop::RandomResized { scale: (lo, hi), ratio: (rlo, rhi) } => {
                if !(in_unit(lo) && in_unit(hi) && lo <= hi) {
                    return Err(format!("crop scale ({lo}, {hi}) must be 0 < least <= most <= 1"));
                }
                if !(rlo > 0.0 && rlo <= rhi && rhi.is_finite()) {
                    return Err(format!("crop ratio ({rlo}, {rhi}) must be 0 < least <= most"));
                }
            }
            ImageCrop::Center { fraction } if !in_unit(fraction) => {
                return Err(format!("centre crop fraction {fraction} must be in (0, 1]"));
            }
            ImageCrop::Center { .. } | ImageCrop::Whole => {}
        }
        Ok(())
    }

    /// The region of a `width x height` image this crop takes, drawing from `rng`.
    pub(crate) fn region(&self, width: u32, height: u32, rng: &mut Rng) -> Region {
        match *self {
            ImageCrop::RandomResized { scale, ratio } => {
                random_resized(width, height, scale, ratio, rng)
            }
            ImageCrop::Center { fraction } => {
                let side = ((width.min(height) as f32 * fraction).round() as u32).max(1);
                Region { x: (width - side) / 2, y: (height - side) / 2, width: side, height: side }
            }
            ImageCrop::Whole => Region { x: 0, y: 0, width, height },
        }
    }
}

/// torchvision's `RandomResizedCrop.get_params`: ten tries at a region of the drawn area and
/// aspect ratio that fits, then the whole image cut to the nearest ratio allowed.
fn random_resized(
    width: u32,
    height: u32,
    scale: (f32, f32),
    ratio: (f32, f32),
    rng: &mut Rng,
) -> Region {
    let area = width as f32 * height as f32;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * (scale.0 + rng.next_f32() * (scale.1 - scale.0));
        let aspect = (log_lo + rng.next_f32() * (log_hi - log_lo)).exp();
        let w = (target * aspect).sqrt().round() as u32;
        let h = (target / aspect).sqrt().round() as u32;
        if 0 < w && w <= width && 0 < h && h <= height {
            let y = rng.below(u64::from(height - h) + 1) as u32;
            let x = rng.below(u64::from(width - w) + 1) as u32;
            return Region { x, y, width: w, height: h };
        }
    }
    let aspect = width as f32 / height as f32;
    let (w, h) = if aspect < ratio.0 {
        (width, ((width as f32 / ratio.0).round() as u32).clamp(1, height))
    } else if aspect > ratio.1 {
        (((height as f32 * ratio.1).round() as u32).clamp(1, width), height)
    } else {
        (width, height)
    };
    Region { x: (width - w) / 2, y: (height - h) / 2, width: w, height: h }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_resized_regions_lie_inside_and_cover_the_scale_and_ratio_drawn() {
        let mut rng = Rng::new(7);
        let (mut least, mut most) = (f32::MAX, 0f32);
        for (w, h) in [(500, 375), (64, 64), (1000, 40), (3, 3)] {
            for _ in 0..2000 {
                let r = ImageCrop::TRAIN.region(w, h, &mut rng);
                assert!(r.width >= 1 && r.height >= 1, "{r:?}");
                assert!(r.x + r.width <= w && r.y + r.height <= h, "{r:?} in {w}x{h}");
                if (w, h) == (500, 375) {
                    let share = (r.width * r.height) as f32 / (w * h) as f32;
                    (least, most) = (least.min(share), most.max(share));
                    let aspect = r.width as f32 / r.height as f32;
                    assert!((0.74..=1.35).contains(&aspect), "{aspect}");
                }
            }
        }
        assert!(least < 0.1 && most > 0.9, "areas drawn {least}..{most}");
        // A strip too narrow for any allowed ratio falls back to its middle at the limit.
        let r = random_resized(1000, 40, (0.99, 1.0), (0.75, 4.0 / 3.0), &mut rng);
        assert_eq!((r.width, r.height, r.x), (53, 40, 473));
    }

    #[test]
    fn the_centre_crop_is_a_centred_square_of_the_shorter_side() {
        let mut rng = Rng::new(0);
        let r = ImageCrop::EVAL.region(640, 480, &mut rng);
        assert_eq!(r, Region { x: 110, y: 30, width: 420, height: 420 });
        assert_eq!(
            ImageCrop::Center { fraction: 1.0 }.region(1, 9, &mut rng),
            Region { x: 0, y: 4, width: 1, height: 1 }
        );
        assert!(ImageCrop::Center { fraction: 0.0 }.check().is_err());
        assert!(ImageCrop::RandomResized { scale: (0.5, 0.1), ratio: (1.0, 1.0) }.check().is_err());
        assert!(ImageCrop::TRAIN.check().is_ok());
        assert_eq!(
            ImageCrop::Whole.region(40, 24, &mut rng),
            Region { x: 0, y: 0, width: 40, height: 24 }
        );
    }
}
