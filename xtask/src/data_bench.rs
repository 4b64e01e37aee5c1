//! `data bench`: the training pipeline measured on the user's own image dataset, because
//! photographs differ (size, smoothness, encoding) and so does what a decoder can skip: the
//! trainer's crops and flips for its sample size, in batches, against the decoder alone and
//! the samples made alone on the same kind of crops, printed as one JSON line.

use std::path::Path;

use anyhow::{Result, bail};
use dp_data::{Dataset, Kind};

/// What `data bench` is asked for.
pub(crate) struct Bench<'a> {
    pub(crate) dir: &'a Path,
    /// The samples' side (default: the trainer's, from the images' sizes).
    pub(crate) size: Option<usize>,
    pub(crate) batch: usize,
    /// Worker threads (default: one per core).
    pub(crate) workers: Option<usize>,
    /// Epochs timed (at least 3), each after the decoder's pass.
    pub(crate) rounds: usize,
}

/// Measures and prints one JSON object: the dataset, the sample size, batch and workers, and
/// [`dp_data::measure_images::EncodedReport`]'s fields (`images_per_s` among them).
pub(crate) fn bench(b: &Bench<'_>) -> Result<()> {
    let dataset = Dataset::open(b.dir)?;
    let schema = dataset.schema();
    let Some(feature) = schema.features().iter().find(|f| f.kind == Kind::Image) else {
        bail!(
            "{} has no encoded image feature to measure (its features: {schema}); \
             `cargo xtask bench data` measures the dense pipeline",
            b.dir.display()
        );
    };
    if b.batch == 0 {
        bail!("--batch 0: a batch holds at least one image");
    }
    let counts = &dataset.manifest().images[&feature.name];
    let size = b.size.unwrap_or_else(|| counts.sample_size());
    if size == 0 {
        bail!("--image-size 0: a sample is at least 1 pixel a side");
    }
    let crop = dp_train::CropPolicy::for_side(size);
    crop.check(size).map_err(|why| anyhow::anyhow!("--image-size {size}: {why}"))?;
    // Flipped as the trainer flips samples of this size (photographs, not small pictures).
    let flip =
        dp_train::Augmentation::defaults_for_images(size).contains(&dp_train::Augmentation::FlipH);
    let input = dp_data::ImageInput { flip, ..crop.train(size, counts.channels()) };
    let workers = b.workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    if workers == 0 {
        bail!("--workers 0: the pipeline needs at least one worker");
    }
    let report =
        dp_data::measure_images::measure_encoded(b.dir, input, b.batch, workers, b.rounds)?;
    let mut line = serde_json::to_value(&report)?;
    let head = serde_json::json!({
        "dataset": b.dir.display().to_string(),
        "image_size": size,
        "channels": counts.channels(),
        "crop": crop.to_string(),
        "flip": flip,
        "batch": b.batch,
    });
    if let (Some(line), serde_json::Value::Object(head)) = (line.as_object_mut(), head) {
        line.extend(head);
    }
    println!("{line}");
    Ok(())
}
