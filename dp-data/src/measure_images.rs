//! The image path measured against its limit in the same run: a pipeline that decodes,
//! crops, flips and batches encoded images, against its decoder alone on the same images
//! (one thread, times the workers, and as many threads as workers) and against the samples
//! made alone (decoded, resampled and laid out, with no pipeline around them); and a pipeline
//! over small images stored decoded. Used by `cargo xtask bench data` and `dp data bench`.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::image::decode::Decoder;
use crate::image::{ImageInfo, ImageSampler};
use crate::{Dataset, ImageInput, Kind, Pipeline, PipelineConfig, RandomCrop, RandomFlip};

/// What [`measure_encoded`] found: medians over rounds that alternate the decoder and the
/// pipeline, so both see the same machine.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct EncodedReport {
    /// Images in the dataset, each made into a sample once per round by the pipeline.
    pub images: u64,
    /// Of those, the first ones the decoder alone decodes once per round, held in memory:
    /// all of them, or as many as fit in 256 MiB of encoded bytes.
    pub decoder_images: u64,
    /// Rounds measured.
    pub rounds: usize,
    /// Worker threads of the pipeline.
    pub workers: usize,
    /// The decoder alone, on one thread, the encoded bytes already in memory: images per
    /// second (libjpeg-turbo for JPEG, png for PNG, to 8-bit RGB), each decoded as far as a
    /// crop drawn as the pipeline draws them needs.
    pub decoder_images_per_s: f64,
    /// The decoder alone on as many threads as workers at once, each taking the next image:
    /// what the machine decodes with every worker's core busy (shared caches, and clocks a
    /// single busy core may run above).
    pub parallel_decoder_images_per_s: f64,
    /// The pipeline: images per second, from its start to its last batch of an epoch.
    pub images_per_s: f64,
    /// `images_per_s / (decoder_images_per_s * workers)`, the median of the rounds' ratios:
    /// what is left after reading, cropping, resampling, flipping and batching.
    pub vs_decoder_limit: f64,
    /// `images_per_s / parallel_decoder_images_per_s`, the median of the rounds' ratios.
    pub vs_parallel_decoder: f64,
    /// The samples alone on as many threads as workers: each image decoded as far as its crop
    /// needs, resampled, flipped and laid out planar as `f32` into one buffer per thread, as a
    /// worker makes it, without the pipeline around it (reading blocks, batches, the queue).
    pub parallel_sampler_images_per_s: f64,
    /// `images_per_s / parallel_sampler_images_per_s`, the median of the rounds' ratios: what
    /// the pipeline's own work (reading, batching, handing over) leaves of the samples' rate.
    pub vs_parallel_sampler: f64,
    /// Of the workers' time, the share spent decoding, transforming and collating.
    pub map_share: f64,
    /// The most `Data` bytes the pipeline held at once, its image buffers included.
    pub peak_bytes: u64,
    /// What the pipeline's plan holds with every batch in flight (a shuffle window's blocks,
    /// a batch per maker, the prefetched ones and the consumer's, each worker's image buffers:
    /// [`Pipeline::minimum_bytes`]) and, when it caches the dataset (by default, where it fits
    /// the budget), every block, from the first epoch's end.
    pub planned_bytes: u64,
}

/// Measures a pipeline over the encoded images of the dataset at `dir`, sampled as `input`
/// in batches of `batch` on `workers` threads, against the decoder alone, in `rounds` rounds
/// (at least 3) of: the decoder over every image, then one epoch of a new pipeline.
pub fn measure_encoded(
    dir: &Path,
    input: ImageInput,
    batch: usize,
    workers: usize,
    rounds: usize,
) -> Result<EncodedReport> {
    let dataset = Dataset::open(dir)?;
    let images = stored_images(&dataset)?;
    // Room for the pipeline's estimate of its working set (which assumes every held block is
    // the largest); the report gives the peak it reached.
    let config = PipelineConfig {
        batch_size: batch,
        workers,
        image: Some(input),
        memory_budget: 2 << 30,
        ..Default::default()
    };
    let mut rows = Vec::new();
    for _ in 0..rounds.max(3) {
        let single = alone(dir, &images, &input, 1, Alone::Decoder)?;
        let parallel = alone(dir, &images, &input, workers, Alone::Decoder)?;
        let sampler = alone(dir, &images, &input, workers, Alone::Sampler)?;
        let (rate, stats, planned) = epoch(dir, &config, dataset.raw_bytes())?;
        rows.push(Row { single, parallel, sampler, rate, stats, planned });
    }
    let column = |f: &dyn Fn(&Row) -> f64| median(rows.iter().map(f).collect());
    Ok(EncodedReport {
        images: dataset.len(),
        decoder_images: images.len() as u64,
        rounds: rows.len(),
        workers,
        decoder_images_per_s: column(&|r| r.single),
        parallel_decoder_images_per_s: column(&|r| r.parallel),
        images_per_s: column(&|r| r.rate),
        vs_decoder_limit: column(&|r| r.rate / (r.single * workers as f64)),
        vs_parallel_decoder: column(&|r| r.rate / r.parallel),
        parallel_sampler_images_per_s: column(&|r| r.sampler),
        vs_parallel_sampler: column(&|r| r.rate / r.sampler),
        map_share: column(&|r| r.stats.map_s / (r.stats.wall_s * workers as f64).max(1e-9)),
        peak_bytes: rows.iter().map(|r| r.stats.peak_bytes).max().unwrap_or(0),
        planned_bytes: rows.iter().map(|r| r.planned).max().unwrap_or(0),
    })
}

/// One round's rates: the decoder on one thread and on the workers' count, the samples alone
/// on the workers' count, the pipeline.
struct Row {
    single: f64,
    parallel: f64,
    sampler: f64,
    rate: f64,
    stats: crate::PipelineStats,
    planned: u64,
}

/// What [`alone`] runs on each image.
#[derive(Clone, Copy)]
enum Alone {
    /// Decodes as much of it as its crop needs.
    Decoder,
    /// Makes its sample: decodes, resamples, flips, lays it out.
    Sampler,
}

/// Runs `what` on every image once on `threads` threads, each taking the next, with the crops
/// of `input` drawn as the pipeline draws them: images per second.
fn alone(
    dir: &Path,
    images: &[Vec<u8>],
    input: &ImageInput,
    threads: usize,
    what: Alone,
) -> Result<f64> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    let size = (input.height, input.width);
    std::thread::scope(|scope| {
        let decoders: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let (mut decoder, mut sampler) = (Decoder::default(), ImageSampler::new());
                    let mut sample = vec![0f32; input.elements()];
                    let order = std::sync::atomic::Ordering::Relaxed;
                    loop {
                        let index = next.fetch_add(1, order);
                        let Some(stored) = images.get(index) else { break };
                        let mut rng = crate::rng::Rng::new(index as u64);
                        if let Alone::Sampler = what {
                            let affine = (1.0 / 255.0, 0.0);
                            sampler.sample(stored, input, affine, &mut rng, &mut sample)?;
                            continue;
                        }
                        let (info, encoded) = ImageInfo::stored(stored)?;
                        let region = input.crop.region(info.width, info.height, &mut rng);
                        decoder.decode_region(&info, encoded, input.channels, region, size)?;
                    }
                    Ok(())
                })
            })
            .collect();
        decoders.into_iter().try_for_each(|d| {
            d.join().unwrap_or_else(|p| std::panic::resume_unwind(p)).map_err(|w| fail(dir, w))
        })
    })?;
    Ok(images.len() as f64 / started.elapsed().as_secs_f64())
}

/// What [`measure_decoded`] found.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DecodedReport {
    /// Images per epoch.
    pub images: u64,
    /// Epochs timed (after one that fills the cache).
    pub epochs: usize,
    /// Worker threads.
    pub workers: usize,
    /// The median epoch's images per second.
    pub images_per_s: f64,
    /// The same in bytes of `u8` pixels per second.
    pub pixel_bytes_per_s: f64,
}

/// Measures a pipeline over small images stored decoded (a dense `u8[C, H, W]` input at
/// `dir`): random crop after padding by 4, horizontal flip and batches of `batch` on
/// `workers` threads, the dataset cached in memory; the median of `epochs` (at least 3)
/// epochs after the first.
pub fn measure_decoded(
    dir: &Path,
    batch: usize,
    workers: usize,
    epochs: usize,
) -> Result<DecodedReport> {
    let dataset = Dataset::open(dir)?;
    let feature = input_feature(
        &dataset,
        dir,
        |kind| matches!(kind, Kind::Dense { shape } if shape.len() == 3),
    )?;
    let elements = feature.elements().unwrap_or(0) as f64;
    let config = PipelineConfig {
        input: feature.name.clone(),
        batch_size: batch,
        workers,
        cache: true,
        ..Default::default()
    };
    let transforms: Vec<Box<dyn crate::Transform>> = vec![
        Box::new(crate::Normalize::pixels(0.0, 1.0)),
        Box::new(RandomCrop { padding: 4 }),
        Box::new(RandomFlip { horizontal: true, vertical: false, p: 0.5 }),
    ];
    let mut pipeline = Pipeline::new(dir, config, transforms)?;
    let per_epoch = pipeline.batches_per_epoch();
    let mut rates = Vec::new();
    for epoch in 0..=epochs.max(3) {
        let started = Instant::now();
        let mut images = 0;
        for _ in 0..per_epoch {
            images += pipeline.next_batch()?.len();
        }
        if epoch > 0 {
            rates.push(images as f64 / started.elapsed().as_secs_f64());
        }
    }
    let images_per_s = median(rates.clone());
    Ok(DecodedReport {
        images: per_epoch * batch as u64,
        epochs: rates.len(),
        workers,
        images_per_s,
        pixel_bytes_per_s: images_per_s * elements,
    })
}

/// One epoch of a new pipeline over a dataset of `raw_bytes`: images per second, its counters,
/// and what its plan holds (see [`EncodedReport::planned_bytes`]).
fn epoch(
    dir: &Path,
    config: &PipelineConfig,
    raw_bytes: u64,
) -> Result<(f64, crate::PipelineStats, u64)> {
    let started = Instant::now();
    let mut pipeline = Pipeline::new(dir, config.clone(), Vec::new())?;
    let mut images = 0;
    for _ in 0..pipeline.batches_per_epoch() {
        images += pipeline.next_batch()?.len();
    }
    let rate = images as f64 / started.elapsed().as_secs_f64();
    let cache = if pipeline.caches_everything() { raw_bytes } else { 0 };
    Ok((rate, pipeline.stats(), pipeline.minimum_bytes() + cache))
}

/// Encoded bytes of the images the decoder alone is measured on, held in memory: enough for
/// a steady rate, bounded for a user's dataset of any size.
const DECODER_SAMPLE_BYTES: usize = 256 << 20;

/// The stored images of the dataset's image feature, in memory, from the first up to
/// [`DECODER_SAMPLE_BYTES`] in all.
fn stored_images(dataset: &Dataset) -> Result<Vec<Vec<u8>>> {
    let dir = dataset.dir();
    let name = input_feature(dataset, dir, |kind| *kind == Kind::Image)?.name.clone();
    let (mut images, mut bytes) = (Vec::new(), 0);
    for block in dataset.blocks() {
        let block = block?;
        for row in 0..block.len() {
            if bytes >= DECODER_SAMPLE_BYTES {
                return Ok(images);
            }
            images.push(block.bytes(&name, row)?.to_vec());
            bytes += images.last().map_or(0, Vec::len);
        }
    }
    Ok(images)
}

fn input_feature<'a>(
    dataset: &'a Dataset,
    dir: &Path,
    wanted: impl Fn(&Kind) -> bool,
) -> Result<&'a crate::Feature> {
    dataset.schema().features().iter().find(|f| wanted(&f.kind)).ok_or_else(|| Error::Config {
        field: "input",
        what: format!("{} has no feature of the kind this measurement reads", dir.display()),
    })
}

fn fail(dir: &Path, what: String) -> Error {
    Error::Config { field: "input", what: format!("an image of {}: {what}", dir.display()) }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}
