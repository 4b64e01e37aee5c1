//! Image folders, torchvision's `ImageFolder` layout: `root/<class>/<file>.{jpg,jpeg,png}`.
//! Classes are the sorted folder names (label `k` is the `k`-th), saved in the manifest. The
//! images are kept as encoded (an `image` feature), or, for small images, stored decoded at
//! one size.

use std::path::{Path, PathBuf};

use image::ImageEncoder;

use crate::image::area::Area;
use crate::image::crop::Region;
use crate::image::decode::{Decoder, Pixels};
use crate::image::resample::Resampler;
use crate::image::{ImageFormat, ImageInfo};
use crate::rng::Rng;
use crate::{
    DType, DatasetWriter, Error, Feature, Manifest, Result, SOURCE_FEATURE, Schema, Value,
    WriterOptions,
};

/// How an image folder is imported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageFolderOptions {
    /// Images with a side longer than this are resized once, here, to that longest side and
    /// encoded again (JPEG at quality 90, PNG as PNG), as FFCV's `max_resolution` does: the
    /// dataset's size and the decoding it costs each epoch are then bounded. The resizing is
    /// the pipeline's decoder and resampler, as for [`ImageFolderOptions::decoded`].
    pub max_side: Option<u32>,
    /// Store the images decoded, resized to `size x size` (squashed), as a dense `u8`
    /// feature `[channels, size, size]`: for CIFAR-sized data, where reading pixels costs
    /// less than decoding them. Decoded and resampled by the pipeline's own decoder and
    /// resampler, so that the pixels stored are those the workers make of the whole image.
    pub decoded: Option<usize>,
    /// Skip a file that is not a readable image (saying which) instead of failing.
    pub skip_corrupt: bool,
}

/// What an image-folder import did.
#[derive(Debug, Clone)]
pub struct ImageFolderReport {
    /// The dataset written.
    pub manifest: Manifest,
    /// The class names, in label order.
    pub classes: Vec<String>,
    /// Files skipped as unreadable, and why (with `skip_corrupt`).
    pub skipped: Vec<(PathBuf, String)>,
    /// Images resized to `max_side`.
    pub resized: u64,
}

/// Imports the image folder `root` into a dataset at `out` with features `image` (an
/// `image`, or `u8[C, S, S]` with [`ImageFolderOptions::decoded`]), `label` (`i64`) and
/// [`SOURCE_FEATURE`] (bytes: the file's path under `root`, which a pipeline's error about
/// the record names). The records are written in an order shuffled once (seed 0), so that the
/// blocks a pipeline shuffles among hold every class, not one class each.
///
/// Every image is decoded here, by the decoder the pipeline's workers use: a file that is cut
/// short or damaged past its header stops the import naming it (or is skipped and listed with
/// `skip_corrupt`) instead of failing a training run hours later. Decoding once costs little
/// next to the decoding every epoch does. A class folder without a single image is refused,
/// naming it, as torchvision's `ImageFolder` refuses it: dropped, it would shift every later
/// class's label.
pub fn import_image_folder(
    root: &Path,
    out: &Path,
    options: &ImageFolderOptions,
    writer_options: WriterOptions,
) -> Result<ImageFolderReport> {
    let (classes, mut files) = list(root)?;
    shuffle(&mut files);
    let color = match options.decoded {
        Some(_) => any_color(&files, options.skip_corrupt)?,
        None => true,
    };
    let channels = if color { 3 } else { 1 };
    let image = match options.decoded {
        Some(size) => {
            if !(1..=4096).contains(&size) {
                return Err(Error::Config {
                    field: "image_size",
                    what: format!("{size} is outside 1..=4096"),
                });
            }
            Feature::dense("image", DType::U8, &[channels, size, size])
        }
        None => Feature::image("image"),
    };
    let schema = Schema::new(vec![
        image,
        Feature::dense("label", DType::I64, &[]),
        Feature::bytes(SOURCE_FEATURE),
    ])?;
    let mut writer = DatasetWriter::create(out, schema, writer_options)?;
    writer.name_classes("label", classes.clone())?;
    let (mut skipped, mut resized) = (Vec::new(), 0);
    let mut stored = Vec::new();
    let (mut decoder, mut resampler) = (Decoder::default(), Resampler::default());
    for (path, label) in &files {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
        let made = decoder.check(&bytes).and_then(|info| match options.decoded {
            Some(size) => {
                decoded(&info, &bytes, channels, size, (&mut decoder, &mut resampler), &mut stored)
            }
            None => {
                encoded(&bytes, info, options.max_side, (&mut decoder, &mut resampler), &mut stored)
                    .map(|was_resized| {
                        resized += u64::from(was_resized);
                    })
            }
        });
        let image = match options.decoded {
            Some(_) => Value::Dense(&stored),
            None => Value::Bytes(&stored),
        };
        let source = path.strip_prefix(root).unwrap_or(path).to_string_lossy();
        match made {
            Ok(()) => {
                let source = Value::Bytes(source.as_bytes());
                writer.append(&[image, Value::dense(&[*label]), source])?;
            }
            Err(why) if options.skip_corrupt => skipped.push((path.clone(), why)),
            Err(why) => {
                return Err(Error::Config {
                    field: "image",
                    what: format!(
                        "{} {why}; skip unreadable files with --skip-corrupt",
                        path.display()
                    ),
                });
            }
        }
    }
    let manifest = writer.finish()?;
    Ok(ImageFolderReport { manifest, classes, skipped, resized })
}

/// Image files and their labels.
type Labelled = Vec<(PathBuf, i64)>;

/// The class folders of `root` (sorted) and every image file in them with its label.
fn list(root: &Path) -> Result<(Vec<String>, Labelled)> {
    let entries = |dir: &Path| -> Result<Vec<PathBuf>> {
        let mut paths = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, "read the directory", e))?
            .map(|entry| {
                entry.map(|e| e.path()).map_err(|e| Error::io(dir, "read the directory", e))
            })
            .collect::<Result<Vec<_>>>()?;
        paths.sort();
        Ok(paths)
    };
    let folders: Vec<PathBuf> = entries(root)?.into_iter().filter(|p| p.is_dir()).collect();
    let mut classes = Vec::new();
    let mut files = Vec::new();
    let mut empty = Vec::new();
    for folder in folders {
        let images: Vec<PathBuf> =
            entries(&folder)?.into_iter().filter(|p| p.is_file() && is_image_name(p)).collect();
        let name = folder.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
        if images.is_empty() {
            empty.push(name);
            continue;
        }
        let label = classes.len() as i64;
        classes.push(name);
        files.extend(images.into_iter().map(|p| (p, label)));
    }
    if !files.is_empty() && !empty.is_empty() {
        return Err(Error::Config {
            field: "input",
            what: format!(
                "{}: the class folder(s) {} hold no .jpg, .jpeg or .png file; every folder \
                 of the root is a class (as torchvision's ImageFolder takes them), so add its \
                 images or move it out",
                root.display(),
                empty.join(", ")
            ),
        });
    }
    if files.is_empty() {
        return Err(Error::Config {
            field: "input",
            what: format!(
                "{} holds no class folders of images: expected ROOT/<class>/<file>.jpg (or .jpeg, .png)",
                root.display()
            ),
        });
    }
    Ok((classes, files))
}

fn is_image_name(path: &Path) -> bool {
    let extension = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
    matches!(extension.as_deref(), Some("jpg" | "jpeg" | "png"))
}

/// Fisher-Yates with the workspace's generator, seed 0: the same order on every machine.
fn shuffle<T>(items: &mut [T]) {
    let mut rng = Rng::new(0);
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// Whether any image has color (decoded datasets take one channel count for all).
fn any_color(files: &[(PathBuf, i64)], skip_corrupt: bool) -> Result<bool> {
    for (path, _) in files {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
        match ImageInfo::probe(&bytes) {
            Ok(info) if info.channels >= 3 => return Ok(true),
            Ok(_) => {}
            Err(_) if skip_corrupt => {}
            Err(why) => {
                return Err(Error::Config {
                    field: "image",
                    what: format!("{} {why}", path.display()),
                });
            }
        }
    }
    Ok(false)
}

/// `bytes` (whose header is `info`) as an image feature stores them into `stored`, resized
/// first when a side is longer than `max_side`: decoded and resampled as the pipeline's
/// workers do, and encoded again in its own format (JPEG at quality 90); returns whether it
/// was resized.
fn encoded(
    bytes: &[u8],
    info: ImageInfo,
    max_side: Option<u32>,
    (decoder, resampler): (&mut Decoder, &mut Resampler),
    stored: &mut Vec<u8>,
) -> std::result::Result<bool, String> {
    let Some(side) = max_side.filter(|&side| info.width.max(info.height) > side) else {
        info.store(bytes, stored);
        return Ok(false);
    };
    let channels = if info.channels >= 3 { 3 } else { 1 };
    let pixels = decoder.decode(&info, bytes, channels)?;
    let scale = f64::from(side) / f64::from(info.width.max(info.height));
    let (w, h) = (
        ((f64::from(info.width) * scale).round() as u32).max(1),
        ((f64::from(info.height) * scale).round() as u32).max(1),
    );
    let resized = resampler.resize(&pixels, whole(&pixels), (h as usize, w as usize))?;
    let color = match channels {
        1 => image::ExtendedColorType::L8,
        _ => image::ExtendedColorType::Rgb8,
    };
    let mut out = Vec::new();
    let written = match info.format {
        ImageFormat::Jpeg => image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
            .write_image(resized, w, h, color),
        ImageFormat::Png => {
            image::codecs::png::PngEncoder::new(&mut out).write_image(resized, w, h, color)
        }
    };
    written.map_err(|e| format!("cannot be encoded again: {e}"))?;
    ImageInfo::probe(&out)?.store(&out, stored);
    Ok(true)
}

/// The image squashed to `size x size` as the pipeline's workers make a sample of the whole
/// image (decoded as they decode it), planar `[channels, size, size]`.
fn decoded(
    info: &ImageInfo,
    bytes: &[u8],
    channels: usize,
    size: usize,
    (decoder, resampler): (&mut Decoder, &mut Resampler),
    stored: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let whole = Region { x: 0, y: 0, width: info.width, height: info.height };
    let (pixels, area) = decoder.decode_region(info, bytes, channels, whole, (size, size))?;
    let interleaved = resampler.resize(&pixels, area, (size, size))?;
    let plane = size * size;
    stored.clear();
    stored.resize(channels * plane, 0);
    for (p, pixel) in interleaved.chunks_exact(channels).enumerate() {
        for (c, &v) in pixel.iter().enumerate() {
            stored[c * plane + p] = v;
        }
    }
    Ok(())
}

/// The area of all of `pixels`.
fn whole(pixels: &Pixels<'_>) -> Area {
    Region { x: 0, y: 0, width: pixels.width, height: pixels.height }.into()
}
