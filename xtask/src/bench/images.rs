//! `cargo xtask bench data`'s image section: the pipeline on encoded photographs against its
//! decoder's limit and against PyTorch's DataLoader and tf.data on the same files, and on
//! small images stored decoded, all measured in this run.

use std::path::{Path, PathBuf};

use super::support::{python_peer, verdict};
use anyhow::{Context, Result};
use dp_data::{ImageFolderOptions, ImageInput, SyntheticPhotos, WriterOptions};
use serde_json::Value;

/// The workload the figures name: 2,000 photographs of 300 to 650 pixels a side at
/// JPEG quality 90, random resized crops to 224, flipped, in batches of 64, on 2 workers.
const PHOTOS: SyntheticPhotos =
    SyntheticPhotos { classes: 4, per_class: 500, sides: (300, 650), quality: 90, seed: 0 };
const SIZE: usize = 224;
const BATCH: usize = 64;
const WORKERS: usize = 2;
const ROUNDS: usize = 3;

/// CIFAR's size for the decoded path: 50,000 images of 32x32, in batches of 256.
const SMALL: SyntheticPhotos =
    SyntheticPhotos { classes: 4, per_class: 12_500, sides: (32, 40), quality: 90, seed: 1 };
const SMALL_BATCH: usize = 256;

pub(crate) fn run(root: &Path) -> Result<()> {
    let dir = root.join("target/bench-images");
    let photos = prepared(&dir.join("photos"), || {
        dp_data::generate_photo_folder(&dir.join("photos"), &PHOTOS).map(drop)
    })?;
    let decoded = prepared(&dir.join("decoded-32"), || {
        let folder = dir.join("small-photos");
        let _ = std::fs::remove_dir_all(&folder);
        dp_data::generate_photo_folder(&folder, &SMALL)?;
        let options = ImageFolderOptions { decoded: Some(32), ..Default::default() };
        dp_data::import_image_folder(
            &folder,
            &dir.join("decoded-32"),
            &options,
            WriterOptions::default(),
        )?;
        std::fs::remove_dir_all(&folder)
            .map_err(|e| dp_data::Error::Config { field: "bench", what: e.to_string() })
    })?;

    println!(
        "\nimages: RandomResizedCrop {SIZE}, flip, batch {BATCH}, {WORKERS} workers; {} cores, {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_features()
    );
    let synthetic = format!(
        "{} synthetic JPEG photographs of {}-{} px (quality {})",
        PHOTOS.classes * PHOTOS.per_class,
        PHOTOS.sides.0,
        PHOTOS.sides.1,
        PHOTOS.quality
    );
    photo_set(root, &synthetic, &photos, &dir.join("encoded"))?;
    let real = dir.join("real-photos");
    let made = prepared(&real, || {
        python_peer(root, "real_photos.py", [real.as_os_str(), "--count".as_ref(), "1000".as_ref()])
            .map(drop)
            .map_err(|e| dp_data::Error::Config { field: "bench", what: format!("{e:#}") })
    });
    let about = "1,000 real photographs (scikit-learn's two samples cut and rescaled to 300-650 px, quality 90)";
    match made {
        Ok(real) => photo_set(root, about, &real, &dir.join("real-encoded"))?,
        Err(error) => println!("\n{about}: not measured: {error:#}"),
    }

    let small = dp_data::measure_images::measure_decoded(&decoded, SMALL_BATCH, WORKERS, ROUNDS)?;
    println!(
        "\nimages stored decoded, {} of 32x32x3, random crop (pad 4), flip, batch {SMALL_BATCH}, {WORKERS} workers, cached",
        small.images
    );
    println!(
        "  dp pipeline                   {:>9.0} images/s, {:.2} GB/s of pixels (target 300,000 images/s) {}",
        small.images_per_s,
        small.pixel_bytes_per_s / 1e9,
        verdict(small.images_per_s >= 300_000.0)
    );
    Ok(())
}

/// One set of photographs (`folder`, imported to `encoded`): the decoder alone on the crops
/// the pipeline takes, the pipeline, and the peers on the same files.
fn photo_set(root: &Path, about: &str, folder: &Path, encoded: &Path) -> Result<()> {
    let encoded = prepared(encoded, || {
        let options = ImageFolderOptions::default();
        dp_data::import_image_folder(folder, encoded, &options, WriterOptions::default()).map(drop)
    })?;
    println!("\n{about}");
    let input = ImageInput::train(SIZE, 3);
    let ours = dp_data::measure_images::measure_encoded(&encoded, input, BATCH, WORKERS, ROUNDS)?;
    println!(
        "  decoder alone, its crops, 1 thread {:>6.0} images/s (limit for {WORKERS} workers: {:.0})",
        ours.decoder_images_per_s,
        ours.decoder_images_per_s * WORKERS as f64
    );
    println!(
        "  decoder alone, its crops, {WORKERS} threads {:>5.0} images/s",
        ours.parallel_decoder_images_per_s
    );
    println!(
        "  samples alone (decode, resample, planar f32), {WORKERS} threads {:>5.0} images/s",
        ours.parallel_sampler_images_per_s
    );
    println!(
        "  dp pipeline                   {:>9.0} images/s, {:.2} of {WORKERS} decoding threads (target 0.9) {}, {:.2} of the 1-thread limit, {:.2} of the samples alone",
        ours.images_per_s,
        ours.vs_parallel_decoder,
        verdict(ours.vs_parallel_decoder >= 0.9),
        ours.vs_decoder_limit,
        ours.vs_parallel_sampler,
    );
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let held = ours.peak_bytes as f64 / ours.planned_bytes.max(1) as f64;
    println!(
        "    peak memory {:.1} MiB, {held:.2}x what its plan holds with every batch in flight ({:.1} MiB: a shuffle window, batches of {:.1} MiB, image buffers, and the dataset, cached where it fits) (target 1.2) {}",
        mib(ours.peak_bytes),
        mib(ours.planned_bytes),
        mib((BATCH * 3 * SIZE * SIZE * 4) as u64),
        verdict(held <= 1.2)
    );
    for (name, script, target) in
        [("PyTorch DataLoader", "images_torch.py", 3.0), ("tf.data", "images_tfdata.py", 2.0)]
    {
        match peer(root, script, folder) {
            Ok(peer) => {
                let rate = peer["images_per_s"].as_f64().unwrap_or(f64::NAN);
                let ratio = ours.images_per_s / rate;
                println!(
                    "  {name:<29} {rate:>9.0} images/s: dp {ratio:.2}x (target {target}x) {}",
                    verdict(ratio >= target)
                );
                if let Some(decode) = peer["decode_images_per_s"].as_f64() {
                    let what = peer["decoder"].as_str().unwrap_or("its decoder");
                    println!("    {what:<27} {decode:>9.0} images/s on 1 thread");
                }
            }
            Err(error) => println!("  {name:<29} not measured: {error:#}"),
        }
    }
    Ok(())
}

/// `path`, made by `make` unless an earlier run finished making it (a `.complete` file
/// beside it says so).
fn prepared(path: &Path, make: impl FnOnce() -> dp_data::Result<()>) -> Result<PathBuf> {
    let done = path.with_extension("complete");
    if !done.exists() {
        let _ = std::fs::remove_dir_all(path);
        make().with_context(|| format!("prepare {}", path.display()))?;
        std::fs::write(&done, b"").with_context(|| format!("write {}", done.display()))?;
    }
    Ok(path.to_path_buf())
}

/// Runs `scripts/SCRIPT` on the photographs; its last line of output is a JSON object.
fn peer(root: &Path, script: &str, photos: &Path) -> Result<Value> {
    let args = [photos.display().to_string()].into_iter().chain(
        [("--size", SIZE), ("--batch", BATCH), ("--workers", WORKERS), ("--rounds", ROUNDS)]
            .into_iter()
            .flat_map(|(flag, value)| [flag.to_string(), value.to_string()]),
    );
    python_peer(root, script, args)
}

/// The vector extensions the decoders and the resampler can use here.
fn cpu_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let found: Vec<&str> = [
            (std::arch::is_x86_feature_detected!("sse4.1"), "SSE4.1"),
            (std::arch::is_x86_feature_detected!("avx2"), "AVX2"),
            (std::arch::is_x86_feature_detected!("avx512f"), "AVX-512F"),
        ]
        .into_iter()
        .filter_map(|(has, name)| has.then_some(name))
        .collect();
        if found.is_empty() { "no SIMD beyond SSE2".into() } else { found.join(", ") }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}
