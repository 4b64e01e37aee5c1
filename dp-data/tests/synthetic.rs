//! The synthetic digits through the public API: what `generate_digits` writes, that it is
//! deterministic, and that it is a real (learnable, not trivial) classification problem.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use dp_data::{
    Dataset, Error, Result, Split, SyntheticDigits, WriterOptions, generate_digits, render_digit,
};

const PIXELS: usize = 28 * 28;

/// A scratch directory for one test (`.0` is its path), removed when dropped, also when the
/// test fails.
// The second field is held for its drop, which removes the directory.
struct TempDir(PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("dp-data-synthetic-{name}-"))
            .tempdir()
            .unwrap();
        TempDir(dir.path().to_path_buf(), dir)
    }
}

/// Small blocks so that even small splits span several blocks and shards.
fn small_blocks(threads: usize) -> WriterOptions {
    let mut options = WriterOptions::default();
    options.block_size = 16 << 10;
    options.shard_size = 256 << 10;
    options.threads = threads;
    options
}

/// Every image (flattened, row-major) and label of the dataset in `dir`, in record order.
fn read_split(dir: &Path) -> Result<(Vec<u8>, Vec<i64>)> {
    let dataset = Dataset::open(dir)?;
    let mut images = Vec::new();
    let mut labels = Vec::new();
    for block in dataset.blocks() {
        let block = block?;
        let image = block.dense::<u8>("image")?;
        assert_eq!(image.shape(), &[block.len(), 28, 28]);
        images.extend(image.iter().copied());
        labels.extend(block.dense::<i64>("label")?.iter().copied());
    }
    assert_eq!(labels.len() as u64, dataset.len());
    Ok((images, labels))
}

/// Every file of a dataset directory with its bytes, sorted by name.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            (entry.file_name().to_string_lossy().into_owned(), std::fs::read(entry.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn writes_train_and_eval_splits_that_match_the_record_function() -> Result<()> {
    let tmp = TempDir::new("splits");
    let spec = SyntheticDigits { records: 700, eval_records: 300, seed: 3 };
    let (train, eval) = generate_digits(&tmp.0, &spec, small_blocks(2))?;
    assert_eq!((train.records, eval.records), (700, 300));
    assert_eq!(train.schema, SyntheticDigits::schema());
    assert_eq!(eval.schema, SyntheticDigits::schema());
    assert!(train.shards.len() > 1, "small shards should split the training set");

    for split in [Split::Train, Split::Eval] {
        let (images, labels) = read_split(&tmp.0.join(split.name()))?;
        assert_eq!(labels.len() as u64, spec.len(split));
        for (index, (image, &label)) in images.chunks_exact(PIXELS).zip(&labels).enumerate() {
            let (expected_image, expected_label) = spec.record(split, index as u64);
            assert_eq!(label, expected_label, "{split:?} record {index}");
            assert_eq!(image, &expected_image[..], "{split:?} record {index}");
        }
    }
    Ok(())
}

#[test]
fn same_seed_gives_identical_files_and_another_seed_does_not() -> Result<()> {
    let spec = SyntheticDigits { records: 500, eval_records: 100, seed: 11 };
    let (a, b, c) = (TempDir::new("det-a"), TempDir::new("det-b"), TempDir::new("det-c"));
    // Different writer thread counts: the bytes must not depend on them.
    generate_digits(&a.0, &spec, small_blocks(1))?;
    generate_digits(&b.0, &spec, small_blocks(3))?;
    for split in ["train", "eval"] {
        let (fa, fb) = (files(&a.0.join(split)), files(&b.0.join(split)));
        assert!(fa.len() >= 2, "{split}: expected a manifest and shards, got {}", fa.len());
        assert!(fa == fb, "{split}: two runs with the same seed wrote different files");
    }

    generate_digits(&c.0, &SyntheticDigits { seed: 12, ..spec }, small_blocks(1))?;
    let (images_a, _) = read_split(&a.0.join("train"))?;
    let (images_c, _) = read_split(&c.0.join("train"))?;
    let same = images_a
        .chunks_exact(PIXELS)
        .zip(images_c.chunks_exact(PIXELS))
        .filter(|(x, y)| x == y)
        .count();
    assert_eq!(same, 0, "seeds 11 and 12 gave {same} identical images");
    Ok(())
}

#[test]
fn labels_are_roughly_uniform_and_images_look_like_ink_on_background() -> Result<()> {
    let tmp = TempDir::new("stats");
    let spec = SyntheticDigits { records: 3000, eval_records: 10, seed: 0 };
    generate_digits(&tmp.0, &spec, WriterOptions::default())?;
    let (images, labels) = read_split(&tmp.0.join("train"))?;

    let mut counts = [0usize; 10];
    for &label in &labels {
        assert!((0..10).contains(&label), "label {label}");
        counts[label as usize] += 1;
    }
    // 300 expected per digit, standard deviation about 16.
    assert!(counts.iter().all(|&c| (240..360).contains(&c)), "label counts {counts:?}");

    let mut mean = 0.0;
    for (index, image) in images.chunks_exact(PIXELS).enumerate() {
        // Over 60,000 records, the thinnest small 1 has 12 pixels above 128 and the boldest 8
        // has 244; no image has more than 90 pixels at 255.
        let bright = image.iter().filter(|&&p| p > 128).count();
        let inked = image.iter().filter(|&&p| p > 64).count();
        let white = image.iter().filter(|&&p| p == 255).count();
        assert!((10..300).contains(&bright), "record {index}: {bright} pixels above 128");
        assert!(inked >= 20, "record {index}: only {inked} pixels above 64");
        assert!(white < 150, "record {index}: {white} saturated pixels");
        mean += image.iter().map(|&p| f64::from(p)).sum::<f64>() / PIXELS as f64;
    }
    mean /= labels.len() as f64;
    // MNIST's mean pixel is about 33.
    assert!((15.0..70.0).contains(&mean), "mean pixel value {mean}");
    Ok(())
}

#[test]
fn eval_images_do_not_appear_in_train() -> Result<()> {
    let tmp = TempDir::new("disjoint");
    let spec = SyntheticDigits { records: 3000, eval_records: 1000, seed: 5 };
    generate_digits(&tmp.0, &spec, WriterOptions::default())?;
    let (train, _) = read_split(&tmp.0.join("train"))?;
    let (eval, _) = read_split(&tmp.0.join("eval"))?;
    let train: HashSet<&[u8]> = train.chunks_exact(PIXELS).collect();
    assert_eq!(train.len(), 3000, "the training split repeats images");
    let shared = eval.chunks_exact(PIXELS).filter(|image| train.contains(image)).count();
    assert_eq!(shared, 0, "{shared} eval images also appear in train");
    Ok(())
}

#[test]
fn bad_requests_are_errors() {
    let tmp = TempDir::new("errors");
    let empty = SyntheticDigits { records: 0, ..SyntheticDigits::default() };
    let err = generate_digits(&tmp.0, &empty, WriterOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Config { field: "records", .. }), "{err}");

    let spec = SyntheticDigits { records: 20, eval_records: 5, seed: 0 };
    generate_digits(&tmp.0, &spec, WriterOptions::default()).unwrap();
    let err = generate_digits(&tmp.0, &spec, WriterOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Config { field: "out", .. }), "writing over a dataset: {err}");
    // Only the eval split left over from an earlier run: refused before train is written.
    std::fs::remove_dir_all(tmp.0.join("train")).unwrap();
    let err = generate_digits(&tmp.0, &spec, WriterOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Config { field: "out", .. }), "writing over eval: {err}");
    assert!(!tmp.0.join("train").exists(), "train was written before the eval check");

    let err = render_digit(10, 0).unwrap_err();
    assert!(matches!(err, Error::Config { field: "label", .. }), "{err}");
}

/// A multinomial logistic regression on raw pixels, trained with plain SGD, must learn the
/// digits well (the data is learnable) but not perfectly (it is not trivially separable).
/// Written with index loops over slices because the workspace tests in debug builds, where
/// those are several times faster than iterator chains.
#[test]
fn a_linear_model_learns_it_well_but_not_perfectly() -> Result<()> {
    const CLASSES: usize = 10;
    const ROW: usize = PIXELS + 1; // weights, then the bias

    let tmp = TempDir::new("linear");
    let spec = SyntheticDigits { records: 5000, eval_records: 1000, seed: 0 };
    generate_digits(&tmp.0, &spec, WriterOptions::default())?;
    let load = |split: Split| -> Result<(Vec<f32>, Vec<usize>)> {
        let (images, labels) = read_split(&tmp.0.join(split.name()))?;
        let x = images.iter().map(|&p| f32::from(p) / 255.0).collect();
        Ok((x, labels.iter().map(|&l| l as usize).collect()))
    };
    let (train_x, train_y) = load(Split::Train)?;
    let (eval_x, eval_y) = load(Split::Eval)?;

    let logits = |w: &[f32], x: &[f32], out: &mut [f32; CLASSES]| {
        for (c, out) in out.iter_mut().enumerate() {
            let w = &w[c * ROW..(c + 1) * ROW];
            let mut z = w[PIXELS];
            for k in 0..PIXELS {
                z += w[k] * x[k];
            }
            *out = z;
        }
    };
    let accuracy = |w: &[f32], xs: &[f32], ys: &[usize]| {
        let mut z = [0f32; CLASSES];
        let mut correct = 0;
        for (x, &y) in xs.chunks_exact(PIXELS).zip(ys) {
            logits(w, x, &mut z);
            let best = (0..CLASSES).max_by(|&a, &b| z[a].total_cmp(&z[b])).unwrap_or(0);
            correct += usize::from(best == y);
        }
        correct as f64 / ys.len() as f64
    };

    let mut w = vec![0f32; CLASSES * ROW];
    let mut order: Vec<usize> = (0..train_y.len()).collect();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut z = [0f32; CLASSES];
    for epoch in 0..3 {
        // A fixed-seed Fisher-Yates shuffle per epoch.
        for i in (1..order.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let rate = 0.1 / (1.0 + epoch as f32);
        for &i in &order {
            let x = &train_x[i * PIXELS..(i + 1) * PIXELS];
            logits(&w, x, &mut z);
            let max = z.iter().copied().fold(f32::MIN, f32::max);
            let mut sum = 0.0;
            for v in &mut z {
                *v = (*v - max).exp();
                sum += *v;
            }
            for (c, &p) in z.iter().enumerate() {
                let step = rate * (p / sum - if c == train_y[i] { 1.0 } else { 0.0 });
                let w = &mut w[c * ROW..(c + 1) * ROW];
                for k in 0..PIXELS {
                    w[k] -= step * x[k];
                }
                w[PIXELS] -= step;
            }
        }
    }

    let train_accuracy = accuracy(&w, &train_x, &train_y);
    let eval_accuracy = accuracy(&w, &eval_x, &eval_y);
    println!(
        "logistic regression: train accuracy {train_accuracy:.4}, eval accuracy {eval_accuracy:.4}"
    );
    assert!(eval_accuracy > 0.6, "eval accuracy {eval_accuracy}: the digits should be learnable");
    assert!(
        eval_accuracy < 0.95,
        "eval accuracy {eval_accuracy}: a linear model should not solve it"
    );
    Ok(())
}
