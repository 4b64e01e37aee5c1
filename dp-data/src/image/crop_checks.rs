//! Crops decoded only as far as they need (`Decoder::decode_region`: the window, at a DCT
//! scale) against the reference a plain pipeline makes: the whole image decoded, the crop cut
//! from it and resampled with the same filter.

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};

use super::crop::{ImageCrop, Region};
use super::decode::Decoder;
use super::resample::Resampler;
use crate::rng::Rng;

/// A photograph-like picture: smooth shading, edges, and grain.
fn picture(width: usize, height: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..height)
        .flat_map(|y| (0..width).map(move |x| (x, y)))
        .flat_map(|(x, y)| {
            let (fx, fy) = (x as f32 / width as f32, y as f32 / height as f32);
            let edge = if (fx - 0.4).powi(2) + (fy - 0.5).powi(2) < 0.06 { 70.0 } else { 0.0 };
            let shade = 60.0 + 120.0 * fx * fy + 30.0 * (9.0 * fx).sin() * (7.0 * fy).cos();
            [shade + edge, 200.0 - 110.0 * fy + edge / 2.0, 90.0 + 80.0 * fx - edge]
        })
        .map(|v| (v + 12.0 * (rng.next_f32() - 0.5)).clamp(0.0, 255.0) as u8)
        .collect()
}

/// The picture encoded as a JPEG the way `setup` says.
fn encoded(
    width: u16,
    height: u16,
    gray: bool,
    setup: impl Fn(&mut Encoder<&mut Vec<u8>>),
) -> Vec<u8> {
    let rgb = picture(width as usize, height as usize, u64::from(width));
    let (pixels, color) = match gray {
        true => (rgb.chunks(3).map(super::color::luma).collect(), ColorType::Luma),
        false => (rgb, ColorType::Rgb),
    };
    let mut out = Vec::new();
    let mut encoder = Encoder::new(&mut out, 90);
    setup(&mut encoder);
    encoder.encode(&pixels, width, height, color).expect("encodes");
    out
}

/// An EXIF block (little-endian TIFF) with only an orientation tag.
fn exif(orientation: u16) -> Vec<u8> {
    let mut t = Vec::from(*b"Exif\0\0II");
    let fields =
        [(42, 2), (8, 4), (1, 2), (0x0112, 2), (3, 2), (1, 4), (u32::from(orientation), 2)];
    for (value, bytes) in fields {
        t.extend_from_slice(&u32::to_le_bytes(value)[..bytes]);
    }
    t.extend_from_slice(&[0; 6]);
    t
}

/// The largest and the mean absolute difference of a channel between crops made both ways.
#[derive(Default, Clone, Copy)]
struct Difference {
    max: f64,
    sum: f64,
    count: usize,
}

impl Difference {
    fn mean(&self) -> f64 {
        self.sum / self.count.max(1) as f64
    }
}

impl std::fmt::Debug for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "max {}, mean {:.2}", self.max, self.mean())
    }
}

/// Per channel, the differences between each crop made both ways, over `crops` random resized
/// crops resampled to `side`: of the crops decoded at full scale, and of those decoded at
/// 1/2, 1/4 or 1/8 (`[full, scaled][channel]`); and how many crops took each scale.
fn differences(
    bytes: &[u8],
    channels: usize,
    side: usize,
    crops: usize,
) -> ([Vec<Difference>; 2], [usize; 4]) {
    let info = crate::ImageInfo::probe(bytes).expect("probes");
    let (mut decoder, mut whole) = (Decoder::default(), Decoder::default());
    let (mut fast, mut slow) = (Resampler::default(), Resampler::default());
    let mut rng = Rng::new(7);
    let mut found = [vec![Difference::default(); channels], vec![Difference::default(); channels]];
    let mut scales = [0; 4];
    for k in 0..crops {
        let region = match k {
            0 => Region { x: 0, y: 0, width: info.width, height: info.height },
            _ => ImageCrop::TRAIN.region(info.width, info.height, &mut rng),
        };
        let (pixels, area) =
            decoder.decode_region(&info, bytes, channels, region, (side, side)).expect("crop");
        let scale = (f64::from(region.width) / area.width).round() as u32;
        scales[scale.trailing_zeros() as usize] += 1;
        let got = fast.resize(&pixels, area, (side, side)).expect("resamples").to_vec();
        let reference = whole.decode(&info, bytes, channels).expect("decodes");
        let want = slow.resize(&reference, region.into(), (side, side)).expect("resamples");
        let bucket = &mut found[usize::from(scale > 1)];
        for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
            let d = &mut bucket[i % channels];
            d.max = d.max.max(f64::from(a.abs_diff(b)));
            d.sum += f64::from(a.abs_diff(b));
            d.count += 1;
        }
    }
    (found, scales)
}

/// Crops decoded at full scale are the whole decode's, pixel for pixel (the window takes in
/// the rows and columns the resampling filter reaches past the crop). Crops decoded at 1/2,
/// 1/4 or 1/8 scale differ as the scaled IDCT's low-pass differs from the resampler's: within
/// a mean of 1 level per channel (0.26 to 0.48 measured) and 32 levels at most (24 measured,
/// at the picture's sharp edge). Every encoding people store takes the scaled path.
#[test]
fn crops_decoded_in_part_and_scaled_match_the_whole_decode() {
    let restarts = |e: &mut Encoder<&mut Vec<u8>>| e.set_restart_interval(4);
    let cases: Vec<(&str, Vec<u8>, usize)> = vec![
        ("4:2:0", encoded(400, 300, false, |e| e.set_sampling_factor(SamplingFactor::R_4_2_0)), 3),
        ("4:4:4", encoded(400, 300, false, |e| e.set_sampling_factor(SamplingFactor::R_4_4_4)), 3),
        ("progressive", encoded(400, 300, false, |e| e.set_progressive(true)), 3),
        ("restart markers", encoded(400, 300, false, restarts), 3),
        ("gray", encoded(300, 400, true, |_| {}), 1),
        ("4:2:0 as gray", encoded(400, 300, false, |_| {}), 1),
    ];
    let turned = |o: u16| encoded(400, 300, false, move |e| e.add_app_segment(1, exif(o)).unwrap());
    let cases = cases.into_iter().chain([3, 6, 8].map(|o| ("EXIF orientation", turned(o), 3)));
    for (name, bytes, channels) in cases {
        let info = crate::ImageInfo::probe(&bytes).expect("probes");
        let name = format!("{name} ({}x{})", info.width, info.height);
        for side in [224, 96, 32] {
            let ([full, scaled], scales) = differences(&bytes, channels, side, 24);
            eprintln!(
                "{name}, {side}x{side}: crops at scale 1, 1/2, 1/4, 1/8: {scales:?}; \
                 |difference| per channel at full scale {full:?}, scaled {scaled:?}"
            );
            for (c, (full, scaled)) in full.iter().zip(&scaled).enumerate() {
                assert_eq!(full.max, 0.0, "{name}, {side}: channel {c} at full scale");
                assert!(
                    scaled.mean() <= 1.0 && scaled.max <= 32.0,
                    "{name}, {side}: channel {c} scaled differs by {scaled:?}"
                );
            }
            if side == 32 {
                assert!(scales[1..].iter().sum::<usize>() >= 20, "{name}: {scales:?}");
            }
        }
    }
}

/// Damage below a crop fails the crop as it fails the whole image: the scan is entropy-decoded
/// to its end whatever part a crop takes, so whether a record decodes does not depend on the
/// crop drawn.
#[test]
fn damage_outside_the_crop_fails_it_as_it_fails_the_whole_image() {
    let good = encoded(400, 300, false, |_| {});
    let info = crate::ImageInfo::probe(&good).expect("probes");
    let mut cut = good.clone();
    cut.truncate(good.len() - 600);
    let mut garbled = good.clone();
    let n = garbled.len();
    garbled[n - 400..n - 100].iter_mut().for_each(|b| *b = b.wrapping_mul(37).wrapping_add(11));
    let top = Region { x: 8, y: 0, width: 120, height: 60 };
    let mut decoder = Decoder::default();
    for side in [224, 32] {
        decoder.decode_region(&info, &good, 3, top, (side, side)).expect("intact");
        for (name, bytes) in [("cut short", &cut), ("garbled near its end", &garbled)] {
            let error = decoder.decode_region(&info, bytes, 3, top, (side, side)).unwrap_err();
            assert!(error.contains("does not decode as JPEG"), "{name}, {side}: {error}");
            decoder.decode(&info, bytes, 3).unwrap_err();
        }
    }
}
