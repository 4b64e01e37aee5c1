//! What an import of TFRecord files is told: their compression, and the keys to read as
//! sparse features or as encoded images.

use super::feature_name::feature_name;
use super::sparse::{SparseFeature, VarLenFeature};
use crate::error::{Error, Result};

/// How [`import_tfrecord`](crate::import_tfrecord) reads TFRecord files: their compression, and the keys to read as
/// sparse features, which the first Example alone cannot tell (TensorFlow's feature specs).
///
/// ```
/// use dp_data::{TfRecordOptions, VarLenFeature};
///
/// let options = TfRecordOptions {
///     var_len: vec![VarLenFeature { key: "words".into(), width: 50_000 }],
///     ..TfRecordOptions::default()
/// };
/// assert!(options.sparse.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TfRecordOptions {
    /// Whether the files are GZIP-compressed (by default, decided per file).
    pub compression: TfRecordCompression,
    /// Keys read as `tf.io.VarLenFeature`.
    pub var_len: Vec<VarLenFeature>,
    /// Index and value keys read as `tf.io.SparseFeature`.
    pub sparse: Vec<SparseFeature>,
    /// Bytes keys read as encoded images (JPEG or PNG, as `tf.io.encode_jpeg` writes them)
    /// into an image feature. A bytes key whose value in the first Example is a JPEG or PNG
    /// is one without being named.
    pub images: Vec<String>,
}

impl TfRecordOptions {
    /// Whether `key` is declared sparse (then not inferred from the first Example).
    pub(super) fn declares(&self, key: &[u8]) -> bool {
        self.var_len.iter().any(|v| v.key.as_bytes() == key)
            || self
                .sparse
                .iter()
                .any(|s| s.index_key.as_bytes() == key || s.value_key.as_bytes() == key)
    }

    /// Every declared key with the option and the words that declared it, in declaration
    /// order.
    pub(super) fn declared_keys(&self) -> Vec<(&str, &'static str, String)> {
        let var_len =
            self.var_len.iter().map(|v| (v.key.as_str(), "var_len", "a VarLenFeature".to_string()));
        let sparse = self.sparse.iter().flat_map(|s| {
            let of = |which| format!("the {which} key of the SparseFeature `{}`", s.name);
            [
                (s.index_key.as_str(), "sparse", of("index")),
                (s.value_key.as_str(), "sparse", of("value")),
            ]
        });
        var_len.chain(sparse).collect()
    }

    /// The declared sparse features: their names and widths, in declaration order.
    pub(super) fn features(&self) -> Vec<(String, usize)> {
        let var_len = self.var_len.iter().map(|v| (feature_name(v.key.as_bytes()), v.width));
        var_len.chain(self.sparse.iter().map(|s| (s.name.clone(), s.width))).collect()
    }

    pub(super) fn check(&self) -> Result<()> {
        let widths = self.var_len.iter().map(|v| (&v.key, v.width));
        for (key, width) in widths.chain(self.sparse.iter().map(|s| (&s.name, s.width))) {
            if width == 0 {
                return Err(Error::Config {
                    field: "width",
                    what: format!("the sparse feature `{key}` must be at least 1 wide"),
                });
            }
        }
        Ok(())
    }
}

/// How the TFRecord files given to [`import_tfrecord`](crate::import_tfrecord) are compressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TfRecordCompression {
    /// Decide per file: a file whose first 12 bytes are a valid record frame is uncompressed,
    /// one that starts with the gzip magic is GZIP.
    #[default]
    Auto,
    /// Uncompressed (TensorFlow's `compression_type=""`).
    None,
    /// GZIP (TensorFlow's `compression_type="GZIP"`).
    Gzip,
}
