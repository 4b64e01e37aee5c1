//! `data preview`: a grid of the samples training makes of an image dataset, as the model
//! sees them before scaling (crops resampled, flipped), because an augmentation is checked by
//! looking at it.

use std::path::Path;

use anyhow::{Context, Result, bail};
use dp_data::{Dataset, Kind, Pipeline, PipelineConfig};
use image::{ImageEncoder, RgbImage};

/// What `data preview` is asked for.
pub(crate) struct Preview<'a> {
    pub(crate) dir: &'a Path,
    pub(crate) out: &'a Path,
    /// The samples' side (default: the trainer's, from the images' sizes).
    pub(crate) size: Option<usize>,
    /// Samples in the grid.
    pub(crate) count: usize,
    /// How samples are cut (default: the trainer's, by the samples' size).
    pub(crate) crop: Option<dp_train::CropPolicy>,
    /// Training's augmentations (default: the trainer's for encoded images).
    pub(crate) augment: Option<Vec<dp_train::Augmentation>>,
    /// Evaluation's samples instead of training's.
    pub(crate) eval: bool,
    pub(crate) seed: u64,
}

/// Writes `count` samples of the image feature of the dataset at `dir` to `out` (PNG), in
/// rows of up to 8, 2 pixels apart; prints what it wrote. `out` `-` is standard output (as
/// for `predict --out -`), and what was written is then said on standard error.
pub(crate) fn preview(p: &Preview<'_>) -> Result<()> {
    let to_stdout = p.out == Path::new("-");
    // Before the work: the path may hold something that must not be replaced.
    if !to_stdout {
        dp_data::check_output_file(p.out)?;
    }
    if !(1..=256).contains(&p.count) {
        bail!("--count {}: a grid holds 1 to 256 samples", p.count);
    }
    let dataset = Dataset::open(p.dir)?;
    let schema = dataset.schema();
    let Some(feature) = schema.features().iter().find(|f| f.kind == Kind::Image) else {
        bail!("{} has no image feature (its features: {schema})", p.dir.display());
    };
    // The label the manifest names classes of, or else the trainer's default name, or else
    // the first integer scalar: a bytes, float or array feature cannot be the label.
    let integer_scalar = |f: &&dp_data::Feature| {
        !f.dtype.is_float()
            && matches!(&f.kind, Kind::Dense { shape } if shape.iter().product::<usize>() == 1)
    };
    let features = schema.features();
    let label = (features.iter().find(|f| dataset.manifest().classes.contains_key(&f.name)))
        .or_else(|| features.iter().filter(integer_scalar).find(|f| f.name == "label"))
        .or_else(|| features.iter().find(integer_scalar));
    let Some(label) = label else {
        bail!("{} has no integer label feature beside its images", p.dir.display());
    };
    let counts = &dataset.manifest().images[&feature.name];
    let (size, channels) = (p.size.unwrap_or_else(|| counts.sample_size()), counts.channels());
    let mut config = PipelineConfig::default();
    config.input = feature.name.clone();
    config.label = label.name.clone();
    config.batch_size = p.count.min(dataset.len() as usize).max(1);
    config.seed = p.seed;
    // The trainer's own choices and transforms, so the grid is what a run would train on
    // (but for the padded crop's gap, black here and the mean after a run's scaling).
    let crop = p.crop.unwrap_or_else(|| dp_train::CropPolicy::for_side(size));
    crop.check(size).map_err(|why| anyhow::anyhow!("--crop {crop}: {why}"))?;
    let augment =
        p.augment.clone().unwrap_or_else(|| dp_train::Augmentation::defaults_for_images(size));
    let run = dp_train::TrainConfig {
        crop: Some(crop),
        augment: Some(augment),
        ..dp_train::TrainConfig::default()
    };
    let transforms = match p.eval {
        true => Vec::new(),
        false => run.augmentations(),
    };
    for transform in &transforms {
        transform
            .check(&[channels, size, size])
            .map_err(|why| anyhow::anyhow!("{}: {why}", transform.describe()))?;
    }
    config.image = Some(match p.eval {
        true => crop.eval(size, channels),
        false => crop.train(size, channels),
    });
    let mut pipeline = Pipeline::new(p.dir, config, transforms)
        .with_context(|| format!("sample {}", p.dir.display()))?;
    let batch = pipeline.next_batch()?;
    let samples = batch.len();
    let (columns, gap) = (samples.min(8), 2);
    let rows = samples.div_ceil(columns);
    let side = |n: usize| (n * (size + gap) - gap) as u32;
    let mut grid = RgbImage::from_pixel(side(columns), side(rows), image::Rgb([255; 3]));
    let plane = size * size;
    for (k, sample) in batch.x_flat().chunks_exact(channels * plane).enumerate() {
        let (x0, y0) = ((k % columns) * (size + gap), (k / columns) * (size + gap));
        for i in 0..plane {
            let value = |c: usize| sample[c.min(channels - 1) * plane + i].clamp(0.0, 255.0) as u8;
            let (x, y) = ((x0 + i % size) as u32, (y0 + i / size) as u32);
            grid.put_pixel(x, y, image::Rgb([value(0), value(1), value(2)]));
        }
    }
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&grid, grid.width(), grid.height(), image::ExtendedColorType::Rgb8)
        .context("encode the grid")?;
    let what = match p.eval {
        true => format!("evaluation samples (crop {crop})"),
        false => format!("training samples ({})", run.augmentation()),
    };
    let said = format!("{samples} {what} of `{}`, {size}x{size}, seed {}", feature.name, p.seed);
    if to_stdout {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(&png)
            .and_then(|()| stdout.flush())
            .context("write the grid to standard output")?;
        eprintln!("wrote a PNG to standard output ({said})");
        return Ok(());
    }
    dp_data::write_file(p.out, &png)?;
    println!("wrote {} ({said})", p.out.display());
    Ok(())
}
