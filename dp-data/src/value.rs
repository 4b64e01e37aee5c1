//! Borrowed feature values: what a writer takes for one feature of one record.

use bytemuck::Pod;

use crate::error::{Error, Result};
use crate::schema::{Feature, Kind};

/// The value of one feature of one record. Numbers are little-endian element bytes of the
/// feature's dtype; the typed constructors cast slices of plain numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// A dense tensor: exactly the feature's element count times its dtype size, row-major.
    Dense(&'a [u8]),
    /// A byte string of any length.
    Bytes(&'a [u8]),
    /// A sparse tensor: strictly increasing row-major positions into the feature's shape, and
    /// one element of the feature's dtype per position.
    Sparse {
        /// Flat positions of the non-zero elements.
        indices: &'a [u64],
        /// Their values, little-endian.
        values: &'a [u8],
    },
}

impl<'a> Value<'a> {
    /// A dense value from typed elements (`&[f32]`, `&[i64]` ...).
    pub fn dense<T: Pod>(elements: &'a [T]) -> Self {
        Value::Dense(bytemuck::cast_slice(elements))
    }

    /// A sparse value from positions and typed values.
    pub fn sparse<T: Pod>(indices: &'a [u64], values: &'a [T]) -> Self {
        Value::Sparse { indices, values: bytemuck::cast_slice(values) }
    }

    /// Checks the value against its feature; `record` is only used in the error.
    pub(crate) fn check(&self, feature: &Feature, record: u64) -> Result<()> {
        let fail = |what: String| Error::Record { record, feature: feature.name.clone(), what };
        let elements = feature.elements().unwrap_or(usize::MAX);
        match (self, &feature.kind) {
            (Value::Dense(bytes), Kind::Dense { .. }) => {
                let expected = elements * feature.dtype.size();
                if bytes.len() != expected {
                    return Err(fail(format!(
                        "expected {expected} bytes ({feature}), got {}",
                        bytes.len()
                    )));
                }
            }
            (Value::Bytes(_), Kind::Bytes) => {}
            (Value::Bytes(bytes), Kind::Image) => {
                crate::image::ImageInfo::stored(bytes).map_err(|what| {
                    fail(format!("{what} (an image feature takes dp_data::stored_image's bytes)"))
                })?;
            }
            (Value::Sparse { indices, values }, Kind::Sparse { .. }) => {
                if values.len() != indices.len() * feature.dtype.size() {
                    return Err(fail(format!(
                        "{} indices need {} value bytes of {}, got {}",
                        indices.len(),
                        indices.len() * feature.dtype.size(),
                        feature.dtype,
                        values.len()
                    )));
                }
                let mut previous = None;
                for &index in *indices {
                    if index >= elements as u64 {
                        return Err(fail(format!(
                            "index {index} is outside the {elements} elements of {feature}"
                        )));
                    }
                    if previous.is_some_and(|p| index <= p) {
                        return Err(fail(format!(
                            "indices must be strictly increasing, {index} follows {}",
                            previous.unwrap_or(0)
                        )));
                    }
                    previous = Some(index);
                }
            }
            (value, _) => {
                let given = match value {
                    Value::Dense(_) => "a dense value",
                    Value::Bytes(_) => "a bytes value",
                    Value::Sparse { .. } => "a sparse value",
                };
                return Err(fail(format!("{given} was given for {feature}")));
            }
        }
        Ok(())
    }
}
