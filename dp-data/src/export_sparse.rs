//! Export of a sparse feature: as svmlight text (with the label, and the query ids when the
//! dataset has them), or as an `.npz` file in SciPy's CSR layout (`scipy.sparse.load_npz`).

use std::io::Write;
use std::path::Path;

use crate::atomic::AtomicFile;
use crate::npy_format::{npy_descr, npy_header};
use crate::{DType, Dataset, Error, Feature, Kind, Result};

/// What [`export_svmlight`] and [`export_npz`] write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseExport {
    /// The sparse feature; `None` takes the dataset's only one.
    pub feature: Option<String>,
    /// The label feature svmlight lines start with (a scalar number).
    pub label: String,
    /// svmlight: whether the first index is written as 0 (`true`) or 1 (libsvm's convention).
    pub zero_based: bool,
}

impl Default for SparseExport {
    fn default() -> Self {
        SparseExport { feature: None, label: "label".into(), zero_based: false }
    }
}

impl SparseExport {
    /// The sparse feature to export.
    fn feature<'a>(&self, dataset: &'a Dataset) -> Result<&'a Feature> {
        let schema = dataset.schema();
        let feature = match &self.feature {
            Some(name) => schema.feature(name).ok_or_else(|| Error::Config {
                field: "feature",
                what: format!("no feature `{name}` (the schema is: {schema})"),
            })?,
            None => {
                let mut sparse =
                    schema.features().iter().filter(|f| matches!(f.kind, Kind::Sparse { .. }));
                match (sparse.next(), sparse.next()) {
                    (Some(only), None) => only,
                    _ => {
                        return Err(Error::Config {
                            field: "feature",
                            what: format!(
                                "name the sparse feature to export (the schema is: {schema})"
                            ),
                        });
                    }
                }
            }
        };
        if !matches!(feature.kind, Kind::Sparse { .. }) || !exported(feature.dtype) {
            return Err(Error::Config {
                field: "feature",
                what: format!("{feature} is not a sparse feature of u8, i32, i64, f32 or f64"),
            });
        }
        Ok(feature)
    }
}

/// Whether values of `dtype` are written (half floats are not: neither svmlight text nor this
/// exporter converts them).
fn exported(dtype: DType) -> bool {
    !matches!(dtype, DType::F16 | DType::Bf16)
}

/// The first `N` bytes of `bytes` (little-endian element bytes), zero-padded if shorter.
fn le<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = bytes.len().min(N);
    out[..n].copy_from_slice(&bytes[..n]);
    out
}

/// One element of `dtype`, as text: integers as integers, floats at their own precision.
fn scalar_text(bytes: &[u8], dtype: DType) -> String {
    match dtype {
        DType::U8 => bytes[0].to_string(),
        DType::I32 => i32::from_le_bytes(le(bytes)).to_string(),
        DType::I64 => i64::from_le_bytes(le(bytes)).to_string(),
        DType::F32 => f32::from_le_bytes(le(bytes)).to_string(),
        DType::F64 => f64::from_le_bytes(le(bytes)).to_string(),
        DType::F16 | DType::Bf16 => unreachable!("refused before anything is written"),
    }
}

/// Writes the sparse feature of the dataset at `dataset` as an svmlight file `out`: a line
/// per record, `label [qid:N] index:value ...` with increasing indices (1-based unless
/// `zero_based`), what scikit-learn's `load_svmlight_file` and [`import_svmlight`] read back.
/// The label is `options.label`; query ids come from a scalar integer feature `qid` when the
/// dataset has one. Written to a temporary name and renamed when complete. Returns the records.
///
/// [`import_svmlight`]: crate::import_svmlight
pub fn export_svmlight(dataset: &Path, out: &Path, options: &SparseExport) -> Result<u64> {
    let data = Dataset::open(dataset)?;
    let feature = options.feature(&data)?.clone();
    let label = data.schema().feature(&options.label).cloned().ok_or_else(|| Error::Config {
        field: "label",
        what: format!("no feature `{}` (the schema is: {})", options.label, data.schema()),
    })?;
    let scalar =
        matches!(&label.kind, Kind::Dense { shape } if shape.iter().product::<usize>() == 1);
    if !scalar || !exported(label.dtype) {
        return Err(Error::Config {
            field: "label",
            what: format!("{label} is not a scalar of u8, i32, i64, f32 or f64"),
        });
    }
    let qid = data
        .schema()
        .feature("qid")
        .filter(|f| matches!(f.dtype, DType::I32 | DType::I64) && f.elements() == Some(1))
        .cloned();
    let base = u64::from(!options.zero_based);
    let index = data.schema().index_of(&feature.name).unwrap_or_default();
    write_atomically(out, |file| {
        for block in data.blocks() {
            let block = block?;
            let labels = block.dense_bytes(&label.name)?;
            let qids = qid.as_ref().map(|q| block.dense_bytes(&q.name)).transpose()?;
            for row in 0..block.len() {
                let size = label.dtype.size();
                let mut line = scalar_text(&labels[row * size..(row + 1) * size], label.dtype);
                if let (Some(qids), Some(q)) = (qids, &qid) {
                    let size = q.dtype.size();
                    line += &format!(
                        " qid:{}",
                        scalar_text(&qids[row * size..(row + 1) * size], q.dtype)
                    );
                }
                let (positions, values) = block.sparse_column_row(index, row);
                let size = feature.dtype.size();
                for (p, v) in positions.chunks_exact(8).zip(values.chunks_exact(size)) {
                    let p = u64::from_le_bytes(le(p)) + base;
                    line += &format!(" {p}:{}", scalar_text(v, feature.dtype));
                }
                line.push('\n');
                file.write_all(line.as_bytes()).map_err(|e| Error::io(out, "write", e))?;
            }
        }
        Ok(())
    })?;
    Ok(data.len())
}

/// Writes the sparse feature of the dataset at `dataset` as `out`, an `.npz` file in SciPy's
/// CSR layout, as `scipy.sparse.save_npz` writes it (`data`, `indices`, `indptr`, `shape`,
/// `format` arrays, stored uncompressed): `scipy.sparse.load_npz(out)` gives a `[records,
/// width]` CSR matrix. Values keep their dtype; indices and offsets are `int32` where they
/// fit, else `int64`, as SciPy chooses. Written to a temporary name and renamed when
/// complete. Returns the records.
pub fn export_npz(dataset: &Path, out: &Path, options: &SparseExport) -> Result<u64> {
    let data = Dataset::open(dataset)?;
    let feature = options.feature(&data)?.clone();
    let index = data.schema().index_of(&feature.name).unwrap_or_default();
    let width = feature.elements().unwrap_or(0) as u64;
    let records = data.len();
    // The arrays' lengths go into their headers before their values: the manifest's count.
    let nnz = data.manifest().sparse.get(&feature.name).map(|c| c.nnz).ok_or_else(|| {
        Error::Config {
            field: "feature",
            what: format!(
                "the manifest does not count {feature}'s non-zeros (the dataset was written by an older version: import it again)"
            ),
        }
    })?;
    let wide = [width, nnz, records].iter().any(|&n| n > i32::MAX as u64);
    let int = |v: u64, out: &mut Vec<u8>| match wide {
        true => out.extend_from_slice(&v.to_le_bytes()),
        false => out.extend_from_slice(&(v as i32).to_le_bytes()),
    };
    let descr = npy_descr(feature.dtype).unwrap_or("<f4");
    let int_descr = if wide { "<i8" } else { "<i4" };
    write_atomically(out, |file| {
        let mut zip = zip::ZipWriter::new(&mut *file);
        let stored = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(true);
        let start = |name: &str, header: Vec<u8>, zip: &mut zip::ZipWriter<_>| -> Result<()> {
            zip.start_file(name, stored).map_err(|e| zip_error(out, e))?;
            zip.write_all(&header).map_err(|e| Error::io(out, "write", e))
        };
        // One pass over the blocks per array: values, then positions, then offsets.
        for array in ["data.npy", "indices.npy", "indptr.npy"] {
            let (descr, len) = match array {
                "data.npy" => (descr, nnz),
                "indices.npy" => (int_descr, nnz),
                _ => (int_descr, records + 1),
            };
            start(array, npy_header(descr, &[len]), &mut zip)?;
            let (mut written, mut bytes) = (0u64, Vec::new());
            if array == "indptr.npy" {
                int(0, &mut bytes);
            }
            for block in data.blocks() {
                let block = block?;
                for row in 0..block.len() {
                    let (positions, values) = block.sparse_column_row(index, row);
                    match array {
                        "data.npy" => bytes.extend_from_slice(values),
                        "indices.npy" => positions.chunks_exact(8).for_each(|p| {
                            int(u64::from_le_bytes(p.try_into().unwrap_or_default()), &mut bytes)
                        }),
                        _ => {
                            written += (positions.len() / 8) as u64;
                            int(written, &mut bytes);
                        }
                    }
                }
                zip.write_all(&bytes).map_err(|e| Error::io(out, "write", e))?;
                bytes.clear();
            }
            zip.write_all(&bytes).map_err(|e| Error::io(out, "write", e))?;
        }
        let mut shape = npy_header(int_descr, &[2]);
        int(records, &mut shape);
        int(width, &mut shape);
        start("shape.npy", shape, &mut zip)?;
        let mut format = npy_header("|S3", &[]);
        format.extend_from_slice(b"csr");
        start("format.npy", format, &mut zip)?;
        zip.finish().map_err(|e| zip_error(out, e))?;
        file.flush().map_err(|e| Error::io(out, "write", e))
    })?;
    Ok(records)
}

fn zip_error(path: &Path, error: zip::result::ZipError) -> Error {
    Error::io(path, "write the zip archive", std::io::Error::other(error.to_string()))
}

/// Writes `out` through `write`, whole or not at all ([`AtomicFile`]).
fn write_atomically(out: &Path, write: impl FnOnce(&mut AtomicFile) -> Result<()>) -> Result<()> {
    let mut file = AtomicFile::create(out)?;
    write(&mut file)?;
    file.commit()?;
    Ok(())
}
