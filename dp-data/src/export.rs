//! Export of a dataset's dense features to NumPy `.npy` files, so that any import can be
//! round-tripped and compared byte for byte.

use std::fs::{self};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::atomic::AtomicFile;
use crate::npy_format::{npy_descr, npy_header};
use crate::{Dataset, Error, Kind, Result};

/// What [`export_npy`] exports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// The features to export, in this order. `None` exports every dense feature whose dtype
    /// NumPy has and skips the others (bytes, sparse and bf16 features), listing them in
    /// [`ExportSummary::skipped`]; a feature named here that cannot be exported is an error.
    pub features: Option<Vec<String>>,
}

/// What [`export_npy`] wrote and what it left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportSummary {
    /// Records in the dataset, the first dimension of every array written.
    pub records: u64,
    /// The features written and their files.
    pub written: Vec<(String, PathBuf)>,
    /// The features skipped and why.
    pub skipped: Vec<(String, String)>,
}

/// Why `feature` cannot be exported, if it cannot.
fn unsupported(feature: &crate::Feature) -> Option<String> {
    match feature.kind {
        Kind::Dense { .. } if npy_descr(feature.dtype).is_none() => {
            Some(format!("{feature}: NumPy has no {} dtype", feature.dtype))
        }
        Kind::Dense { .. } => None,
        Kind::Bytes | Kind::Image => {
            Some(format!("{feature}: a bytes feature has no fixed shape to store as an array"))
        }
        Kind::Sparse { .. } => {
            Some(format!("{feature}: sparse features are not exported (densify them first)"))
        }
    }
}

/// A `.npy` file being written, whole or not at all ([`AtomicFile`]).
struct Output {
    name: String,
    path: PathBuf,
    file: AtomicFile,
    /// Bytes of elements written, and how many there must be.
    written: u64,
    expected: u64,
}

/// Writes every dense feature of the dataset at `dataset` to `<out>/<feature>.npy` (creating
/// `out` if needed): shape `[records, feature shape...]`, dtype as stored (`|u1`, `<i4`,
/// `<i8`, `<f2`, `<f4`, `<f8`), C order, with the header `numpy.save` writes (NumPy 1.23 and
/// later), so importing a file saved by NumPy and exporting it gives back the same bytes.
///
/// Each file is written under a temporary name, flushed to disk and then renamed, so a file
/// with the final name is always complete; on an error the temporary files are removed. The
/// dataset is read once, block by block.
///
/// ```no_run
/// use std::path::Path;
/// use dp_data::{ExportOptions, export_npy};
///
/// let summary = export_npy(Path::new("mnist"), Path::new("mnist-npy"), &ExportOptions::default())?;
/// for (feature, why) in &summary.skipped {
///     println!("skipped {feature}: {why}");
/// }
/// # Ok::<(), dp_data::Error>(())
/// ```
pub fn export_npy(dataset: &Path, out: &Path, options: &ExportOptions) -> Result<ExportSummary> {
    let data = Dataset::open(dataset)?;
    let schema = data.schema().clone();
    let records = data.len();
    let mut summary = ExportSummary { records, ..ExportSummary::default() };
    let chosen: Vec<&crate::Feature> = match &options.features {
        Some(names) => {
            let mut chosen = Vec::with_capacity(names.len());
            for name in names {
                let feature = schema.feature(name).ok_or_else(|| Error::Config {
                    field: "features",
                    what: format!("the dataset has no feature `{name}` (its schema is: {schema})"),
                })?;
                if let Some(why) = unsupported(feature) {
                    return Err(Error::Config { field: "features", what: why });
                }
                if chosen.iter().any(|f: &&crate::Feature| f.name == *name) {
                    return Err(Error::Config {
                        field: "features",
                        what: format!("feature `{name}` is named twice"),
                    });
                }
                chosen.push(feature);
            }
            chosen
        }
        None => {
            let mut chosen = Vec::new();
            for feature in schema.features() {
                match unsupported(feature) {
                    Some(why) => summary.skipped.push((feature.name.clone(), why)),
                    None => chosen.push(feature),
                }
            }
            chosen
        }
    };
    fs::create_dir_all(out).map_err(|e| Error::io(out, "create directory", e))?;
    let mut outputs = Vec::with_capacity(chosen.len());
    // An error drops the outputs, which removes their temporary files.
    start_outputs(&chosen, records, out, &mut outputs)?;
    write_all(&data, dataset, &mut outputs)?;
    for output in outputs {
        output.file.commit()?;
        summary.written.push((output.name, output.path));
    }
    Ok(summary)
}

/// Writes `values` as a NumPy `.npy` array of `f32` with `shape` (C order), the way
/// [`export_npy`] writes its files: to a temporary name, flushed, then renamed, so a file with
/// the final name is always complete; on an error nothing is left behind.
pub fn write_npy_f32(path: &Path, shape: &[u64], values: &[f32]) -> Result<()> {
    check_npy_shape(shape, values)?;
    let mut file = AtomicFile::create(path)?;
    write_npy_f32_to(&mut file, shape, values)
        .map_err(|e| Error::io(file.temp_path(), "write", e))?;
    file.commit()?;
    Ok(())
}

/// Writes `values` as [`write_npy_f32`] does, to a stream (standard output, say): a stream
/// cannot be renamed into place, so a reader of a failed write sees a short array.
pub fn write_npy_f32_to(
    out: &mut impl Write,
    shape: &[u64],
    values: &[f32],
) -> std::io::Result<()> {
    check_npy_shape(shape, values).map_err(std::io::Error::other)?;
    out.write_all(&npy_header("<f4", shape))?;
    out.write_all(bytemuck::cast_slice(values))?;
    out.flush()
}

/// Refuses a shape that does not hold exactly `values`.
fn check_npy_shape(shape: &[u64], values: &[f32]) -> Result<()> {
    let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    if elements != Some(values.len() as u64) {
        return Err(Error::Config {
            field: "shape",
            what: format!("{shape:?} does not hold {} values", values.len()),
        });
    }
    Ok(())
}

/// Creates each chosen feature's temporary file and writes its header.
fn start_outputs(
    chosen: &[&crate::Feature],
    records: u64,
    out: &Path,
    outputs: &mut Vec<Output>,
) -> Result<()> {
    for feature in chosen {
        let Kind::Dense { shape } = &feature.kind else { continue };
        let mut dims = vec![records];
        dims.extend(shape.iter().map(|&d| d as u64));
        let record = feature.dense_bytes().unwrap_or(0) as u64;
        let path = out.join(format!("{}.npy", feature.name));
        let mut file = AtomicFile::create(&path)?;
        let descr = npy_descr(feature.dtype).unwrap_or("|u1");
        let header = file.write_all(&npy_header(descr, &dims));
        let name = feature.name.clone();
        let expected = record.saturating_mul(records);
        // Pushed before the header's result is looked at, so that a failure removes the file.
        let temp = file.temp_path().to_path_buf();
        outputs.push(Output { name, path, file, written: 0, expected });
        header.map_err(|e| Error::io(&temp, "write", e))?;
    }
    Ok(())
}

/// Streams every block's dense columns into the outputs and checks the totals.
fn write_all(data: &Dataset, dataset: &Path, outputs: &mut [Output]) -> Result<()> {
    for block in data.blocks() {
        let block = block?;
        for output in outputs.iter_mut() {
            let bytes = block.dense_bytes(&output.name)?;
            let written = output.file.write_all(bytes);
            written.map_err(|e| Error::io(output.file.temp_path(), "write", e))?;
            output.written += bytes.len() as u64;
        }
    }
    for output in outputs.iter() {
        if output.written != output.expected {
            return Err(Error::Incomplete {
                path: dataset.to_path_buf(),
                what: format!(
                    "feature `{}`: the blocks hold {} bytes, but {} records need {}",
                    output.name,
                    output.written,
                    data.len(),
                    output.expected
                ),
            });
        }
    }
    Ok(())
}
