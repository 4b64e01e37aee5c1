//! Encoded images end to end: an image folder imported as it is stored, decoded, cropped and
//! resampled in the pipeline's workers the same whatever their number, and bad images named.

use std::path::Path;

#[allow(dead_code)]
#[path = "support/tfrecord.rs"]
mod tfrecord;

use dp_data::{
    Dataset, DatasetWriter, Feature, ImageCrop, ImageFolderOptions, ImageInput, ImageSampler, Kind,
    Pipeline, PipelineConfig, SOURCE_FEATURE, Schema, Value, WriterOptions, import_image_folder,
    stored_image,
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
    // Not an image: ignored for its name.
    std::fs::write(root.join("red/notes.txt"), "x").unwrap();
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
    // With the file each record came from, as the image-folder importer keeps it.
    let schema = Schema::new(vec![
        Feature::image("image"),
        Feature::dense("label", dp_data::DType::I64, &[]),
        Feature::bytes(SOURCE_FEATURE),
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
        let (label, source) = ([i as i64], format!("cats/{i}.jpg"));
        let values = [Value::Bytes(stored), Value::dense(&label), Value::Bytes(source.as_bytes())];
        writer.append(&values).unwrap();
    }
    // Bytes that are no image are refused at the write, naming the record.
    let values = [Value::Bytes(b"GIF89a..."), Value::dense(&[0i64]), Value::Bytes(b"")];
    let error = writer.append(&values).unwrap_err();
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
    assert!(
        error.contains("record 1, feature `image`: the image from cats/1.jpg does not decode"),
        "{error}"
    );
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
fn an_image_cut_short_stops_the_import_and_each_record_keeps_its_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("photos");
    folder(&root);
    // Its header (and so its size) reads as before; its scans end early.
    let whole = jpeg(&photo(1, 48, 32));
    std::fs::write(root.join("green/cut.jpg"), &whole[..whole.len() - 600]).unwrap();
    let out = tmp.path().join("data");
    let error =
        import_image_folder(&root, &out, &ImageFolderOptions::default(), WriterOptions::default())
            .unwrap_err()
            .to_string();
    assert!(error.contains("green/cut.jpg") && error.contains("does not decode"), "{error}");
    assert!(!out.exists(), "nothing is left of a failed import");
    let options = ImageFolderOptions { skip_corrupt: true, ..ImageFolderOptions::default() };
    let report = import_image_folder(&root, &out, &options, WriterOptions::default()).unwrap();
    let skipped: Vec<&Path> = report.skipped.iter().map(|(path, _)| path.as_path()).collect();
    assert_eq!(skipped, [root.join("green/cut.jpg")]);
    // Each record says which file it is, under the root, whatever the shuffle did.
    let dataset = Dataset::open(&out).unwrap();
    let mut sources: Vec<String> = (0..dataset.len())
        .map(|i| String::from_utf8(dataset.get(i).unwrap().bytes(SOURCE_FEATURE).unwrap().to_vec()))
        .map(Result::unwrap)
        .collect();
    sources.sort();
    assert_eq!((sources.len(), &sources[0][..]), (24, "blue/0.JPG"));
    let record = dataset.get(0).unwrap();
    let label = *record.dense::<i64>("label").unwrap().first().unwrap() as usize;
    let source = String::from_utf8(record.bytes(SOURCE_FEATURE).unwrap().to_vec()).unwrap();
    assert!(source.starts_with(CLASSES[label]), "{source} has label {label}");

    // A class folder without images is refused, naming it: dropped, it would renumber the
    // classes after it.
    std::fs::create_dir_all(root.join("aardvark")).unwrap();
    std::fs::write(root.join("aardvark/readme.txt"), "x").unwrap();
    let error =
        import_image_folder(&root, &tmp.path().join("more"), &options, WriterOptions::default())
            .unwrap_err()
            .to_string();
    assert!(error.contains("aardvark") && error.contains("hold no .jpg"), "{error}");
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
fn an_image_stored_decoded_is_what_the_workers_make_of_the_whole_image() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("photos");
    folder(&root);
    let decoded = ImageFolderOptions { decoded: Some(12), ..ImageFolderOptions::default() };
    import_image_folder(&root, &tmp.path().join("small"), &decoded, WriterOptions::default())
        .unwrap();
    let dataset = Dataset::open(tmp.path().join("small")).unwrap();
    let whole = ImageInput { crop: ImageCrop::Whole, flip: false, ..ImageInput::eval(12, 3) };
    let mut sampler = ImageSampler::new();
    let mut sample = vec![0.0f32; whole.elements()];
    for index in 0..dataset.len() {
        let record = dataset.get(index).unwrap();
        let source = String::from_utf8(record.bytes(SOURCE_FEATURE).unwrap().to_vec()).unwrap();
        let stored = stored_image(&std::fs::read(root.join(&source)).unwrap()).unwrap();
        let mut rng = dp_data::Rng::new(index);
        sampler.sample(&stored, &whole, (1.0, 0.0), &mut rng, &mut sample).unwrap();
        let pixels: Vec<f32> =
            record.dense::<u8>("image").unwrap().iter().map(|&v| f32::from(v)).collect();
        assert_eq!(pixels, sample, "{source}");
    }
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

    // A JPEG cut short (its header whole) is refused at the import, naming file and record.
    let cut = file("cut.tfrecord", &|i| {
        let whole = jpeg(&photo(i % 3, 48, 32));
        if i == 4 { whole[..whole.len() - 600].to_vec() } else { whole }
    });
    let error = dp_data::import_tfrecord(
        &[cut],
        &tmp.path().join("cut"),
        &dp_data::TfRecordOptions::default(),
        WriterOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("cut.tfrecord") && error.contains("record 4 of this file"), "{error}");
    assert!(error.contains("does not decode"), "{error}");
    assert!(!tmp.path().join("cut").exists());
}

/// Displayed 16x8: the left half red, the right half blue.
fn halves(x: usize, _y: usize) -> [u8; 3] {
    if x < 8 { [220, 30, 30] } else { [30, 30, 220] }
}

fn jpeg_of(
    data: &[u8],
    (w, h): (u16, u16),
    color: jpeg_encoder::ColorType,
    edit: impl FnOnce(&mut jpeg_encoder::Encoder<&mut Vec<u8>>),
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = jpeg_encoder::Encoder::new(&mut out, 95);
    encoder.set_sampling_factor(jpeg_encoder::SamplingFactor::F_1_1);
    edit(&mut encoder);
    encoder.encode(data, w, h, color).unwrap();
    out
}

fn png_of(
    data: &[u8],
    (w, h): (u32, u32),
    color: png::ColorType,
    depth: png::BitDepth,
    palette: Option<Vec<u8>>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(color);
    encoder.set_depth(depth);
    if let Some(palette) = palette {
        encoder.set_palette(palette);
    }
    encoder.write_header().unwrap().write_image_data(data).unwrap();
    out
}

/// An EXIF block (APP1's payload) whose orientation tag is `orientation`.
fn exif(orientation: u16) -> Vec<u8> {
    let mut t = Vec::from(*b"Exif\0\0II");
    t.extend_from_slice(&42u16.to_le_bytes());
    t.extend_from_slice(&8u32.to_le_bytes());
    t.extend_from_slice(&1u16.to_le_bytes());
    t.extend_from_slice(&0x0112u16.to_le_bytes());
    t.extend_from_slice(&3u16.to_le_bytes());
    t.extend_from_slice(&1u32.to_le_bytes());
    t.extend_from_slice(&orientation.to_le_bytes());
    t.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    t
}

#[test]
fn every_encoding_people_store_comes_out_as_the_channels_asked_for() {
    use jpeg_encoder::ColorType as Jpeg;
    let displayed = |f: &dyn Fn([u8; 3]) -> Vec<u8>| -> Vec<u8> {
        (0..8).flat_map(|y| (0..16).flat_map(move |x| f(halves(x, y)))).collect()
    };
    let rgb = displayed(&|p| p.to_vec());
    let luma = |p: [u8; 3]| {
        ((299 * p[0] as u32 + 587 * p[1] as u32 + 114 * p[2] as u32 + 500) / 1000) as u8
    };
    let gray = displayed(&|p| vec![luma(p)]);
    // Stored 8 wide and 16 tall, shown turned a quarter clockwise (EXIF orientation 6):
    // displayed (x, y) is stored (y, 15 - x).
    let turned: Vec<u8> =
        (0..16).flat_map(|sy| (0..8).flat_map(move |sx| halves(15 - sy, sx))).collect();
    let rgb16: Vec<u8> = rgb.iter().flat_map(|&v| [v, 0x80]).collect();
    let gray_alpha: Vec<u8> = gray.iter().flat_map(|&v| [v, 128]).collect();
    let rgba: Vec<u8> = rgb.chunks(3).flat_map(|p| [p[0], p[1], p[2], 255]).collect();
    let indexed: Vec<u8> = (0..8).flat_map(|_| (0..16).map(|x| u8::from(x >= 8))).collect();
    let cmyk: Vec<u8> =
        rgb.chunks(3).flat_map(|p| [255 - p[0], 255 - p[1], 255 - p[2], 0]).collect();
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("baseline JPEG", jpeg_of(&rgb, (16, 8), Jpeg::Rgb, |_| {}), true),
        ("progressive JPEG", jpeg_of(&rgb, (16, 8), Jpeg::Rgb, |e| e.set_progressive(true)), true),
        ("grayscale JPEG", jpeg_of(&gray, (16, 8), Jpeg::Luma, |_| {}), false),
        ("CMYK JPEG", jpeg_of(&cmyk, (16, 8), Jpeg::Cmyk, |_| {}), true),
        (
            "EXIF-rotated JPEG",
            jpeg_of(&turned, (8, 16), Jpeg::Rgb, |e| e.add_app_segment(1, exif(6)).unwrap()),
            true,
        ),
        ("RGB PNG", png_of(&rgb, (16, 8), png::ColorType::Rgb, png::BitDepth::Eight, None), true),
        (
            "16-bit PNG",
            png_of(&rgb16, (16, 8), png::ColorType::Rgb, png::BitDepth::Sixteen, None),
            true,
        ),
        (
            "palette PNG",
            png_of(
                &indexed,
                (16, 8),
                png::ColorType::Indexed,
                png::BitDepth::Eight,
                Some(vec![220, 30, 30, 30, 30, 220]),
            ),
            true,
        ),
        (
            "gray and alpha PNG",
            png_of(
                &gray_alpha,
                (16, 8),
                png::ColorType::GrayscaleAlpha,
                png::BitDepth::Eight,
                None,
            ),
            false,
        ),
        (
            "RGBA PNG",
            png_of(&rgba, (16, 8), png::ColorType::Rgba, png::BitDepth::Eight, None),
            true,
        ),
    ];
    let mut sampler = dp_data::ImageSampler::new();
    for (name, encoded, color) in cases {
        let info = dp_data::ImageInfo::probe(&encoded).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((info.width, info.height), (16, 8), "{name}");
        let stored = stored_image(&encoded).unwrap();
        for channels in [1, 3] {
            // The whole image at its own size: the centre square of a 16x8 image is its
            // middle 8x8, four columns of each half.
            let input = ImageInput {
                height: 8,
                width: 8,
                channels,
                crop: dp_data::ImageCrop::Center { fraction: 1.0 },
                flip: false,
            };
            let mut out = vec![0f32; input.elements()];
            sampler
                .sample(&stored, &input, (1.0, 0.0), &mut dp_data::Rng::new(0), &mut out)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let at = |c: usize, x: usize| out[c * 64 + 4 * 8 + x];
            let expected = |p: [u8; 3], c: usize| match (channels, color) {
                (1, _) => luma(p),
                (_, true) => p[c],
                (_, false) => luma(p),
            };
            for c in 0..channels {
                for (x, pixel) in [(1, halves(0, 0)), (6, halves(15, 0))] {
                    let (got, want) = (at(c, x), f32::from(expected(pixel, c)));
                    assert!(
                        (got - want).abs() <= 12.0,
                        "{name}, {channels} channels: channel {c} at x {x} is {got}, not {want}"
                    );
                }
            }
        }
    }
}
