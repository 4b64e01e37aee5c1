//! A folder of synthetic photographs, `root/<class>/<n>.jpg`, for trying the image path
//! without a download and for measuring it: JPEGs of assorted sizes whose class shows in
//! their colour and the direction of their stripes, under the noise and smooth shading that
//! make a photograph's JPEG dense (little for a decoder to skip, nothing for zstd to find).

use std::path::Path;

use image::{ImageEncoder, RgbImage};

use crate::error::{Error, Result};
use crate::rng::Rng;

/// What [`generate_photo_folder`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticPhotos {
    /// Classes (folders `class-0`, `class-1`, ...), at most 8.
    pub classes: usize,
    /// Photographs per class.
    pub per_class: usize,
    /// The least and most pixels of a side; each photograph's width and height are drawn
    /// between them.
    pub sides: (u32, u32),
    /// JPEG quality, 1 to 100.
    pub quality: u8,
    /// The seed: the same spec writes the same bytes.
    pub seed: u64,
}

impl Default for SyntheticPhotos {
    /// 3 classes of 16 photographs of 48 to 96 pixels a side, quality 90.
    fn default() -> Self {
        SyntheticPhotos { classes: 3, per_class: 16, sides: (48, 96), quality: 90, seed: 0 }
    }
}

/// Each class's colour (RGB) and stripe direction (`x`, `y` weights).
const LOOKS: [([f32; 3], (f32, f32)); 8] = [
    ([200.0, 60.0, 50.0], (1.0, 0.0)),
    ([60.0, 190.0, 70.0], (0.0, 1.0)),
    ([50.0, 80.0, 210.0], (0.7, 0.7)),
    ([210.0, 190.0, 60.0], (0.7, -0.7)),
    ([180.0, 60.0, 190.0], (1.0, 0.5)),
    ([60.0, 190.0, 190.0], (0.5, 1.0)),
    ([130.0, 130.0, 130.0], (1.0, -0.4)),
    ([230.0, 140.0, 40.0], (-0.4, 1.0)),
];

/// Writes the photographs `spec` describes under `root` (which must not exist yet, or be
/// empty), rendering them on all available cores; returns how many it wrote.
pub fn generate_photo_folder(root: &Path, spec: &SyntheticPhotos) -> Result<u64> {
    let fail = |what: String| Error::Config { field: "photos", what };
    if !(1..=LOOKS.len()).contains(&spec.classes) || spec.per_class == 0 {
        return Err(fail(format!(
            "{} classes of {} photographs: 1 to {} classes of at least one",
            spec.classes,
            spec.per_class,
            LOOKS.len()
        )));
    }
    let (least, most) = spec.sides;
    if !(8..=4096).contains(&least) || !(least..=4096).contains(&most) {
        return Err(fail(format!("sides {least}..{most}: 8 <= least <= most <= 4096")));
    }
    if !(1..=100).contains(&spec.quality) {
        return Err(fail(format!("JPEG quality {}: 1 to 100", spec.quality)));
    }
    if std::fs::read_dir(root).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(fail(format!("{} is not empty", root.display())));
    }
    for class in 0..spec.classes {
        let dir = root.join(format!("class-{class}"));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "create", e))?;
    }
    let total = spec.classes * spec.per_class;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(total);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (t..total).step_by(threads).try_for_each(|k| {
                        let (class, n) = (k % spec.classes, k / spec.classes);
                        let path = root.join(format!("class-{class}/{n}.jpg"));
                        let bytes = render(spec, class, k as u64);
                        std::fs::write(&path, bytes).map_err(|e| Error::io(&path, "write", e))
                    })
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })?;
    Ok(total as u64)
}

/// Photograph `k` of `class`, JPEG-encoded.
fn render(spec: &SyntheticPhotos, class: usize, k: u64) -> Vec<u8> {
    let mut rng = Rng::new(spec.seed ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let (least, most) = spec.sides;
    let mut side = || least + rng.below(u64::from(most - least) + 1) as u32;
    let (width, height) = (side(), side());
    let (color, (dx, dy)) = LOOKS[class];
    let period = 6.0 + rng.below(10) as f32;
    let (light_x, light_y) = (rng.below(100) as f32 / 100.0, rng.below(100) as f32 / 100.0);
    let image = RgbImage::from_fn(width, height, |x, y| {
        let (u, v) = (x as f32 / width as f32, y as f32 / height as f32);
        // Smooth shading from a light somewhere in the frame, stripes across it, and grain.
        let shade = 1.0 - 0.6 * ((u - light_x).powi(2) + (v - light_y).powi(2)).sqrt();
        let stripe = ((x as f32 * dx + y as f32 * dy) / period * std::f32::consts::TAU).sin();
        let mut pixel = [0u8; 3];
        for (c, p) in pixel.iter_mut().enumerate() {
            let grain = rng.below(48) as f32 - 24.0;
            *p = (color[c] * shade + 35.0 * stripe + grain).clamp(0.0, 255.0) as u8;
        }
        image::Rgb(pixel)
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, spec.quality)
        .write_image(&image, width, height, image::ExtendedColorType::Rgb8)
        .expect("an image in memory encodes");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_spec_writes_the_same_photographs_and_bad_specs_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let spec = SyntheticPhotos { per_class: 3, ..SyntheticPhotos::default() };
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        assert_eq!(generate_photo_folder(&a, &spec).unwrap(), 9);
        generate_photo_folder(&b, &spec).unwrap();
        for file in ["class-0/0.jpg", "class-2/2.jpg"] {
            let bytes = std::fs::read(a.join(file)).unwrap();
            assert_eq!(bytes, std::fs::read(b.join(file)).unwrap());
            let info = crate::ImageInfo::probe(&bytes).unwrap();
            assert!((48..=96).contains(&info.width) && (48..=96).contains(&info.height));
        }
        assert!(generate_photo_folder(&a, &spec).unwrap_err().to_string().contains("not empty"));
        for bad in [
            SyntheticPhotos { classes: 9, ..spec.clone() },
            SyntheticPhotos { sides: (50, 40), ..spec.clone() },
            SyntheticPhotos { quality: 0, ..spec.clone() },
        ] {
            assert!(generate_photo_folder(&tmp.path().join("c"), &bad).is_err(), "{bad:?}");
        }
    }
}
