//! Which features a pipeline batches, checked against the dataset's schema.

use super::config::PipelineConfig;
use super::producer::{Columns, SparseColumn};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::schema::{DType, Feature, Kind};

/// Finds the input and label features and checks they can be batched.
pub(super) fn resolve(dataset: &Dataset, config: &PipelineConfig) -> Result<Columns> {
    let schema = dataset.schema();
    let find = |name: &str, field: &'static str| {
        schema.index_of(name).ok_or_else(|| Error::Config {
            field,
            what: format!("no feature `{name}` (the schema is: {schema})"),
        })
    };
    let (input, label) = (find(&config.input, "input")?, find(&config.label, "label")?);
    let (fi, fl) = (&schema.features()[input], &schema.features()[label]);
    #[cfg(feature = "images")]
    let image_shape;
    let (shape, sparse) = match (&fi.kind, &config.image) {
        (Kind::Dense { shape }, None) => (&shape[..], None),
        (Kind::Sparse { .. }, None) => (&[0][..], Some(sparse_column(dataset, fi, config)?)),
        #[cfg(not(feature = "images"))]
        (Kind::Image, Some(_)) => {
            return Err(Error::Config {
                field: "image",
                what: format!("{fi}: its images {}", crate::image::IMAGES_LEFT_OUT),
            });
        }
        #[cfg(feature = "images")]
        (Kind::Image, Some(image)) => {
            image_shape = [image.channels, image.height, image.width];
            (&image_shape[..], None)
        }
        (Kind::Image, None) => {
            return Err(Error::Config {
                field: "image",
                what: format!("{fi} is an image input: say the size to decode it to"),
            });
        }
        (_, Some(_)) => {
            return Err(Error::Config {
                field: "image",
                what: format!("{fi} is not an image feature, and images settings were given"),
            });
        }
        (Kind::Bytes, None) => {
            return Err(Error::Config {
                field: "input",
                what: format!("{fi} is not a dense, sparse or image feature"),
            });
        }
    };
    if matches!(fi.dtype, DType::F16 | DType::Bf16) {
        return Err(Error::Config {
            field: "input",
            what: format!("{fi}: f16 and bf16 inputs are not batched yet"),
        });
    }
    let scalar = matches!(&fl.kind, Kind::Dense { shape } if shape.iter().product::<usize>() == 1);
    let numeric = matches!(fl.dtype, DType::U8 | DType::I32 | DType::I64 | DType::F32 | DType::F64);
    if !scalar || !numeric {
        return Err(Error::Config {
            field: "label",
            what: format!(
                "{fl} is not a scalar integer (a class) or float (a value to regress) feature"
            ),
        });
    }
    if fi.elements() == Some(0) {
        return Err(Error::Config { field: "input", what: format!("{fi} has no elements") });
    }
    let mut batch_shape = vec![config.batch_size];
    batch_shape.extend_from_slice(shape);
    let elements = match (&sparse, &config.image) {
        (Some(_), _) => 0,
        (None, Some(image)) => image.elements(),
        (None, None) => fi.elements().unwrap_or(0),
    };
    Ok(Columns {
        input,
        input_dtype: fi.dtype,
        elements,
        image: config.image,
        shape: batch_shape.into(),
        sparse,
        label,
        label_dtype: fl.dtype,
    })
}

/// How a sparse input is batched: its width and the non-zeros a batch can hold, which the
/// manifest's count of the densest record bounds.
fn sparse_column(
    dataset: &Dataset,
    feature: &Feature,
    config: &PipelineConfig,
) -> Result<SparseColumn> {
    let refuse = |what: String| Err(Error::Config { field: "input", what });
    let width = feature.elements().unwrap_or(usize::MAX);
    if u32::try_from(width).is_err() {
        return refuse(format!("{feature} is wider than the 2^32 positions a batch indexes"));
    }
    let Some(counts) = dataset.manifest().sparse.get(&feature.name) else {
        return refuse(format!(
            "{feature}: the manifest does not count its non-zeros (the dataset was written by an older version: import it again)"
        ));
    };
    let per_batch = counts.max_per_record.saturating_mul(config.batch_size as u64);
    if u32::try_from(per_batch).is_err() {
        return refuse(format!(
            "{feature}: a batch of {} records may hold {per_batch} non-zeros, more than the 2^32 a batch indexes",
            config.batch_size
        ));
    }
    Ok(SparseColumn { width, max_per_record: counts.max_per_record as usize })
}
