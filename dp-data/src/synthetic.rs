//! The built-in synthetic dataset: 28x28 grey images of hand-drawn-looking digits 0-9.
//!
//! It is the default data of the workspace, so it has to exist without a download, be the
//! same on every machine, and be a real learning problem. Each digit is a small stroke font
//! (lines and elliptical arcs in a unit box, with a few style variants such as an open or
//! closed 4 and a 7 with or without a bar), bent by a random bilinear warp, then placed with a
//! random affine map (scale, aspect, rotation, shear, translation) and drawn with
//! anti-aliased strokes of random width. Occasional blotches, erased bits of stroke and pixel
//! noise sit on top. The result is about as hard as MNIST, a little harder for a linear model:
//! softmax regression on raw pixels reaches about 85% on the eval split (10 epochs of SGD on
//! 60,000 records), a 784-256-10 MLP about 99.4%. The mean pixel value is 34, close to
//! MNIST's 33.
//!
//! Every record is a pure function of `(seed, split, index)`: its random stream is SplitMix64
//! seeded by a hash of the three, so any record can be regenerated on its own (see
//! [`SyntheticDigits::record`]), generation parallelizes without changing a byte, and the eval
//! split draws from a different stream than the training split. The renderer uses only
//! correctly rounded IEEE arithmetic (`+ - * /`, `sqrt`, comparisons, rounding), never the
//! platform's `sin` or `ln`, so the bytes are the same on every platform and build.

use std::f64::consts::FRAC_1_SQRT_2;
use std::path::Path;

use crate::{
    DType, DatasetWriter, Error, Feature, Manifest, Result, Rng, Schema, Value, WriterOptions,
};

/// Image side in pixels.
const SIDE: usize = 28;
/// Pixels per image.
const PIXELS: usize = SIDE * SIDE;

/// Which split of the synthetic dataset a record belongs to. The two draw from disjoint random
/// streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training split, written to `out/train`.
    Train,
    /// The held-out evaluation split, written to `out/eval`.
    Eval,
}

impl Split {
    /// The split's directory name under the output directory: `train` or `eval`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Eval => "eval",
        }
    }

    /// The split's stream id, mixed into every record's seed (the ASCII of its name).
    fn stream(self) -> u64 {
        match self {
            Split::Train => 0x0074_7261_696E,
            Split::Eval => 0x6576_616C,
        }
    }
}

/// What to generate: the sizes of the two splits and the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SyntheticDigits {
    /// Records in the training split.
    pub records: u64,
    /// Records in the held-out evaluation split.
    pub eval_records: u64,
    /// The seed every record's randomness derives from.
    pub seed: u64,
}

impl Default for SyntheticDigits {
    /// MNIST-sized: 60,000 training and 10,000 evaluation records, seed 0.
    fn default() -> Self {
        SyntheticDigits { records: 60_000, eval_records: 10_000, seed: 0 }
    }
}

impl SyntheticDigits {
    /// Image side in pixels (images are `SIDE x SIDE`, row-major, 0 = background).
    pub const SIDE: usize = SIDE;

    /// The schema of both splits: `image: u8[28,28]`, `label: i64[]`.
    pub fn schema() -> Schema {
        Schema::new(vec![
            Feature::dense("image", DType::U8, &[SIDE, SIDE]),
            Feature::dense("label", DType::I64, &[]),
        ])
        .expect("the synthetic schema is well formed")
    }

    /// Records in `split`.
    pub fn len(&self, split: Split) -> u64 {
        match split {
            Split::Train => self.records,
            Split::Eval => self.eval_records,
        }
    }

    /// Record `index` of `split`: its image and its label (0-9), exactly as
    /// [`generate_digits`] writes it. Indices past the split's length are valid too (the
    /// stream is unbounded), which lets a caller extend a split without changing its prefix.
    pub fn record(&self, split: Split, index: u64) -> ([u8; PIXELS], i64) {
        let mut rng = Draw::new(record_seed(self.seed, split.stream(), index));
        let label = rng.below(10) as u8;
        let mut image = [0u8; PIXELS];
        draw_digit(label, &mut rng, &mut image);
        (image, i64::from(label))
    }
}

/// Renders one image of `label` (0-9) from its own random stream `seed`: the renderer behind
/// [`SyntheticDigits::record`], usable alone. Returns 784 row-major pixels.
pub fn render_digit(label: u8, seed: u64) -> Result<[u8; PIXELS]> {
    if label > 9 {
        return Err(Error::Config { field: "label", what: format!("a digit is 0-9, got {label}") });
    }
    let mut image = [0u8; PIXELS];
    draw_digit(label, &mut Draw::new(seed), &mut image);
    Ok(image)
}

/// Writes the synthetic dataset: `spec.records` records to `out/train` and
/// `spec.eval_records` to `out/eval`, each a dataset with [`SyntheticDigits::schema`].
/// Returns the two manifests (train, eval). Images are rendered on all available cores; the
/// bytes written depend only on `spec` and `options`, not on the number of cores. Fails
/// before writing anything if either split's directory cannot take a dataset (see
/// [`DatasetWriter::create`]).
pub fn generate_digits(
    out: &Path,
    spec: &SyntheticDigits,
    options: WriterOptions,
) -> Result<(Manifest, Manifest)> {
    if spec.records == 0 {
        return Err(Error::Config {
            field: "records",
            what: "the training split needs at least one record".into(),
        });
    }
    for split in [Split::Train, Split::Eval] {
        let dir = out.join(split.name());
        crate::staging::check_target(&dir)?;
    }
    let train = write_split(&out.join(Split::Train.name()), spec, Split::Train, options.clone())?;
    let eval = write_split(&out.join(Split::Eval.name()), spec, Split::Eval, options)?;
    Ok((train, eval))
}

/// Records rendered per round: enough to keep every core busy, small enough to stay in cache.
const CHUNK: usize = 4096;

fn write_split(
    dir: &Path,
    spec: &SyntheticDigits,
    split: Split,
    options: WriterOptions,
) -> Result<Manifest> {
    let mut writer = DatasetWriter::create(dir, SyntheticDigits::schema(), options)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut images = vec![[0u8; PIXELS]; CHUNK];
    let mut labels = vec![0i64; CHUNK];
    let total = spec.len(split);
    let mut first = 0u64;
    while first < total {
        let count = (total - first).min(CHUNK as u64) as usize;
        render_chunk(spec, split, first, &mut images[..count], &mut labels[..count], threads);
        for (image, label) in images[..count].iter().zip(&labels[..count]) {
            writer
                .append(&[Value::dense(&image[..]), Value::dense(std::slice::from_ref(label))])?;
        }
        first += count as u64;
    }
    writer.finish()
}

/// Fills `images` and `labels` with records `first..` of `split`, split over `threads`.
fn render_chunk(
    spec: &SyntheticDigits,
    split: Split,
    first: u64,
    images: &mut [[u8; PIXELS]],
    labels: &mut [i64],
    threads: usize,
) {
    let per_thread = images.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        let parts = images.chunks_mut(per_thread).zip(labels.chunks_mut(per_thread));
        for (part, (images, labels)) in parts.enumerate() {
            let start = first + (part * per_thread) as u64;
            scope.spawn(move || {
                for (i, (image, label)) in images.iter_mut().zip(labels).enumerate() {
                    (*image, *label) = spec.record(split, start + i as u64);
                }
            });
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Randomness.

/// A record's random stream: the pipeline's generator (SplitMix64), with what drawing a
/// digit needs on top.
struct Draw(Rng);

impl Draw {
    fn new(seed: u64) -> Self {
        Draw(Rng::new(seed))
    }

    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)`.
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2^-60 for small `n`).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Approximately standard normal: the Irwin-Hall sum of four uniforms, rescaled. Avoids
    /// `ln` (whose last bit differs between platforms) and is plenty for pixel noise.
    fn normal(&mut self) -> f64 {
        let sum = self.unit() + self.unit() + self.unit() + self.unit();
        (sum - 2.0) * 3f64.sqrt()
    }
}

/// SplitMix64's output function, a bijection on `u64` with good avalanche: the hash of a
/// record's seed (part of the built-in dataset's definition, so it stays as it is).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of one record's stream, a hash of `(seed, stream, index)`.
fn record_seed(seed: u64, stream: u64, index: u64) -> u64 {
    let h = mix(seed.wrapping_add(0x5EED_0FD1_6175));
    let h = mix(h ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    mix(h ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// `(sin x, cos x)` from IEEE basic operations only, so every platform gets the same bits:
/// reduce to `[-pi/4, pi/4]` by quarter turns, then Taylor series (error below 1e-13).
fn sin_cos(x: f64) -> (f64, f64) {
    use std::f64::consts::FRAC_PI_2;
    let quarter = (x / FRAC_PI_2).round();
    let r = x - quarter * FRAC_PI_2;
    let r2 = r * r;
    let mut sin = 0.0;
    let mut cos = 0.0;
    let mut term_s = r;
    let mut term_c = 1.0;
    for k in 1..=8 {
        sin += term_s;
        cos += term_c;
        let k = f64::from(k);
        term_s *= -r2 / ((2.0 * k) * (2.0 * k + 1.0));
        term_c *= -r2 / ((2.0 * k - 1.0) * (2.0 * k));
    }
    match (quarter as i64).rem_euclid(4) {
        0 => (sin, cos),
        1 => (cos, -sin),
        2 => (-sin, -cos),
        _ => (-cos, sin),
    }
}

// ---------------------------------------------------------------------------------------------
// Glyphs.

/// The most straight segments one glyph tessellates into.
const MAX_SEGMENTS: usize = 96;

/// Straight segments of a glyph in the unit box (x right, y down), before placement.
struct Segments {
    ends: [[[f64; 2]; 2]; MAX_SEGMENTS],
    len: usize,
}

impl Segments {
    fn new() -> Self {
        Segments { ends: [[[0.0; 2]; 2]; MAX_SEGMENTS], len: 0 }
    }

    fn line(&mut self, a: [f64; 2], b: [f64; 2]) {
        debug_assert!(self.len < MAX_SEGMENTS, "glyph has too many segments");
        if self.len < MAX_SEGMENTS {
            self.ends[self.len] = [a, b];
            self.len += 1;
        }
    }

    /// An arc of the ellipse with `center` and radii `radii`, from angle `from` to `to` in
    /// turns (0 = right, 0.25 = down, since y points down), as a polyline.
    fn arc(&mut self, center: [f64; 2], radii: [f64; 2], from: f64, to: f64) {
        let pieces = ((to - from).abs() * 24.0).ceil().max(1.0) as usize;
        let point = |t: f64| {
            let (s, c) = sin_cos(t * std::f64::consts::TAU);
            [center[0] + radii[0] * c, center[1] + radii[1] * s]
        };
        let mut previous = point(from);
        for i in 1..=pieces {
            let next = point(from + (to - from) * i as f64 / pieces as f64);
            self.line(previous, next);
            previous = next;
        }
    }

    fn ellipse(&mut self, center: [f64; 2], radii: [f64; 2]) {
        self.arc(center, radii, 0.0, 1.0);
    }
}

/// The strokes of `digit` in the unit box, with its style variants drawn from `rng`.
fn glyph(digit: u8, rng: &mut Draw, out: &mut Segments) {
    match digit {
        0 => {
            out.ellipse([0.5, 0.5], [0.5, 0.5]);
            if rng.chance(0.1) {
                out.line([0.78, 0.12], [0.22, 0.88]);
            }
        }
        1 => {
            let top = [rng.range(0.5, 0.62), 0.0];
            out.line(top, [0.5, 1.0]);
            if rng.chance(0.7) {
                out.line(top, [top[0] - rng.range(0.25, 0.4), rng.range(0.15, 0.3)]);
            }
            if rng.chance(0.3) {
                out.line([0.2, 1.0], [0.8, 1.0]);
            }
        }
        2 => {
            out.arc([0.5, 0.3], [0.5, 0.3], -0.5, 0.125);
            let end = [0.5 + 0.5 * FRAC_1_SQRT_2, 0.3 + 0.3 * FRAC_1_SQRT_2];
            if rng.chance(0.25) {
                // A curled neck: the diagonal bows before reaching the base.
                out.arc([0.0, 0.51], [end[0], 0.49], 0.0, 0.25);
                out.line([0.0, 1.0], [1.0, 1.0]);
            } else {
                out.line(end, [0.0, 1.0]);
                out.line([0.0, 1.0], [1.0, 1.0]);
            }
        }
        3 => {
            if rng.chance(0.8) {
                out.arc([0.5, 0.27], [0.45, 0.27], -0.42, 0.25);
            } else {
                // A flat-topped 3.
                out.line([0.1, 0.0], [0.9, 0.0]);
                out.line([0.9, 0.0], [0.45, 0.46]);
            }
            out.arc([0.5, 0.73], [0.5, 0.27], -0.25, 0.42);
        }
        4 => {
            if rng.chance(0.6) {
                out.line([0.7, 0.0], [0.0, 0.68]);
                out.line([0.7, 0.0], [0.7, 1.0]);
            } else {
                // The open 4 of handwriting.
                out.line([0.2, 0.0], [0.0, 0.68]);
                out.line([0.72, 0.25], [0.7, 1.0]);
            }
            out.line([0.0, 0.68], [1.0, 0.68]);
        }
        5 => {
            out.line([0.95, 0.0], [0.15, 0.0]);
            out.line([0.15, 0.0], [0.15, 0.45]);
            out.arc([0.5, 0.68], [0.48, 0.32], -0.375, 0.4);
        }
        6 => {
            out.arc([0.9, 0.75], [0.85, 0.73], -0.28, -0.5);
            out.ellipse([0.5, 0.72], [0.45, 0.28]);
        }
        7 => {
            out.line([0.0, 0.0], [1.0, 0.0]);
            if rng.chance(0.5) {
                out.line([1.0, 0.0], [0.35, 1.0]);
            } else {
                // A stem that bends towards vertical.
                out.line([1.0, 0.0], [0.55, 0.55]);
                out.line([0.55, 0.55], [0.42, 1.0]);
            }
            if rng.chance(0.25) {
                out.line([0.35, 0.5], [0.9, 0.5]);
            }
        }
        8 => {
            out.ellipse([0.5, 0.25], [0.38, 0.25]);
            out.ellipse([0.5, 0.72], [0.48, 0.28]);
        }
        _ => {
            out.ellipse([0.5, 0.28], [0.45, 0.28]);
            if rng.chance(0.5) {
                out.line([0.95, 0.28], [0.75, 1.0]);
            } else {
                out.arc([0.1, 0.28], [0.85, 0.72], 0.0, 0.22);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering.

/// Draws `digit` with random placement, stroke and noise from `rng` into `image`.
fn draw_digit(digit: u8, rng: &mut Draw, image: &mut [u8; PIXELS]) {
    let mut segments = Segments::new();
    glyph(digit, rng, &mut segments);

    // A bilinear warp of the unit box: each corner moves independently, which bends the
    // glyph the way a hand slants and tapers it.
    let mut corners = [[0.0f64; 2]; 4];
    for corner in &mut corners {
        *corner = [rng.range(-0.08, 0.08), rng.range(-0.08, 0.08)];
    }
    let warp = |[x, y]: [f64; 2]| {
        let top = [
            corners[0][0] * (1.0 - x) + corners[1][0] * x,
            corners[0][1] * (1.0 - x) + corners[1][1] * x,
        ];
        let bottom = [
            corners[2][0] * (1.0 - x) + corners[3][0] * x,
            corners[2][1] * (1.0 - x) + corners[3][1] * x,
        ];
        [x + top[0] * (1.0 - y) + bottom[0] * y, y + top[1] * (1.0 - y) + bottom[1] * y]
    };

    // Placement: the unit box becomes a glyph about 19 px tall, then scale, aspect, rotation,
    // shear and translation.
    let height = 19.0 * rng.range(0.75, 1.1);
    let width = height * rng.range(0.55, 0.75);
    let (sin, cos) = sin_cos(rng.range(-15.0, 15.0) / 360.0 * std::f64::consts::TAU);
    let shear = rng.range(-0.25, 0.25);
    let center = SIDE as f64 / 2.0;
    let offset = [center + rng.range(-3.0, 3.0), center + rng.range(-3.0, 3.0)];
    let place = |point: [f64; 2]| {
        let [x, y] = warp(point);
        let (u, v) = ((x - 0.5) * width, (y - 0.5) * height);
        let u = u + shear * v;
        [offset[0] + cos * u - sin * v, offset[1] + sin * u + cos * v]
    };

    let mut ink = [0f32; PIXELS];
    let half_width = rng.range(1.5, 3.5) / 2.0;
    for &[a, b] in &segments.ends[..segments.len] {
        stroke(&mut ink, place(a), place(b), half_width);
    }

    // Erase a bit of stroke now and then, as a pen that skips.
    if rng.chance(0.15) {
        let [a, b] = segments.ends[rng.below(segments.len as u64) as usize];
        let t = rng.unit();
        let at = place([a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t]);
        let radius = rng.range(1.0, 2.5);
        for_pixels_near(at, at, radius + 0.5, |p, d| {
            let keep = (d - radius).clamp(0.0, 1.0) as f32;
            ink[p] *= keep;
        });
    }

    // Blotches: small ink dots anywhere in the image.
    if rng.chance(0.3) {
        for _ in 0..1 + rng.below(3) {
            let at = [rng.range(2.0, SIDE as f64 - 2.0), rng.range(2.0, SIDE as f64 - 2.0)];
            let radius = rng.range(0.6, 2.0);
            let strength = rng.range(0.3, 1.0) as f32;
            for_pixels_near(at, at, radius + 0.5, |p, d| {
                let value = (radius + 0.5 - d).clamp(0.0, 1.0) as f32 * strength;
                ink[p] = ink[p].max(value);
            });
        }
    }

    let peak = rng.range(0.7, 1.0);
    let noise = rng.range(0.0, 0.12);
    for (pixel, &ink) in image.iter_mut().zip(&ink) {
        let value = f64::from(ink) * peak + noise * rng.normal();
        *pixel = (value.clamp(0.0, 1.0) * 255.0).round() as u8;
    }
}

/// Adds an anti-aliased stroke from `a` to `b` (pixel coordinates) of half width `half_width`:
/// a pixel's ink is 1 within the stroke, falling linearly to 0 one pixel outside.
fn stroke(ink: &mut [f32; PIXELS], a: [f64; 2], b: [f64; 2], half_width: f64) {
    for_pixels_near(a, b, half_width + 0.5, |p, d| {
        let value = (half_width + 0.5 - d).clamp(0.0, 1.0) as f32;
        ink[p] = ink[p].max(value);
    });
}

/// Calls `f(pixel index, distance)` for every pixel whose centre lies within `reach` of the
/// segment `a`-`b` (a point when `a == b`).
fn for_pixels_near(a: [f64; 2], b: [f64; 2], reach: f64, mut f: impl FnMut(usize, f64)) {
    let range = |lo: f64, hi: f64| {
        let lo = (lo - reach - 0.5).floor().max(0.0) as usize;
        let hi = ((hi + reach - 0.5).ceil().max(-1.0) + 1.0).min(SIDE as f64) as usize;
        lo..hi
    };
    let (dx, dy) = (b[0] - a[0], b[1] - a[1]);
    let length2 = dx * dx + dy * dy;
    for y in range(a[1].min(b[1]), a[1].max(b[1])) {
        for x in range(a[0].min(b[0]), a[0].max(b[0])) {
            let (px, py) = (x as f64 + 0.5 - a[0], y as f64 + 0.5 - a[1]);
            let t =
                if length2 > 0.0 { ((px * dx + py * dy) / length2).clamp(0.0, 1.0) } else { 0.0 };
            let (ex, ey) = (px - t * dx, py - t * dy);
            let d = (ex * ex + ey * ey).sqrt();
            if d < reach {
                f(y * SIDE + x, d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sin_cos_matches_the_library_functions() {
        let mut x = -20.0;
        while x < 20.0 {
            let (s, c) = sin_cos(x);
            assert!((s - x.sin()).abs() < 1e-12 && (c - x.cos()).abs() < 1e-12, "{x}: {s} {c}");
            x += 0.0137;
        }
    }

    #[test]
    fn random_helpers_stay_in_range_and_are_roughly_uniform() {
        let mut rng = Draw::new(7);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[rng.below(10) as usize] += 1;
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u));
            let r = rng.range(-3.0, 3.0);
            assert!((-3.0..3.0).contains(&r));
        }
        assert!(counts.iter().all(|&c| (9_500..10_500).contains(&c)), "{counts:?}");
        let n = 100_000;
        let (mut sum, mut sum2) = (0.0, 0.0);
        for _ in 0..n {
            let z = rng.normal();
            sum += z;
            sum2 += z * z;
        }
        let mean = sum / f64::from(n);
        let var = sum2 / f64::from(n) - mean * mean;
        assert!(mean.abs() < 0.02 && (var - 1.0).abs() < 0.03, "mean {mean}, variance {var}");
    }

    #[test]
    fn record_seeds_differ_by_seed_split_and_index() {
        let mut seen = std::collections::HashSet::new();
        for seed in 0..4 {
            for split in [Split::Train, Split::Eval] {
                for index in 0..1000 {
                    assert!(seen.insert(record_seed(seed, split.stream(), index)));
                }
            }
        }
    }

    #[test]
    fn every_glyph_fits_its_segment_buffer_and_unit_box() {
        let mut rng = Draw::new(1);
        for digit in 0..10 {
            for _ in 0..200 {
                let mut segments = Segments::new();
                glyph(digit, &mut rng, &mut segments);
                assert!((1..MAX_SEGMENTS).contains(&segments.len), "{digit}: {}", segments.len);
                for point in segments.ends[..segments.len].iter().flatten() {
                    assert!(point.iter().all(|c| (-0.05..=1.05).contains(c)), "{digit}: {point:?}");
                }
            }
        }
    }

    #[test]
    fn rendering_is_deterministic_and_seed_dependent() {
        for digit in 0..10 {
            let a = render_digit(digit, 42).unwrap();
            assert_eq!(a, render_digit(digit, 42).unwrap());
            assert_ne!(a, render_digit(digit, 43).unwrap());
        }
        let spec = SyntheticDigits::default();
        assert_eq!(spec.record(Split::Train, 5), spec.record(Split::Train, 5));
        assert_ne!(spec.record(Split::Train, 5).0, spec.record(Split::Eval, 5).0);
        assert_ne!(spec.record(Split::Train, 5).0, spec.record(Split::Train, 6).0);
        let other = SyntheticDigits { seed: 1, ..spec };
        assert_ne!(spec.record(Split::Train, 5).0, other.record(Split::Train, 5).0);
    }

    #[test]
    fn labels_outside_0_to_9_are_errors() {
        assert!(render_digit(9, 0).is_ok());
        let err = render_digit(10, 0).unwrap_err();
        assert!(matches!(err, Error::Config { field: "label", .. }), "{err}");
    }

    #[test]
    fn images_have_ink_and_background() {
        let spec = SyntheticDigits::default();
        for index in 0..500 {
            let (image, label) = spec.record(Split::Train, index);
            assert!((0..10).contains(&label));
            // A digit covers a few percent (a thin 1) to a third (a bold 8) of the image.
            let bright = image.iter().filter(|&&p| p > 128).count();
            let dark = image.iter().filter(|&&p| p < 64).count();
            assert!((10..300).contains(&bright), "record {index} ({label}): {bright} bright");
            assert!(dark > 450, "record {index} ({label}): only {dark} dark pixels");
        }
    }

    /// The classes must look different on average: the mean images of two digits are far
    /// apart compared with the noise, or no model could learn them.
    #[test]
    fn mean_images_of_the_digits_differ() {
        let spec = SyntheticDigits::default();
        let mut means = vec![[0f64; PIXELS]; 10];
        let mut counts = [0f64; 10];
        for index in 0..2000 {
            let (image, label) = spec.record(Split::Train, index);
            let label = label as usize;
            counts[label] += 1.0;
            for (m, &p) in means[label].iter_mut().zip(&image) {
                *m += f64::from(p) / 255.0;
            }
        }
        for (mean, count) in means.iter_mut().zip(counts) {
            assert!(count > 150.0);
            mean.iter_mut().for_each(|m| *m /= count);
        }
        for a in 0..10 {
            for b in a + 1..10 {
                let distance: f64 = means[a]
                    .iter()
                    .zip(&means[b])
                    .map(|(x, y)| (x - y) * (x - y))
                    .sum::<f64>()
                    .sqrt();
                assert!(distance > 1.0, "digits {a} and {b}: mean images only {distance} apart");
            }
        }
    }
}
