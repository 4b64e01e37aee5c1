//! Schemas: named features with a dtype and a kind (dense, bytes, sparse, image).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Element types of dense and sparse features. Stored little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DType {
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision (stored as its 16 bits).
    F16,
    /// bfloat16 (stored as its 16 bits).
    Bf16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl DType {
    /// Every dtype.
    pub const ALL: [DType; 7] =
        [DType::U8, DType::I32, DType::I64, DType::F16, DType::Bf16, DType::F32, DType::F64];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::Bf16 | DType::F32 | DType::F64)
    }

    /// The name used in schemas and reports.
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        DType::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| {
            Error::Schema(format!(
                "unknown dtype `{s}` (expected one of u8, i32, i64, f16, bf16, f32, f64)"
            ))
        })
    }
}

/// How a feature's values are shaped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Kind {
    /// A fixed-shape tensor per record (`[]` for a scalar), stored column-wise.
    Dense {
        /// The per-record shape.
        shape: Vec<usize>,
    },
    /// A variable-length byte string per record.
    Bytes,
    /// An encoded image (JPEG or PNG) per record, stored as it was encoded behind a header
    /// with its format, size and channels ([`crate::stored_image`]); the pipeline decodes,
    /// crops and resamples it to a fixed `[channels, height, width]` input.
    Image,
    /// A sparse tensor per record: the positions (row-major flat indices into `shape`) of its
    /// non-zero elements and their values, stored as CSR over the records of a block.
    Sparse {
        /// The logical per-record shape.
        shape: Vec<usize>,
    },
}

/// The name of a bytes feature that says where each record came from (an image folder's
/// file, relative to its root): an error about a record, as an image that does not decode in
/// a pipeline's worker, quotes it, because a record number after an import's shuffle leads
/// nowhere.
pub const SOURCE_FEATURE: &str = "source";

/// One named feature of a schema.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Feature {
    /// The feature's name: letters, digits, `_`, `-` and `.`.
    pub name: String,
    /// Element type (for `Bytes` and `Image` features, `u8`).
    pub dtype: DType,
    /// Dense, bytes, sparse or image.
    #[serde(flatten)]
    pub kind: Kind,
}

impl Feature {
    /// A dense feature of `shape` (`&[]` for a scalar).
    pub fn dense(name: impl Into<String>, dtype: DType, shape: &[usize]) -> Self {
        Feature { name: name.into(), dtype, kind: Kind::Dense { shape: shape.to_vec() } }
    }

    /// A variable-length bytes feature.
    pub fn bytes(name: impl Into<String>) -> Self {
        Feature { name: name.into(), dtype: DType::U8, kind: Kind::Bytes }
    }

    /// An encoded-image feature.
    pub fn image(name: impl Into<String>) -> Self {
        Feature { name: name.into(), dtype: DType::U8, kind: Kind::Image }
    }

    /// A sparse feature whose logical shape is `shape`.
    pub fn sparse(name: impl Into<String>, dtype: DType, shape: &[usize]) -> Self {
        Feature { name: name.into(), dtype, kind: Kind::Sparse { shape: shape.to_vec() } }
    }

    /// Elements in one record's dense value, or in the logical shape of a sparse one (1 for
    /// bytes and images). `None` if the product overflows.
    pub fn elements(&self) -> Option<usize> {
        match &self.kind {
            Kind::Dense { shape } | Kind::Sparse { shape } => {
                shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
            }
            Kind::Bytes | Kind::Image => Some(1),
        }
    }

    /// Bytes of one record's dense value (`None` for other kinds).
    pub fn dense_bytes(&self) -> Option<usize> {
        match self.kind {
            Kind::Dense { .. } => self.elements()?.checked_mul(self.dtype.size()),
            _ => None,
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims =
            |shape: &[usize]| shape.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        match &self.kind {
            Kind::Dense { shape } => write!(f, "{}: {}[{}]", self.name, self.dtype, dims(shape)),
            Kind::Bytes => write!(f, "{}: bytes", self.name),
            Kind::Image => write!(f, "{}: image", self.name),
            Kind::Sparse { shape } => {
                write!(f, "{}: sparse {}[{}]", self.name, self.dtype, dims(shape))
            }
        }
    }
}

impl FromStr for Feature {
    type Err = Error;

    /// Parses the `Display` form: `image: u8[28,28]`, `label: i64[]`, `text: bytes`,
    /// `x: sparse f32[1000]`, `photo: image`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |what: &str| Error::Schema(format!("cannot parse feature `{s}`: {what}"));
        let (name, spec) = s.split_once(':').ok_or_else(|| bad("expected `name: type`"))?;
        let (name, spec) = (name.trim(), spec.trim());
        match spec {
            "bytes" => return Ok(Feature::bytes(name)),
            "image" => return Ok(Feature::image(name)),
            _ => {}
        }
        let (sparse, spec) = match spec.strip_prefix("sparse") {
            Some(rest) => (true, rest.trim_start()),
            None => (false, spec),
        };
        let (dtype, dims) = spec.split_once('[').ok_or_else(|| bad("expected `dtype[dims]`"))?;
        let dims = dims.strip_suffix(']').ok_or_else(|| bad("missing `]`"))?;
        let shape = dims
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| {
                d.parse::<usize>().map_err(|_| bad("dimensions must be non-negative integers"))
            })
            .collect::<Result<Vec<_>>>()?;
        let dtype = dtype.trim().parse()?;
        Ok(if sparse {
            Feature::sparse(name, dtype, &shape)
        } else {
            Feature::dense(name, dtype, &shape)
        })
    }
}

/// The features of every record of a dataset, in storage order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<Feature>", into = "Vec<Feature>")]
pub struct Schema {
    features: Vec<Feature>,
}

/// The largest dense record value or sparse logical shape a schema may declare (1 GiB): far
/// above any real feature, far below what would overflow offsets.
pub const MAX_FEATURE_BYTES: usize = 1 << 30;

impl Schema {
    /// A schema of `features`, checked: at least one feature, unique well-formed names, shapes
    /// whose size fits [`MAX_FEATURE_BYTES`], `u8` for bytes and image features.
    pub fn new(features: Vec<Feature>) -> Result<Self> {
        if features.is_empty() {
            return Err(Error::Schema("a schema needs at least one feature".into()));
        }
        for (i, feature) in features.iter().enumerate() {
            let name = &feature.name;
            let valid_name = !name.is_empty()
                && name.len() <= 128
                && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
            if !valid_name {
                return Err(Error::Schema(format!(
                    "feature name `{name}` must be 1-128 characters of letters, digits, `_`, `-`, `.`"
                )));
            }
            if features[..i].iter().any(|f| f.name == *name) {
                return Err(Error::Schema(format!("feature `{name}` appears twice")));
            }
            let bytes = feature.elements().and_then(|n| n.checked_mul(feature.dtype.size()));
            if bytes.is_none_or(|b| b > MAX_FEATURE_BYTES) {
                return Err(Error::Schema(format!(
                    "feature `{feature}` is larger than {MAX_FEATURE_BYTES} bytes per record"
                )));
            }
            if matches!(feature.kind, Kind::Bytes | Kind::Image) && feature.dtype != DType::U8 {
                return Err(Error::Schema(format!("feature `{name}` must have dtype u8")));
            }
        }
        Ok(Schema { features })
    }

    /// The features in storage order.
    pub fn features(&self) -> &[Feature] {
        &self.features
    }

    /// The position of the feature called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.features.iter().position(|f| f.name == name)
    }

    /// The feature called `name`.
    pub fn feature(&self, name: &str) -> Option<&Feature> {
        self.features.iter().find(|f| f.name == name)
    }
}

impl TryFrom<Vec<Feature>> for Schema {
    type Error = Error;

    fn try_from(features: Vec<Feature>) -> Result<Self> {
        Schema::new(features)
    }
}

impl From<Schema> for Vec<Feature> {
    fn from(schema: Schema) -> Self {
        schema.features
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, feature) in self.features.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{feature}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_print_and_parse_back() {
        let texts = [
            "image: u8[28,28]",
            "label: i64[]",
            "text: bytes",
            "x: sparse f32[1000]",
            "photo: image",
        ];
        for text in texts {
            let feature: Feature = text.parse().unwrap();
            assert_eq!(feature.to_string(), text);
        }
        let image: Feature = "image:u8[28, 28]".parse().unwrap();
        assert_eq!(image, Feature::dense("image", DType::U8, &[28, 28]));
        assert_eq!(image.dense_bytes(), Some(784));
    }

    #[test]
    fn malformed_feature_specs_are_errors() {
        for text in ["image", "image: u9[2]", "image: u8[2", "image: u8[-1]", "x: sparse f32"] {
            assert!(matches!(text.parse::<Feature>(), Err(Error::Schema(_))), "{text}");
        }
    }

    #[test]
    fn schema_rejects_duplicates_bad_names_and_absurd_shapes() {
        let f = |s: &str| s.parse::<Feature>().unwrap();
        assert!(Schema::new(vec![]).is_err());
        assert!(Schema::new(vec![f("a: u8[1]"), f("a: u8[2]")]).is_err());
        assert!(Schema::new(vec![f("a b: u8[1]")]).is_err());
        assert!(Schema::new(vec![f("a: f32[100000,100000]")]).is_err());
        assert!(Schema::new(vec![f("a: u8[18446744073709551615,2]")]).is_err());
        let bytes_f32 = Feature { name: "t".into(), dtype: DType::F32, kind: Kind::Bytes };
        assert!(Schema::new(vec![bytes_f32]).is_err());
        assert!(Schema::new(vec![f("image: u8[28,28]"), f("label: i64[]")]).is_ok());
    }

    #[test]
    fn schema_json_round_trips_and_is_validated_on_load() {
        let schema = Schema::new(vec![
            "image: u8[28,28]".parse().unwrap(),
            "label: i64[]".parse().unwrap(),
            "text: bytes".parse().unwrap(),
            "x: sparse f32[1000]".parse().unwrap(),
            "photo: image".parse().unwrap(),
        ])
        .unwrap();
        let json = serde_json::to_string(&schema).unwrap();
        assert_eq!(serde_json::from_str::<Schema>(&json).unwrap(), schema);
        let dup = r#"[{"name":"a","dtype":"u8","kind":"bytes"},{"name":"a","dtype":"u8","kind":"bytes"}]"#;
        assert!(serde_json::from_str::<Schema>(dup).is_err());
    }
}
