//! Image folders, torchvision's `ImageFolder` layout: `root/<class>/<file>.{jpg,jpeg,png}`.
//! Classes are the sorted folder names (label `k` is the `k`-th), saved in the manifest. The
//! images are kept as encoded (an `image` feature), or, for small images, stored decoded at
//! one size.

use std::path::{Path, PathBuf};

use crate::image::decode::Decoder;
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
    /// dataset's size and the decoding it costs each epoch are then bounded.
    pub max_side: Option<u32>,
    /// Store the images decoded, resized to `size x size` (squashed), as a dense `u8`
    /// feature `[channels, size, size]`: for CIFAR-sized data, where reading pixels costs
    /// less than decoding them.
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
    let mut decoder = Decoder::default();
    for (path, label) in &files {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
        let made = decoder.check(&bytes).and_then(|_| match options.decoded {
            Some(size) => decoded(&bytes, size, channels, &mut stored),
            None => encoded(&bytes, options.max_side, &mut stored).map(|was_resized| {
                resized += u64::from(was_resized);
            }),
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

/// `bytes` as an image feature stores them into `stored`, resized first when a side is
/// longer than `max_side`; returns whether it was resized.
fn encoded(
    bytes: &[u8],
    max_side: Option<u32>,
    stored: &mut Vec<u8>,
) -> std::result::Result<bool, String> {
    let info = ImageInfo::probe(bytes)?;
    let Some(side) = max_side.filter(|&side| info.width.max(info.height) > side) else {
        info.store(bytes, stored);
        return Ok(false);
    };
    let image = load(bytes, &info)?;
    let scale = f64::from(side) / f64::from(info.width.max(info.height));
    let (w, h) = (
        ((f64::from(info.width) * scale).round() as u32).max(1),
        ((f64::from(info.height) * scale).round() as u32).max(1),
    );
    let image = image.resize_exact(w, h, image::imageops::FilterType::Triangle);
    let mut out = Vec::new();
    let written = match info.format {
        ImageFormat::Jpeg => {
            let encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90);
            image.write_with_encoder(encoder)
        }
        ImageFormat::Png => image.write_with_encoder(image::codecs::png::PngEncoder::new(&mut out)),
    };
    written.map_err(|e| format!("cannot be encoded again: {e}"))?;
    ImageInfo::probe(&out)?.store(&out, stored);
    Ok(true)
}

/// `bytes` decoded and squashed to `size x size`, planar `[channels, size, size]`.
fn decoded(
    bytes: &[u8],
    size: usize,
    channels: usize,
    stored: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let info = ImageInfo::probe(bytes)?;
    let image = load(bytes, &info)?;
    let side = size as u32;
    let image = image.resize_exact(side, side, image::imageops::FilterType::Triangle);
    let interleaved = match channels {
        1 => image.into_luma8().into_raw(),
        _ => image.into_rgb8().into_raw(),
    };
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

/// `bytes` decoded by the `image` crate, within the pixel limit [`ImageInfo::probe`] checked,
/// and turned as its EXIF orientation says.
fn load(bytes: &[u8], info: &ImageInfo) -> std::result::Result<image::DynamicImage, String> {
    use image::ImageDecoder;
    let format = match info.format {
        ImageFormat::Jpeg => image::ImageFormat::Jpeg,
        ImageFormat::Png => image::ImageFormat::Png,
    };
    let fail = |e: image::ImageError| format!("does not decode: {e}");
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
    reader.no_limits();
    let mut decoder = reader.into_decoder().map_err(fail)?;
    let orientation = decoder.orientation().map_err(fail)?;
    let mut image = image::DynamicImage::from_decoder(decoder).map_err(fail)?;
    image.apply_orientation(orientation);
    Ok(image)
}
