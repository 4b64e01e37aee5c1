//! Encoded images end to end: an image folder imported as it is stored, decoded, cropped and
//! resampled in the pipeline's workers the same whatever their number, and bad images named.

use std::path::Path;

#[allow(dead_code)]
#[path = "support/tfrecord.rs"]
mod tfrecord;

use dp_data::{
    Dataset, DatasetWriter, Feature, ImageFolderOptions, ImageInput, Kind, Pipeline,
    PipelineConfig, Schema, Value, WriterOptions, import_image_folder, stored_image,
};
use image::{ImageEncoder, RgbImage};

const CLASSES: [&str; 3] = ["blue", "green", "red"];

/// A photograph-like image of class `class`: that class's channel bright, with a gradient
/// and a pattern in the others, so that a crop and a resampling have something to move.
fn photo(class: usize, width: u32, height: u32) -> RgbImage {
    // Noise, as photographs have, which leaves their JPEG little for zstd to find.
    let mut rng = dp_data::Rng::new(u64::from(width * 1000 + height) + class as u64);
    RgbImage::from_fn(width, height, |x, y| {
        let mut pixel = [((x * 7 + y * 3) % 64) as u8, ((x ^ y) % 48) as u8, (y % 40) as u8];
        pixel.iter_mut().for_each(|p| *p += rng.below(40) as u8);
        // blue, green, red: channels 2, 1, 0.
        pixel[2 - class] = 200 + ((x + y) % 40) as u8;
        image::Rgb(pixel)
    })
}

fn jpeg(image: &RgbImage) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90).encode_image(image).unwrap();
    out
}

fn png(image: &RgbImage) -> Vec<u8> {
    let mut out = Vec::new();
    let encoder = image::codecs::png::PngEncoder::new(&mut out);
    encoder
        .write_image(image, image.width(), image.height(), image::ExtendedColorType::Rgb8)
        .unwrap();
    out
}

/// `root/<class>/<n>.jpg` (every fifth a PNG) of assorted sizes, 8 per class.
fn folder(root: &Path) {
    for (class, name) in CLASSES.iter().enumerate() {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for n in 0..8u32 {
            let (w, h) = (40 + n * 13 % 50, 30 + n * 17 % 60);
            let image = photo(class, w, h);
            let (file, bytes) = match n % 5 {
                4 => (format!("{n}.png"), png(&image)),
                _ => (format!("{n}.JPG"), jpeg(&image)),
            };
            std::fs::write(dir.join(file), bytes).unwrap();
        }
    }
    // Not an image: ignored for its name; an empty class folder: no class.
    std::fs::write(root.join("red/notes.txt"), "x").unwrap();
    std::fs::create_dir_all(root.join("zebra")).unwrap();
}

fn pipeline(dir: &Path, image: ImageInput, workers: usize) -> Pipeline {
    let mut config = PipelineConfig::default();
    config.batch_size = 6;
    config.workers = workers;
    config.shuffle_window = Some(4);
    config.image = Some(image);
    config.seed = 5;
    Pipeline::new(dir, config, Vec::new()).unwrap()
}

#[test]
fn an_image_folder_trains_as_decoded_crops_of_its_images() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, out) = (tmp.path().join("photos"), tmp.path().join("data"));
    folder(&root);
    let mut options = WriterOptions::default();
    options.block_size = 8 << 10;
    let report = import_image_folder(&root, &out, &ImageFolderOptions::default(), options).unwrap();
    assert_eq!(report.classes, CLASSES);
    assert!(report.skipped.is_empty());
    let dataset = Dataset::open(&out).unwrap();
    assert_eq!(dataset.len(), 24);
    assert_eq!(dataset.schema().feature("image").unwrap().kind, Kind::Image);
    let manifest = dataset.manifest();
    assert_eq!(manifest.classes["label"], CLASSES);
    let counts = &manifest.images["image"];
    assert_eq!((counts.images, counts.png, counts.color, counts.channels()), (24, 3, 24, 3));
    assert_eq!((counts.width, counts.height), ((40, 81), (30, 89)));
    // Every image keeps its bytes and its size, and the order mixes the classes.
    let labels: Vec<i64> = (0..24)
        .map(|i| *dataset.get(i).unwrap().dense::<i64>("label").unwrap().first().unwrap())
        .collect();
    assert!(labels[..8].iter().any(|&l| l != labels[0]), "{labels:?}");

    for image in [ImageInput::train(16, 3), ImageInput::eval(16, 3)] {
        let mut one = pipeline(&out, image, 1);
        let mut two = pipeline(&out, image, 2);
        for _ in 0..8 {
            let (a, b) = (one.next_batch().unwrap(), two.next_batch().unwrap());
            assert_eq!(a.x().shape(), &[6, 3, 16, 16]);
            assert_eq!(a.x_flat(), b.x_flat(), "worker counts change nothing");
            assert_eq!(a.y(), b.y());
            for (sample, &label) in a.x_flat().chunks_exact(3 * 256).zip(a.y()) {
                // The class's channel is the bright one (channel 0 is red = class 2).
                let means: Vec<f32> =
                    sample.chunks_exact(256).map(|c| c.iter().sum::<f32>() / 256.0).collect();
                let bright = 2 - label as usize;
                assert!(means[bright] > 150.0, "label {label}: channel means {means:?}");
                let dim = means.iter().enumerate().all(|(c, &m)| c == bright || m < 110.0);
                assert!(dim, "{means:?}");
                assert!(sample.iter().all(|v| (0.0..=255.0).contains(v)));
            }
        }
    }
    // Flipping mirrors half the samples, each exactly, and moves no crop.
    let plain = ImageInput { flip: false, ..ImageInput::train(16, 3) };
    let (mut unflipped, mut flipped) =
        (pipeline(&out, plain, 2), pipeline(&out, ImageInput::train(16, 3), 2));
    let mut mirrored = 0;
    for _ in 0..8 {
        let (a, b) = (unflipped.next_batch().unwrap(), flipped.next_batch().unwrap());
        for (a, b) in a.x_flat().chunks_exact(16).zip(b.x_flat().chunks_exact(16)).step_by(48) {
            let mirror: Vec<f32> = a.iter().rev().copied().collect();
            assert!(a == b || mirror == b, "{a:?} {b:?}");
            mirrored += usize::from(a != b);
        }
    }
    assert!((12..=36).contains(&mirrored), "{mirrored} of 48 flipped");
    // An image input needs its size; a dense input refuses image settings.
    let mut config = PipelineConfig::default();
    config.batch_size = 2;
    let error = Pipeline::new(&out, config.clone(), Vec::new()).err().unwrap().to_string();
    assert!(error.contains("image input: say the size"), "{error}");
    config.image = Some(ImageInput::train(5000, 3));
    let error = Pipeline::new(&out, config, Vec::new()).err().unwrap().to_string();
    assert!(error.contains("outside 1..=4096"), "{error}");
}

#[test]
fn an_image_that_does_not_decode_is_named_and_nothing_panics() {
    let tmp = tempfile::tempdir().unwrap();
    let good = jpeg(&photo(0, 48, 32));
    let schema = Schema::new(vec![
        Feature::image("image"),
        Feature::dense("label", dp_data::DType::I64, &[]),
    ])
    .unwrap();
    let dir = tmp.path().join("data");
    let mut writer = DatasetWriter::create(&dir, schema.clone(), WriterOptions::default()).unwrap();
    // Whole, then cut short, then bytes changed past the headers.
    let mut cut = stored_image(&good).unwrap();
    cut.truncate(cut.len() - 600);
    let mut garbled = stored_image(&good).unwrap();
    let n = garbled.len();
    garbled[n - 400..n - 100].iter_mut().for_each(|b| *b = b.wrapping_mul(37).wrapping_add(11));
    for (i, stored) in [stored_image(&good).unwrap(), cut, garbled].iter().enumerate() {
        writer.append(&[Value::Bytes(stored), Value::dense(&[i as i64])]).unwrap();
    }
    // Bytes that are no image are refused at the write, naming the record.
    let error = writer.append(&[Value::Bytes(b"GIF89a..."), Value::dense(&[0i64])]).unwrap_err();
    assert!(error.to_string().contains("record 3, feature `image`"), "{error}");
    assert!(stored_image(b"GIF89a").unwrap_err().contains("not a JPEG or PNG"));
    writer.finish().unwrap();
    let mut config = PipelineConfig::default();
    config.batch_size = 1;
    config.shuffle_window = None;
    config.image = Some(ImageInput::eval(8, 3));
    let mut pipeline = Pipeline::new(&dir, config, Vec::new()).unwrap();
    pipeline.next_batch().unwrap();
    let error = pipeline.next_batch().unwrap_err().to_string();
    assert!(error.contains("record 1, feature `image`: the image does not decode"), "{error}");
    assert!(error.contains(&dir.display().to_string()), "{error}");

    // Skipped: each bad record's place taken by the next of its block that decodes (record 0,
    // past the end), the batch kept full and its stand-ins counted.
    let mut skipping = PipelineConfig::default();
    skipping.batch_size = 3;
    skipping.shuffle_window = None;
    skipping.image = Some(ImageInput::eval(8, 3));
    skipping.on_corruption = dp_data::CorruptionPolicy::Skip;
    // Batches made on request only, so that the counters are this batch's.
    skipping.prefetch = 0;
    let mut pipeline = Pipeline::new(&dir, skipping, Vec::new()).unwrap();
    let batch = pipeline.next_batch().unwrap();
    assert_eq!((batch.record_ids(), batch.replaced()), (&[0, 0, 0][..], 2));
    assert_eq!(batch.y().to_vec(), [0, 0, 0]);
    assert_eq!(pipeline.stats().undecodable_images, 3);
}

#[test]
fn unreadable_files_stop_an_import_unless_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("photos");
    folder(&root);
    std::fs::write(root.join("green/broken.jpg"), [0xFF, 0xD8, 0xFF, 0xE0, 0, 16]).unwrap();
    let out = tmp.path().join("data");
    let error =
        import_image_folder(&root, &out, &ImageFolderOptions::default(), WriterOptions::default())
            .unwrap_err()
            .to_string();
    assert!(error.contains("green/broken.jpg") && error.contains("--skip-corrupt"), "{error}");
    assert!(!out.exists(), "nothing is left of a failed import");
    let options = ImageFolderOptions { skip_corrupt: true, ..ImageFolderOptions::default() };
    let report = import_image_folder(&root, &out, &options, WriterOptions::default()).unwrap();
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.manifest.records, 24);
}

#[test]
fn small_images_store_decoded_and_large_ones_shrink_once() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("photos");
    folder(&root);
    let decoded = ImageFolderOptions { decoded: Some(12), ..ImageFolderOptions::default() };
    let report =
        import_image_folder(&root, &tmp.path().join("small"), &decoded, WriterOptions::default())
            .unwrap();
    let image = report.manifest.schema.feature("image").unwrap();
    assert_eq!(image.kind, Kind::Dense { shape: vec![3, 12, 12] });
    let dataset = Dataset::open(tmp.path().join("small")).unwrap();
    let record = dataset.get(0).unwrap();
    let label = *record.dense::<i64>("label").unwrap().first().unwrap() as usize;
    let pixels = record.dense::<u8>("image").unwrap();
    let plane = |c: usize| {
        pixels.iter().skip(c * 144).take(144).map(|&v| f32::from(v)).sum::<f32>() / 144.0
    };
    assert!(plane(2 - label) > 150.0, "planar, class channel bright");

    let capped = ImageFolderOptions { max_side: Some(50), ..ImageFolderOptions::default() };
    let report =
        import_image_folder(&root, &tmp.path().join("capped"), &capped, WriterOptions::default())
            .unwrap();
    let counts = &report.manifest.images["image"];
    assert!(report.resized > 0 && counts.width.1 <= 50 && counts.height.1 <= 50, "{counts:?}");
}

#[test]
fn photographs_are_stored_as_they_are_not_through_zstd() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("photos");
    for (class, name) in CLASSES.iter().enumerate().take(2) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for n in 0..4 {
            std::fs::write(dir.join(format!("{n}.jpg")), jpeg(&photo(class, 256 + n, 192)))
                .unwrap();
        }
    }
    let out = tmp.path().join("data");
    let report =
        import_image_folder(&root, &out, &ImageFolderOptions::default(), WriterOptions::default())
            .unwrap();
    // Each shard file holds its blocks' bytes as they are, plus headers and an index.
    for shard in &report.manifest.shards {
        assert!(shard.bytes > shard.raw_bytes, "{} bytes of {} raw", shard.bytes, shard.raw_bytes);
    }
    let dataset = Dataset::open(&out).unwrap();
    assert!(dataset.verify().is_empty());
    let (info, encoded) = dataset
        .blocks()
        .next()
        .unwrap()
        .unwrap()
        .image("image", 0)
        .map(|(i, e)| (i, e.to_vec()))
        .unwrap();
    assert_eq!(dp_data::ImageInfo::probe(&encoded).unwrap(), info);
}

#[test]
fn tfrecord_jpeg_bytes_import_as_images_by_content_or_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    // The layout `tf.io.encode_jpeg` and `{'image': FixedLenFeature((), tf.string), 'label':
    // FixedLenFeature((), tf.int64)}` make, with a bytes key that is no image beside it.
    let file = |name: &str, image: &dyn Fn(usize) -> Vec<u8>| {
        let records: Vec<u8> = (0..6)
            .flat_map(|i| {
                let (bytes, label) = (image(i), [(i % 3) as i64]);
                tfrecord::frame(&tfrecord::example(&[
                    ("image", tfrecord::List::Bytes(&bytes)),
                    ("label", tfrecord::List::Ints(&label, true)),
                    ("note", tfrecord::List::Bytes(b"taken on a tuesday")),
                ]))
            })
            .collect();
        let path = tmp.path().join(name);
        std::fs::write(&path, records).unwrap();
        path
    };
    let photos = file("photos.tfrecord", &|i| jpeg(&photo(i % 3, 40 + i as u32, 30)));
    let out = tmp.path().join("photos");
    let options = dp_data::TfRecordOptions::default();
    dp_data::import_tfrecord(&[photos], &out, &options, WriterOptions::default()).unwrap();
    let dataset = Dataset::open(&out).unwrap();
    let kinds: Vec<&Kind> = dataset.schema().features().iter().map(|f| &f.kind).collect();
    assert_eq!(kinds, [&Kind::Image, &Kind::Dense { shape: vec![1] }, &Kind::Bytes]);
    assert_eq!(dataset.manifest().images["image"].images, 6);
    let mut config = PipelineConfig::default();
    config.batch_size = 3;
    config.image = Some(ImageInput::train(16, 3));
    let batch = Pipeline::new(&out, config, Vec::new()).unwrap().next_batch().unwrap();
    assert_eq!(batch.x().shape(), &[3, 3, 16, 16]);

    // Named as images, bytes that are none are refused, naming the record.
    let named = dp_data::TfRecordOptions { images: vec!["note".into()], ..Default::default() };
    let path = file("notes.tfrecord", &|i| jpeg(&photo(0, 20 + i as u32, 20)));
    let error = dp_data::import_tfrecord(
        std::slice::from_ref(&path),
        &tmp.path().join("notes"),
        &named,
        WriterOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("record 0 of this file: feature `note`: the image is not a JPEG or PNG"),
        "{error}"
    );
    let missing = dp_data::TfRecordOptions { images: vec!["photo".into()], ..Default::default() };
    let error = dp_data::import_tfrecord(
        &[path],
        &tmp.path().join("missing"),
        &missing,
        WriterOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("the image key `photo` is not in the first Example"), "{error}");
}
