//! `dp data`: import, inspect, preview, verify, export, upload and generate datasets. The
//! logic lives in dp-data; this parses arguments and prints.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use dp_data::{Dataset, WriterOptions};
use dp_mem::ByteSize;

use crate::data_bench::Bench;
use crate::preview::Preview;

#[derive(Subcommand)]
pub(crate) enum DataCmd {
    /// Import NumPy, IDX, CSV, TFRecord or svmlight files, or an image folder, into a new
    /// dataset (svmlight train and test files at one width: --split); or text files into
    /// token datasets OUT/train and OUT/eval (--format text).
    Import(Box<ImportArgs>),
    /// Write every dense feature of a dataset to one .npy file each.
    Export {
        /// Output format: npy (dense features), svmlight or npz (a sparse feature).
        #[arg(long, value_enum, default_value_t = ExportFormat::Npy)]
        format: ExportFormat,
        /// The dataset directory.
        dir: PathBuf,
        /// Directory for the .npy files; the file, for svmlight and npz.
        #[arg(long)]
        out: PathBuf,
        /// Export only these features (comma-separated), in this order; for svmlight and
        /// npz, the sparse feature (default: the only one).
        #[arg(long, value_delimiter = ',')]
        features: Option<Vec<String>>,
    },
    /// Write the built-in synthetic digits dataset: OUT/train and OUT/eval.
    Gen {
        /// Directory for the two splits.
        #[arg(long)]
        out: PathBuf,
        /// Training records.
        #[arg(long, default_value_t = 60_000)]
        records: u64,
        /// Held-out evaluation records.
        #[arg(long, default_value_t = 10_000)]
        eval_records: u64,
        /// Seed of every record's randomness.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Write a folder of synthetic JPEG photographs, OUT/class-K/N.jpg, whose class shows in
    /// their colour and stripes: an image folder to try `data import --format images` on, and
    /// the image benchmark's input.
    Photos {
        /// The folder to write (new, or empty).
        #[arg(long)]
        out: PathBuf,
        /// Classes, 1 to 8.
        #[arg(long, default_value_t = 4)]
        classes: usize,
        /// Photographs per class.
        #[arg(long, default_value_t = 250)]
        per_class: usize,
        /// The least and most pixels of a side, LEAST,MOST.
        #[arg(long, value_parser = parse_sides, default_value = "300,650")]
        sides: (u32, u32),
        /// JPEG quality, 1 to 100.
        #[arg(long, default_value_t = 90)]
        quality: u8,
        /// Seed of every photograph's randomness.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Print a dataset's schema, size and compression ratio.
    Inspect {
        /// The dataset directory.
        dir: PathBuf,
    },
    /// Write a grid of the samples training makes of an image dataset (PNG), to check the
    /// augmentation by eye.
    Preview {
        /// The dataset directory.
        dir: PathBuf,
        /// The PNG to write; `-` for standard output.
        #[arg(long)]
        out: PathBuf,
        /// The samples' side (default: the trainer's, from the images' sizes).
        #[arg(long, value_name = "PIXELS")]
        image_size: Option<usize>,
        /// Samples in the grid, 8 to a row.
        #[arg(long, default_value_t = 32)]
        count: usize,
        /// How samples are cut, as `train --crop` says (default: the trainer's, by the
        /// samples' size).
        #[arg(long, value_name = "POLICY")]
        crop: Option<dp_train::CropPolicy>,
        /// Augmentations, as `train --augment` says (default: the trainer's for the size).
        #[arg(long, value_parser = crate::train::parse_augment, value_name = "LIST")]
        augment: Option<crate::train::AugmentList>,
        /// Show evaluation's samples instead of training's.
        #[arg(long)]
        eval: bool,
        /// Seed of the crops and flips (a run's `seed` shows its first samples).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Measure the training pipeline on an image dataset: the trainer's crops and flips at
    /// its sample size (or --image-size), in batches, against the decoder alone and the
    /// samples alone; prints one JSON line (`images_per_s`, `decoder_images_per_s`,
    /// `parallel_sampler_images_per_s`, peak memory).
    Bench {
        /// The dataset directory.
        dir: PathBuf,
        /// The samples' side (default: the trainer's, from the images' sizes).
        #[arg(long, value_name = "PIXELS")]
        image_size: Option<usize>,
        /// Images per batch.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Worker threads (default: one per core).
        #[arg(long)]
        workers: Option<usize>,
        /// Epochs timed (at least 3).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// Copy a dataset (or a directory of datasets, such as `data gen`'s train and eval) to
    /// object storage, `s3://bucket/prefix` (credentials and endpoint from the usual AWS_*
    /// variables), shards first and each manifest last.
    Upload {
        /// The dataset directory, or a directory whose subdirectories are datasets.
        dir: PathBuf,
        /// Where to write it: `s3://bucket/prefix`, `gs://...`, `az://...`.
        url: String,
    },
    /// Check every shard's hash and every block; exit non-zero naming each problem.
    Verify {
        /// The dataset directory.
        dir: PathBuf,
    },
}

/// Writer options shared by the commands that write datasets.
#[derive(Args, Clone)]
pub(crate) struct WriteArgs {
    /// Uncompressed bytes per block.
    #[arg(long, default_value_t = 256 << 10)]
    block_size: usize,
    /// Bytes per shard file.
    #[arg(long, default_value_t = 256 << 20)]
    shard_size: u64,
    /// zstd level (1-19).
    #[arg(long, default_value_t = 3)]
    level: i32,
    /// Compression threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Keep NaN and infinite float values (by default an input with any is refused, with
    /// their count and the first one's record).
    #[arg(long)]
    allow_nonfinite: bool,
    /// Where completed shards go instead of staying on disk (set for `--out s3://...`).
    #[arg(skip)]
    shard_sink: Option<dp_data::ShardSink>,
}

impl ImportArgs {
    /// Where `path` (under `--out`) is for the user: the URL it is uploaded to, with
    /// `--out s3://...`.
    fn shown(&self, path: &Path) -> String {
        match &self.written_for {
            Some((root, url)) => match path.strip_prefix(root) {
                Ok(rest) if rest.as_os_str().is_empty() => url.clone(),
                Ok(rest) => format!("{url}/{}", rest.display()),
                Err(_) => path.display().to_string(),
            },
            None => path.display().to_string(),
        }
    }
}

impl WriteArgs {
    pub(crate) fn options(&self) -> WriterOptions {
        let mut options = WriterOptions::default();
        options.block_size = self.block_size;
        options.shard_size = self.shard_size;
        options.level = self.level;
        if let Some(threads) = self.threads {
            options.threads = threads;
        }
        options.allow_nonfinite = self.allow_nonfinite;
        options.shard_sink = self.shard_sink.clone();
        options
    }
}

/// Input formats `data import` reads.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum ImportFormat {
    /// NumPy .npy arrays, one per feature (first axis = records).
    Npy,
    /// MNIST-style IDX files: images, then optionally labels.
    Idx,
    /// CSV with a header row and numeric columns.
    Csv,
    /// TFRecord files of tf.train.Example (plain or GZIP).
    Tfrecord,
    /// svmlight / libsvm text (`label [qid:N] index:value ...`), into a sparse feature `x`.
    Svmlight,
    /// An image folder, ROOT/<class>/<file>.{jpg,jpeg,png}, into `image` (kept as encoded)
    /// and `label` (the class, by sorted folder name).
    Images,
    /// Text files (plain or gzip), tokenized into token datasets OUT/train (the head of the
    /// stream) and OUT/eval (its last --eval-fraction), with the tokenizer inside.
    Text,
}

/// Output formats `data export` writes.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum ExportFormat {
    /// One .npy file per dense feature.
    Npy,
    /// The sparse feature and the label as svmlight text (--out is the file).
    Svmlight,
    /// The sparse feature in SciPy's CSR layout, for scipy.sparse.load_npz (--out is the file).
    Npz,
}

/// TFRecord compression as given on the command line.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Compression {
    /// Detect per file.
    Auto,
    /// Uncompressed.
    None,
    /// GZIP.
    Gzip,
}

#[derive(Args)]
pub(crate) struct ImportArgs {
    /// Input format.
    #[arg(long, value_enum)]
    format: ImportFormat,
    /// Input files: for idx, the images then (optionally) the labels; for csv, one file; for
    /// tfrecord and svmlight, any number; for npy, `NAME=PATH` pairs (or use --feature).
    inputs: Vec<String>,
    /// Output dataset directory (with --split, the directory of the splits' datasets).
    #[arg(long)]
    out: PathBuf,
    /// With `--out s3://...`: the local directory written instead, and the URL it stands for.
    #[arg(skip)]
    written_for: Option<(PathBuf, String)>,
    /// svmlight: a split and its file, `NAME=PATH` (repeatable; a NAME given again takes
    /// more files): each split becomes the dataset OUT/NAME, and all get one width, as
    /// scikit-learn's load_svmlight_files gives them (`--split train=a.svm --split
    /// test=a.t.svm`).
    #[arg(long = "split", value_name = "NAME=PATH")]
    splits: Vec<String>,
    /// npy: a feature and its array, `NAME=PATH` (repeatable).
    #[arg(long = "feature", value_name = "NAME=PATH")]
    features: Vec<String>,
    /// npy: store float64 arrays as float32.
    #[arg(long)]
    narrow_f64: bool,
    /// csv: the column that becomes the scalar `label`.
    #[arg(long)]
    label: Option<String>,
    /// csv: the columns that become the `features` vector (comma-separated; default: all but
    /// the label).
    #[arg(long, value_delimiter = ',')]
    columns: Option<Vec<String>>,
    /// csv: the field separator (one ASCII character).
    #[arg(long, default_value_t = ',')]
    delimiter: char,
    /// svmlight: the width of `x` (default: from the largest index of the files imported
    /// together; import a train and a test file with --split, or give the same width to each
    /// import, so that they get one width).
    #[arg(long, value_name = "N")]
    width: Option<usize>,
    /// svmlight: whether the first index is 0 (true) or 1 (false); default: 1 unless some
    /// index is 0, as scikit-learn's zero_based="auto".
    #[arg(long, value_name = "BOOL")]
    zero_based: Option<bool>,
    /// tfrecord: a key read as tf.io.VarLenFeature into a sparse feature, `KEY,WIDTH`
    /// (repeatable): an int64 list is a bag of ids below WIDTH, a float list a vector of at
    /// most WIDTH values.
    #[arg(long = "var-len", value_name = "KEY,WIDTH")]
    var_len: Vec<String>,
    /// tfrecord: index and value keys read as tf.io.SparseFeature into the sparse feature
    /// NAME, `NAME,INDEX_KEY,VALUE_KEY,WIDTH` (repeatable).
    #[arg(long = "sparse-feature", value_name = "NAME,INDEX_KEY,VALUE_KEY,WIDTH")]
    sparse_features: Vec<String>,
    /// tfrecord: a bytes key read as encoded images (JPEG or PNG) into an image feature
    /// (repeatable); a key whose first value is a JPEG or PNG is one without it.
    #[arg(long = "image", value_name = "KEY")]
    images: Vec<String>,
    /// tfrecord: compression of the inputs.
    #[arg(long, value_enum, default_value_t = Compression::Auto)]
    compression: Compression,
    /// images: resize images with a longer side once, here, to that side (and encode them
    /// again), bounding the dataset's size and each epoch's decoding.
    #[arg(long, value_name = "N")]
    max_side: Option<u32>,
    /// images: store the images decoded at --image-size (for CIFAR-sized data, where reading
    /// pixels costs less than decoding them).
    #[arg(long, requires = "image_size")]
    decoded: bool,
    /// images: with --decoded, the side every image is resized to.
    #[arg(long, value_name = "S", requires = "decoded")]
    image_size: Option<usize>,
    /// images: skip files that are not readable images (and list them) instead of failing
    /// (refused with other formats, whose imports stop at the first bad record).
    #[arg(long)]
    skip_corrupt: bool,
    /// text: `bytes` (each byte a token, any bytes), `bpe:VOCAB_SIZE` (train a GPT-2-style
    /// byte-level BPE on the files first), or the path of a tokenizer.json to use.
    #[arg(long, value_name = "bytes|bpe:N|PATH", default_value = "bytes")]
    tokenizer: String,
    /// text: the share of the token stream held out as OUT/eval, its tail.
    #[arg(long, value_name = "F", default_value_t = 0.1)]
    eval_fraction: f64,
    #[command(flatten)]
    write: WriteArgs,
}

/// `--sides LEAST,MOST`.
fn parse_sides(text: &str) -> std::result::Result<(u32, u32), String> {
    let parse = |s: &str| s.trim().parse::<u32>().map_err(|e| format!("`{s}`: {e}"));
    match text.split_once(',') {
        Some((least, most)) => Ok((parse(least)?, parse(most)?)),
        None => Err(format!("`{text}`: give LEAST,MOST")),
    }
}

pub(crate) fn run(cmd: DataCmd) -> Result<ExitCode> {
    match cmd {
        DataCmd::Import(mut args) if dp_data::is_object_url(&args.out) => {
            // Each shard is uploaded once written and removed from the disk, which holds one
            // at a time; each dataset's manifest goes up last.
            let url = args.out.to_string_lossy().trim_end_matches('/').to_string();
            let staging = tempfile::Builder::new().prefix("dp-import-").tempdir()?;
            let root = staging.path().join("dataset");
            args.write.shard_sink = Some(dp_data::upload_sink(&root, &url)?);
            args.out = root.clone();
            args.written_for = Some((root.clone(), url.clone()));
            let code = import(*args)?;
            for (dir, _) in datasets_in(&root, &url)? {
                dp_data::upload_manifest(&root, &dir, &url)?;
            }
            // Files beside the datasets (a BPE's tokenizer.json) go too.
            for entry in std::fs::read_dir(&root)? {
                let path = entry?.path();
                if let (true, Some(name)) = (path.is_file(), path.file_name()) {
                    dp_data::upload_file(&path, &format!("{url}/{}", name.to_string_lossy()))?;
                }
            }
            Ok(code)
        }
        DataCmd::Import(args) => import(*args),
        DataCmd::Upload { dir, url } => upload(&dir, &url).map(|()| ExitCode::SUCCESS),
        DataCmd::Export {
            format: format @ (ExportFormat::Svmlight | ExportFormat::Npz),
            dir,
            out,
            features,
        } => {
            let sparse = dp_data::SparseExport {
                feature: features.and_then(|f| f.into_iter().next()),
                ..Default::default()
            };
            let records = match format {
                ExportFormat::Svmlight => dp_data::export_svmlight(&dir, &out, &sparse)?,
                _ => dp_data::export_npz(&dir, &out, &sparse)?,
            };
            println!("{records} records exported to {}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        DataCmd::Export { format: ExportFormat::Npy, dir, out, features } => {
            let summary = dp_data::export_npy(&dir, &out, &dp_data::ExportOptions { features })?;
            for (name, path) in &summary.written {
                println!("{name:<20} -> {}", path.display());
            }
            for (name, why) in &summary.skipped {
                println!("{name:<20} skipped: {why}");
            }
            println!("{} records exported", summary.records);
            Ok(ExitCode::SUCCESS)
        }
        DataCmd::Gen { out, records, eval_records, seed, write } => {
            let spec = dp_data::SyntheticDigits { records, eval_records, seed };
            let (train, eval) = dp_data::generate_digits(&out, &spec, write.options())?;
            println!(
                "{}: train {} records ({}), eval {} records ({})",
                out.display(),
                train.records,
                ByteSize(train.bytes()),
                eval.records,
                ByteSize(eval.bytes())
            );
            Ok(ExitCode::SUCCESS)
        }
        DataCmd::Inspect { dir } => inspect(&dir),
        DataCmd::Verify { dir } => verify(&dir),
        DataCmd::Photos { out, classes, per_class, sides, quality, seed } => {
            let spec = dp_data::SyntheticPhotos { classes, per_class, sides, quality, seed };
            let written = dp_data::generate_photo_folder(&out, &spec)?;
            println!("{}: {written} photographs in {classes} class folders", out.display());
            Ok(ExitCode::SUCCESS)
        }
        DataCmd::Bench { dir, image_size, batch, workers, rounds } => {
            let bench = Bench { dir: &dir, size: image_size, batch, workers, rounds };
            crate::data_bench::bench(&bench).map(|()| ExitCode::SUCCESS)
        }
        DataCmd::Preview { dir, out, image_size, crop, augment, count, eval, seed } => {
            let size = image_size;
            let preview = Preview { dir: &dir, out: &out, size, crop, augment, count, eval, seed };
            crate::preview::preview(&preview).map(|()| ExitCode::SUCCESS)
        }
    }
}

fn open(dir: &PathBuf) -> Result<Dataset> {
    Dataset::open(dir).with_context(|| format!("cannot open the dataset in {}", dir.display()))
}

fn inspect(dir: &PathBuf) -> Result<ExitCode> {
    let dataset = open(dir)?;
    let m = dataset.manifest();
    println!("dataset   {}", dir.display());
    println!("format    {} v{}", m.format, m.version);
    println!("schema    {}", m.schema);
    println!("records   {}", m.records);
    println!(
        "shards    {} ({} blocks of ~{}, zstd level {})",
        m.shards.len(),
        dataset.block_count(),
        ByteSize(m.block_size as u64),
        m.level
    );
    println!("on disk   {} ({} uncompressed)", ByteSize(m.bytes()), ByteSize(m.raw_bytes()));
    let ratio = if m.bytes() == 0 { 0.0 } else { m.raw_bytes() as f64 / m.bytes() as f64 };
    println!("ratio     {ratio:.2}x");
    for (name, counts) in &m.sparse {
        let elements = m.schema.feature(name).and_then(|f| f.elements()).unwrap_or(0);
        println!(
            "sparse    {name}: {} non-zeros, {:.3}% dense, at most {} in a record",
            counts.nnz,
            100.0 * counts.density(elements, m.records),
            counts.max_per_record
        );
    }
    for (name, images) in &m.images {
        println!(
            "images    {name}: {} ({} JPEG, {} PNG), {} in color; width {}..{}, height {}..{}; {} each on average",
            images.images,
            images.jpeg,
            images.png,
            images.color,
            images.width.0,
            images.width.1,
            images.height.0,
            images.height.1,
            ByteSize(images.bytes / images.images.max(1))
        );
        let sides: Vec<String> = (images.sides.iter().enumerate())
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{}-{}: {n}", 1u64 << k, (2u64 << k) - 1))
            .collect();
        println!("          shorter side {}", sides.join(", "));
    }
    for (name, classes) in &m.classes {
        let shown: Vec<&str> = classes.iter().take(10).map(String::as_str).collect();
        let more = if classes.len() > 10 { ", ..." } else { "" };
        println!("classes   {name}: {} ({}{more})", classes.len(), shown.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

fn verify(dir: &PathBuf) -> Result<ExitCode> {
    let dataset = open(dir)?;
    let problems = dataset.verify();
    if problems.is_empty() {
        println!(
            "{}: sound ({} records, {} shards, {} blocks)",
            dir.display(),
            dataset.len(),
            dataset.manifest().shards.len(),
            dataset.block_count()
        );
        return Ok(ExitCode::SUCCESS);
    }
    for problem in &problems {
        eprintln!("{problem}");
    }
    eprintln!("{}: {} problem(s) found", dir.display(), problems.len());
    Ok(ExitCode::FAILURE)
}

/// Uploads the dataset in `dir`, or each dataset in its subdirectories, under `url`.
fn upload(dir: &Path, url: &str) -> Result<()> {
    let url = url.trim_end_matches('/');
    if !dp_data::is_object_url(Path::new(url)) {
        bail!("`{url}` is not an object storage URL (s3://bucket/prefix, gs://, az://)");
    }
    for (dir, url) in datasets_in(dir, url)? {
        let summary = dp_data::upload_dataset(&dir, &url)?;
        println!(
            "{} -> {url}: {} records in {} shards ({})",
            dir.display(),
            summary.records,
            summary.shards,
            ByteSize(summary.bytes)
        );
    }
    Ok(())
}

/// The dataset in `dir`, or each dataset in its subdirectories, and where it goes under `url`.
fn datasets_in(dir: &Path, url: &str) -> Result<Vec<(PathBuf, String)>> {
    let mut datasets = Vec::new();
    if dir.join(dp_data::MANIFEST_FILE).is_file() {
        datasets.push((dir.to_path_buf(), url.to_string()));
    } else {
        let entries = std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))?;
        for entry in entries {
            let path = entry?.path();
            if path.join(dp_data::MANIFEST_FILE).is_file()
                && let Some(name) = path.file_name().and_then(|n| n.to_str())
            {
                datasets.push((path.clone(), format!("{url}/{name}")));
            }
        }
        datasets.sort();
    }
    if datasets.is_empty() {
        bail!(
            "{}: neither a dataset nor a directory of datasets (no manifest.json)",
            dir.display()
        );
    }
    Ok(datasets)
}

fn import(args: ImportArgs) -> Result<ExitCode> {
    // Only the image-folder importer can skip an input and go on; elsewhere the flag would
    // promise what the import does not do (a bad record stops it, naming it).
    if args.skip_corrupt && !matches!(args.format, ImportFormat::Images) {
        bail!(
            "--skip-corrupt is for --format images (image folders); a {} import stops at the \
             first bad record, naming its file and offset: remove that record from the input, \
             or leave out --skip-corrupt",
            args.format.to_possible_value().map_or("other".into(), |v| v.get_name().to_string())
        );
    }
    if !args.splits.is_empty() {
        return import_splits(&args);
    }
    if matches!(args.format, ImportFormat::Text) {
        return import_text(&args);
    }
    let options = args.write.options();
    let out = &args.out;
    let shown = args.shown(out);
    let manifest = match args.format {
        ImportFormat::Npy => {
            let mut features = Vec::new();
            for pair in args.features.iter().chain(&args.inputs) {
                let Some((name, path)) = pair.split_once('=') else {
                    bail!("npy inputs are NAME=PATH pairs, got `{pair}`");
                };
                features.push((name.to_string(), PathBuf::from(path)));
            }
            dp_data::import_npy(&features, out, args.narrow_f64, options)?
        }
        ImportFormat::Idx => match args.inputs.as_slice() {
            [images] => dp_data::import_idx(images.as_ref(), None, out, options)?,
            [images, labels] => {
                dp_data::import_idx(images.as_ref(), Some(labels.as_ref()), out, options)?
            }
            _ => bail!("idx takes the images file and optionally the labels file"),
        },
        ImportFormat::Csv => {
            let [path] = args.inputs.as_slice() else { bail!("csv takes exactly one input file") };
            let csv = dp_data::CsvOptions {
                label: args.label,
                columns: args.columns,
                delimiter: csv_delimiter(args.delimiter)?,
                ..Default::default()
            };
            dp_data::import_csv(path.as_ref(), out, &csv, options)?
        }
        ImportFormat::Tfrecord => {
            if args.inputs.is_empty() {
                bail!("tfrecord takes one or more input files");
            }
            let paths: Vec<PathBuf> = args.inputs.iter().map(PathBuf::from).collect();
            let compression = match args.compression {
                Compression::Auto => dp_data::TfRecordCompression::Auto,
                Compression::None => dp_data::TfRecordCompression::None,
                Compression::Gzip => dp_data::TfRecordCompression::Gzip,
            };
            let tf = dp_data::TfRecordOptions {
                compression,
                var_len: args.var_len.iter().map(|s| var_len(s)).collect::<Result<_>>()?,
                sparse: args
                    .sparse_features
                    .iter()
                    .map(|s| sparse_feature(s))
                    .collect::<Result<_>>()?,
                images: args.images.clone(),
            };
            dp_data::import_tfrecord(&paths, out, &tf, options)?
        }
        ImportFormat::Svmlight => {
            if args.inputs.is_empty() {
                bail!("svmlight takes one or more input files");
            }
            let paths: Vec<&Path> = args.inputs.iter().map(Path::new).collect();
            let svm = dp_data::SvmlightOptions {
                features: args.width,
                zero_based: args.zero_based,
                ..Default::default()
            };
            dp_data::import_svmlight(&paths, out, &svm, options)?
        }
        ImportFormat::Images => {
            let [root] = args.inputs.as_slice() else {
                bail!("images takes one folder, ROOT/<class>/<file>.jpg")
            };
            let images = dp_data::ImageFolderOptions {
                max_side: args.max_side,
                decoded: args.image_size.filter(|_| args.decoded),
                skip_corrupt: args.skip_corrupt,
            };
            let report = dp_data::import_image_folder(root.as_ref(), out, &images, options)?;
            for (path, why) in &report.skipped {
                eprintln!("skipped {} ({why})", path.display());
            }
            println!(
                "{} classes: {}{}; {} skipped, {} resized to --max-side",
                report.classes.len(),
                report.classes.iter().take(8).cloned().collect::<Vec<_>>().join(", "),
                if report.classes.len() > 8 { ", ..." } else { "" },
                report.skipped.len(),
                report.resized
            );
            report.manifest
        }
        ImportFormat::Text => unreachable!("imported by import_text"),
    };
    println!(
        "{shown}: {} records, schema {}, {} shards, {}",
        manifest.records,
        manifest.schema,
        manifest.shards.len(),
        ByteSize(manifest.bytes())
    );
    Ok(ExitCode::SUCCESS)
}

/// `data import --format svmlight --split NAME=PATH ... --out DIR`: every split into
/// DIR/NAME, at one width.
fn import_splits(args: &ImportArgs) -> Result<ExitCode> {
    if !matches!(args.format, ImportFormat::Svmlight) {
        bail!(
            "--split is for svmlight files, whose width is inferred (and must be shared); import other formats one command per split"
        );
    }
    if !args.inputs.is_empty() {
        bail!(
            "give the files with --split NAME=PATH only (not also as inputs: {})",
            args.inputs.join(" ")
        );
    }
    let splits = split_files(&args.splits)?;
    let outs: Vec<PathBuf> = splits.iter().map(|(name, _)| args.out.join(name)).collect();
    let files: Vec<Vec<&Path>> =
        splits.iter().map(|(_, paths)| paths.iter().map(Path::new).collect()).collect();
    let pairs: Vec<(&Path, &[&Path])> =
        outs.iter().map(PathBuf::as_path).zip(files.iter().map(Vec::as_slice)).collect();
    let svm = dp_data::SvmlightOptions {
        features: args.width,
        zero_based: args.zero_based,
        ..Default::default()
    };
    let manifests = dp_data::import_svmlight_splits(&pairs, &svm, args.write.options())?;
    for (out, manifest) in outs.iter().zip(&manifests) {
        println!(
            "{}: {} records, schema {}, {} shards, {}",
            args.shown(out),
            manifest.records,
            manifest.schema,
            manifest.shards.len(),
            ByteSize(manifest.bytes())
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `data import --format text FILES... --out DIR`: DIR/train and DIR/eval.
fn import_text(args: &ImportArgs) -> Result<ExitCode> {
    if args.inputs.is_empty() {
        bail!("text takes one or more input files");
    }
    let paths: Vec<&Path> = args.inputs.iter().map(Path::new).collect();
    let options = dp_data::TextOptions {
        tokenizer: args.tokenizer.parse()?,
        eval_fraction: args.eval_fraction,
    };
    let out = &args.out;
    let progress = ImportProgress::new();
    let report = |p: dp_data::TextProgress| progress.show(p);
    let r =
        dp_data::import_text_with_progress(&paths, out, &options, args.write.options(), &report)?;
    println!(
        "{}: {} file(s), {} bytes of text -> {} tokens ({}, vocabulary {}, stored as {}), {:.3} \
         bytes per token",
        args.shown(out),
        r.files,
        r.text_bytes,
        r.tokens,
        r.tokenizer,
        r.vocab_size,
        r.width,
        r.bytes_per_token
    );
    for (name, tokens, manifest) in
        [("train", r.train_tokens, &r.train), ("eval", r.eval_tokens, &r.eval)]
    {
        println!(
            "  {name:<5} {tokens} tokens -> {} ({})",
            args.shown(&out.join(name)),
            ByteSize(manifest.bytes())
        );
    }
    if let Some(path) = &r.tokenizer_json {
        println!("  vocabulary -> {}", args.shown(path));
    }
    let rate = r.text_bytes as f64 / r.seconds.max(1e-9) / 1e6;
    let training = if r.train_seconds > 0.0 {
        format!(", of which {:.2} s training the BPE", r.train_seconds)
    } else {
        String::new()
    };
    println!("  {:.2} s, {rate:.1} MB/s of text{training}", r.seconds);
    Ok(ExitCode::SUCCESS)
}

/// A long text import's progress on standard error: a line every few seconds once it has
/// run that long (a short import prints none), so that a BPE's training is seen to move.
struct ImportProgress {
    started: std::time::Instant,
    /// When a line was last printed (the start until then).
    last: std::sync::Mutex<std::time::Instant>,
}

impl ImportProgress {
    /// Seconds between lines.
    const EVERY_S: f64 = 3.0;

    fn new() -> Self {
        let now = std::time::Instant::now();
        ImportProgress { started: now, last: std::sync::Mutex::new(now) }
    }

    fn show(&self, p: dp_data::TextProgress) {
        let Ok(mut last) = self.last.lock() else { return };
        if last.elapsed().as_secs_f64() < Self::EVERY_S {
            return;
        }
        *last = std::time::Instant::now();
        let (what, unit) = match p.stage {
            dp_data::TextStage::TrainBpe => ("training the BPE", "bytes of text"),
            dp_data::TextStage::Encode => ("encoding", "bytes of text"),
            _ => ("writing", "tokens"),
        };
        let percent = 100.0 * p.done as f64 / p.total.max(1) as f64;
        eprintln!(
            "{:>6.0} s  {what}: {} of {} {unit} ({percent:.0}%)",
            self.started.elapsed().as_secs_f64(),
            p.done,
            p.total
        );
    }
}

/// `--split NAME=PATH` options as splits in order of first mention, each with its files.
fn split_files(specs: &[String]) -> Result<Vec<(String, Vec<String>)>> {
    let mut splits: Vec<(String, Vec<String>)> = Vec::new();
    for spec in specs {
        let Some((name, path)) = spec.split_once('=') else {
            bail!("--split `{spec}`: expected NAME=PATH (as train=a.svm)");
        };
        // The name becomes one directory under --out, never a path elsewhere.
        let plain = Path::new(name).components().count() == 1
            && matches!(Path::new(name).components().next(), Some(std::path::Component::Normal(_)));
        if !plain {
            bail!("--split `{spec}`: the name `{name}` must be a plain directory name (as train)");
        }
        if path.is_empty() {
            bail!("--split `{spec}`: no file after `=`");
        }
        match splits.iter_mut().find(|(n, _)| n == name) {
            Some((_, paths)) => paths.push(path.to_string()),
            None => splits.push((name.to_string(), vec![path.to_string()])),
        }
    }
    Ok(splits)
}

/// `--var-len KEY,WIDTH`.
fn var_len(text: &str) -> Result<dp_data::VarLenFeature> {
    let Some((key, width)) = text.rsplit_once(',') else {
        bail!("--var-len `{text}`: expected KEY,WIDTH");
    };
    let width = width.parse().with_context(|| format!("--var-len `{text}`: the width"))?;
    Ok(dp_data::VarLenFeature { key: key.into(), width })
}

/// `--sparse-feature NAME,INDEX_KEY,VALUE_KEY,WIDTH`.
fn sparse_feature(text: &str) -> Result<dp_data::SparseFeature> {
    let [name, index_key, value_key, width] = text.split(',').collect::<Vec<_>>()[..] else {
        bail!("--sparse-feature `{text}`: expected NAME,INDEX_KEY,VALUE_KEY,WIDTH");
    };
    let width = width.parse().with_context(|| format!("--sparse-feature `{text}`: the width"))?;
    Ok(dp_data::SparseFeature {
        name: name.into(),
        index_key: index_key.into(),
        value_key: value_key.into(),
        width,
    })
}

/// The CSV field separator as the byte it is in the file: an ASCII character. `é` would fit
/// in a `u8` as U+00E9 but is two bytes in a UTF-8 file, so it is refused rather than taken
/// for the byte 0xE9.
fn csv_delimiter(delimiter: char) -> Result<u8> {
    if !delimiter.is_ascii() {
        bail!(
            "--delimiter `{delimiter}` is {} bytes in UTF-8; CSV fields are separated by one ASCII character (`,`, `;`, a tab ...)",
            delimiter.len_utf8()
        );
    }
    Ok(delimiter as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_declarations_parse_or_say_what_is_expected() {
        let v = var_len("tags/id,5000").unwrap();
        assert_eq!((v.key.as_str(), v.width), ("tags/id", 5000));
        assert!(var_len("tags").unwrap_err().to_string().contains("KEY,WIDTH"));
        let s = sparse_feature("x,idx,val,100").unwrap();
        assert_eq!(
            (s.name.as_str(), s.index_key.as_str(), s.value_key.as_str(), s.width),
            ("x", "idx", "val", 100)
        );
        assert!(sparse_feature("x,idx,100").unwrap_err().to_string().contains("NAME,INDEX_KEY"));
        assert!(sparse_feature("x,idx,val,wide").unwrap_err().to_string().contains("the width"));
    }

    #[test]
    fn splits_are_named_once_and_gather_their_files() {
        let specs = ["train=a.svm", "test=t.svm", "train=b.svm"].map(String::from);
        let splits = split_files(&specs).unwrap();
        let expected = [
            ("train".to_string(), vec!["a.svm".to_string(), "b.svm".to_string()]),
            ("test".to_string(), vec!["t.svm".to_string()]),
        ];
        assert_eq!(splits, expected);
        for (spec, what) in [
            ("train", "expected NAME=PATH"),
            ("../x=a.svm", "plain directory name"),
            ("a/b=a.svm", "plain directory name"),
            ("=a.svm", "plain directory name"),
            ("train=", "no file"),
        ] {
            let error = split_files(&[spec.to_string()]).unwrap_err().to_string();
            assert!(error.contains(what), "{spec}: {error}");
        }
    }

    #[test]
    fn a_delimiter_is_one_ascii_byte() {
        assert_eq!(csv_delimiter(';').unwrap(), b';');
        assert_eq!(csv_delimiter('\t').unwrap(), b'\t');
        let error = csv_delimiter('é').unwrap_err().to_string();
        assert!(error.contains("`é` is 2 bytes in UTF-8"), "{error}");
    }
}
