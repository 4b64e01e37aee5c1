//! A folder of JPEG photographs trains with no option but the data: the sample size, the
//! channels, the model and the per-channel scaling come from the images; evaluation and
//! prediction name the classes, and data naming other classes is refused. Small pictures and
//! photographs are cut and augmented by the standard recipe for their size, saved with the run.
//! An image that does not decode stops the run, or, with `skip_corrupt`, is replaced and
//! counted.

mod common;

use std::path::Path;

use common::{TempDir, run_dir};
use dp_data::{
    DatasetWriter, ImageFolderOptions, SyntheticPhotos, Value, WriterOptions,
    generate_photo_folder, import_image_folder,
};
use dp_train::{RunOptions, SavedRun, TrainConfig, train};

/// `root/{train,eval}`: photographs of three classes imported as an image folder each.
fn photos(root: &Path) {
    for (split, per_class, seed) in [("train", 96, 1), ("eval", 24, 2)] {
        let folder = root.join(format!("{split}-folder"));
        let spec = SyntheticPhotos { per_class, sides: (24, 48), seed, ..Default::default() };
        generate_photo_folder(&folder, &spec).unwrap();
        let options = ImageFolderOptions::default();
        import_image_folder(&folder, &root.join(split), &options, WriterOptions::default())
            .unwrap();
    }
}

fn config(root: &Path) -> TrainConfig {
    TrainConfig {
        train_data: root.join("train"),
        eval_data: Some(root.join("eval")),
        replicas: 2,
        global_batch: 32,
        epochs: 6,
        timeout_s: 30.0,
        ..TrainConfig::default()
    }
}

#[test]
fn a_photo_folder_trains_with_defaults_and_evaluation_names_its_classes() {
    let data = TempDir::new("images-data");
    photos(&data.0);
    let out = TempDir::new("images-run");
    let summary = train(config(&data.0), &RunOptions::new(&out.0), &mut ()).unwrap();
    // The small batch-norm network on 32x32 RGB samples (the typical shorter side, 24 to
    // 48, rounded down to a power of two); three classes that differ in colour and stripes
    // are learned.
    assert!(summary.model.starts_with("cnn"), "{}", summary.model);
    let accuracy = summary.eval_accuracy.unwrap();
    assert!(accuracy >= 0.9, "eval accuracy {accuracy}");
    assert_eq!(summary.skipped_records, 0);

    let run = SavedRun::open(&run_dir(&out.0)).unwrap();
    let names: Vec<&str> = run.class_names().unwrap().iter().map(String::as_str).collect();
    assert_eq!(names, ["class-0", "class-1", "class-2"]);
    let eval = run.evaluate(&data.0.join("eval"), false).unwrap();
    assert_eq!((eval.records, eval.model.accuracy), (72, summary.eval_accuracy));
    let predictions = run.predict(&data.0.join("eval")).unwrap();
    assert_eq!((predictions.records, predictions.columns), (72, 3));

    // Data whose folders name other classes: label 0 would mean another class.
    let other = data.0.join("other-folder");
    let spec = SyntheticPhotos { classes: 3, per_class: 2, ..Default::default() };
    generate_photo_folder(&other, &spec).unwrap();
    std::fs::rename(other.join("class-0"), other.join("cats")).unwrap();
    let options = ImageFolderOptions::default();
    import_image_folder(&other, &data.0.join("other"), &options, WriterOptions::default()).unwrap();
    let error = run.evaluate(&data.0.join("other"), false).unwrap_err().to_string();
    assert!(error.contains("names the classes 3 (cats, class-1, class-2)"), "{error}");
    let error = train(
        TrainConfig { eval_data: Some(data.0.join("other")), ..config(&data.0) },
        &RunOptions::new(&TempDir::new("images-other").0),
        &mut (),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("the same label would mean another class"), "{error}");
}

/// The photographs of `folder` (16 per class, 3 classes) as a dataset at `dir`, every tenth
/// cut short past its headers (so that it imports, as a file damaged after it was checked
/// would, and fails when decoded); returns how many were cut.
fn with_cut_images(folder: &Path, dir: &Path) -> u64 {
    let schema = dp_data::Schema::new(vec![
        dp_data::Feature::image("image"),
        dp_data::Feature::dense("label", dp_data::DType::I64, &[]),
    ])
    .unwrap();
    let mut writer = DatasetWriter::create(dir, schema, WriterOptions::default()).unwrap();
    let mut cut = 0;
    for (k, label) in (0..16).flat_map(|n| (0..3).map(move |c| (n, c))).enumerate() {
        let bytes = std::fs::read(folder.join(format!("class-{}/{}.jpg", label.1, label.0)));
        let mut stored = dp_data::stored_image(&bytes.unwrap()).unwrap();
        if k % 10 == 3 {
            stored.truncate(stored.len() * 2 / 3);
            cut += 1;
        }
        writer.append(&[Value::Bytes(&stored), Value::dense(&[label.1 as i64])]).unwrap();
    }
    writer.finish().unwrap();
    cut
}

#[test]
fn an_image_that_does_not_decode_stops_the_run_unless_skipped() {
    let data = TempDir::new("images-corrupt");
    let folder = data.0.join("folder");
    let spec = SyntheticPhotos { per_class: 16, sides: (24, 40), ..Default::default() };
    generate_photo_folder(&folder, &spec).unwrap();
    let dir = data.0.join("train");
    let cut = with_cut_images(&folder, &dir);
    let config = TrainConfig {
        train_data: dir.clone(),
        replicas: 2,
        global_batch: 8,
        epochs: 2,
        timeout_s: 30.0,
        ..TrainConfig::default()
    };
    let error = train(config.clone(), &RunOptions::new(&TempDir::new("images-fail").0), &mut ())
        .unwrap_err()
        .to_string();
    assert!(error.contains("feature `image`: the image does not decode"), "{error}");
    assert!(error.contains(&dir.display().to_string()), "{error}");

    let skipping = TrainConfig { skip_corrupt: true, ..config };
    let summary =
        train(skipping, &RunOptions::new(&TempDir::new("images-skip").0), &mut ()).unwrap();
    // Every cut image was met once per epoch and replaced; the run took all its steps.
    assert_eq!(summary.steps, 2 * 48 / 8);
    assert_eq!(summary.skipped_records, 2 * cut);
    assert_eq!(summary.skipped_eval_records, 0);
}

#[test]
fn an_evaluation_image_that_does_not_decode_is_found_at_setup_or_left_out_and_counted() {
    let data = TempDir::new("images-corrupt-eval");
    let folder = data.0.join("folder");
    let spec = SyntheticPhotos { per_class: 16, sides: (24, 40), ..Default::default() };
    generate_photo_folder(&folder, &spec).unwrap();
    import_image_folder(
        &folder,
        &data.0.join("train"),
        &ImageFolderOptions::default(),
        WriterOptions::default(),
    )
    .unwrap();
    let eval = data.0.join("eval");
    let cut = with_cut_images(&folder, &eval);
    let config = TrainConfig {
        train_data: data.0.join("train"),
        eval_data: Some(eval.clone()),
        replicas: 2,
        global_batch: 8,
        epochs: 1,
        timeout_s: 30.0,
        ..TrainConfig::default()
    };
    // Found before the run starts, as a training image's would be: no run directory.
    let out = TempDir::new("images-eval-fail");
    let error = train(config.clone(), &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
    assert!(error.contains("feature `image`: the image does not decode"), "{error}");
    assert!(error.contains(&eval.display().to_string()), "{error}");
    assert_eq!(std::fs::read_dir(&out.0).unwrap().count(), 0, "no run directory");

    // Skipped: each evaluation leaves the cut images out and says how many.
    let skipping = TrainConfig { skip_corrupt: true, ..config };
    let out = TempDir::new("images-eval-skip");
    let summary = train(skipping, &RunOptions::new(&out.0), &mut ()).unwrap();
    assert_eq!(summary.skipped_records, 0, "the training data is whole");
    assert_eq!(summary.skipped_eval_records, cut);
    assert!(summary.to_string().contains(&format!("skipped        {cut} unreadable evaluation")));
    let metrics = std::fs::read_to_string(run_dir(&out.0).join(dp_train::METRICS)).unwrap();
    assert!(metrics.contains(&format!("\"skipped_records\":{cut}")), "{metrics}");
}

/// `root/{train,eval}`: pictures of digits whose class is their shape alone: each 24 to 40
/// pixels a side (width and height drawn apart), its ink and paper of random colours, JPEG at
/// quality 70-95, as small pictures from someone else's pipeline come.
fn tinted_digits(root: &Path, per_class: [usize; 2]) {
    let schema = dp_data::Schema::new(vec![
        dp_data::Feature::image("image"),
        dp_data::Feature::dense("label", dp_data::DType::I64, &[]),
    ])
    .unwrap();
    for (split, per_class, stream) in [("train", per_class[0], 0), ("eval", per_class[1], 1)] {
        let dir = root.join(split);
        let mut writer =
            DatasetWriter::create(&dir, schema.clone(), WriterOptions::default()).unwrap();
        let mut rng = dp_data::Rng::new(stream);
        for n in 0..per_class * 10 {
            let label = (n % 10) as u8;
            let seed = rng.next_u64();
            let digit = image::GrayImage::from_raw(
                28,
                28,
                dp_data::render_digit(label, seed).unwrap().to_vec(),
            )
            .unwrap();
            let (width, height) = (24 + rng.below(17) as u32, 24 + rng.below(17) as u32);
            let digit = image::imageops::resize(
                &digit,
                width,
                height,
                image::imageops::FilterType::Triangle,
            );
            let colour = |rng: &mut dp_data::Rng| [0; 3].map(|_| rng.below(256) as f32);
            let (mut ink, mut paper) = (colour(&mut rng), colour(&mut rng));
            // The ink stands out from the paper in brightness, as a digit on a page does.
            while (ink.iter().sum::<f32>() - paper.iter().sum::<f32>()).abs() < 180.0 {
                (ink, paper) = (colour(&mut rng), colour(&mut rng));
            }
            let picture = image::RgbImage::from_fn(width, height, |x, y| {
                let a = f32::from(digit.get_pixel(x, y)[0]) / 255.0;
                image::Rgb([0, 1, 2].map(|c| (paper[c] * (1.0 - a) + ink[c] * a) as u8))
            });
            let mut jpeg = Vec::new();
            let quality = 70 + rng.below(26) as u8;
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, quality)
                .encode_image(&picture)
                .unwrap();
            let stored = dp_data::stored_image(&jpeg).unwrap();
            writer.append(&[Value::Bytes(&stored), Value::dense(&[i64::from(label)])]).unwrap();
        }
        writer.finish().unwrap();
    }
}

#[test]
fn small_pictures_train_on_the_whole_image_shifted_and_the_choice_is_saved() {
    let data = TempDir::new("small-pictures");
    tinted_digits(&data.0, [8, 4]);
    let out = TempDir::new("small-pictures-run");
    let small = TrainConfig { steps: Some(2), ..config(&data.0) };
    let summary = train(small.clone(), &RunOptions::new(out.0.join("default")), &mut ()).unwrap();
    // 24-40 pixel pictures are sampled at 16x16 (their typical shorter side, rounded down to
    // a power of two): CIFAR's recipe, a shift of an eighth of the side, no flips (a mirror
    // makes another shape of a digit), and He et al.'s CIFAR rate for the batch-norm `cnn`.
    let dir = run_dir(&out.0.join("default"));
    let saved = TrainConfig::load(&dir.join(dp_train::CONFIG)).unwrap();
    assert_eq!(saved.crop, Some(dp_train::CropPolicy::Pad(2)));
    assert_eq!(saved.augment, Some(Vec::new()));
    assert_eq!((saved.model.as_str(), saved.lr), ("cnn", Some(0.1 * 32.0 / 128.0)));
    // Evaluation from the run's directory samples as the run evaluated: the whole picture.
    let eval = SavedRun::open(&dir).unwrap().evaluate(&data.0.join("eval"), false).unwrap();
    assert_eq!(eval.model.accuracy, summary.eval_accuracy);
    // A policy given is kept, and evaluation follows it (the centre, here).
    let centre = TrainConfig { crop: Some("center".parse().unwrap()), ..small.clone() };
    let summary = train(centre, &RunOptions::new(out.0.join("centre")), &mut ()).unwrap();
    let dir = run_dir(&out.0.join("centre"));
    let saved = TrainConfig::load(&dir.join(dp_train::CONFIG)).unwrap();
    assert_eq!(saved.crop, Some(dp_train::CropPolicy::Center));
    let eval = SavedRun::open(&dir).unwrap().evaluate(&data.0.join("eval"), false).unwrap();
    assert_eq!(eval.model.accuracy, summary.eval_accuracy);

    // What does not fit the samples, or is not an image, is refused naming the key.
    for (crop, train_data, says) in [
        ("pad:16", data.0.join("train"), "pad:16: the shift must be 1 to 15 pixels for 16x16"),
        (
            "center",
            common::digits().join("train"),
            "cuts encoded images (JPEG, PNG); `image` is an array",
        ),
    ] {
        let c = TrainConfig {
            crop: Some(crop.parse().unwrap()),
            train_data,
            eval_data: None,
            ..small.clone()
        };
        let error = train(c, &RunOptions::new(out.0.join("refused")), &mut ()).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("`crop`") && text.contains(says), "{text}");
    }
    assert!(!out.0.join("refused").exists());
}

#[test]
fn photographs_train_on_flipped_random_resized_crops() {
    let data = TempDir::new("large-photos");
    let folder = data.0.join("folder");
    let spec = SyntheticPhotos { per_class: 4, sides: (130, 160), ..Default::default() };
    generate_photo_folder(&folder, &spec).unwrap();
    let options = ImageFolderOptions::default();
    import_image_folder(&folder, &data.0.join("train"), &options, WriterOptions::default())
        .unwrap();
    let out = TempDir::new("large-photos-run");
    let c = TrainConfig { eval_data: None, steps: Some(1), global_batch: 4, ..config(&data.0) };
    train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
    let saved = TrainConfig::load(&run_dir(&out.0).join(dp_train::CONFIG)).unwrap();
    assert_eq!(saved.crop, Some(dp_train::CropPolicy::Resized { min_scale: 0.08 }));
    assert_eq!(saved.augment, Some(vec![dp_train::Augmentation::FlipH]));
}
