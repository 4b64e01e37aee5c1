//! TFRecord files of `tf.train.Example`: [`import_tfrecord`].
//!
//! A TFRecord file is a sequence of records, each framed as
//!
//! ```text
//! u64 length, u32 masked CRC32C of the length's 8 bytes, length bytes of data,
//! u32 masked CRC32C of the data                                   (all little-endian)
//! ```
//!
//! where `masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8` (wrapping). Each record's
//! data is a serialized `tf.train.Example` protocol buffer, decoded here by hand:
//!
//! ```text
//! Example  { Features features = 1; }
//! Features { map<string, Feature> feature = 1; }   // entries: { key = 1; value = 2; }
//! Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2;
//!                    Int64List int64_list = 3; } }
//! BytesList { repeated bytes value = 1; }
//! FloatList { repeated float value = 1; }           // packed or not
//! Int64List { repeated int64 value = 1; }           // packed or not
//! ```
//!
//! with protobuf's merge rules: unknown fields are skipped, a repeated map key keeps its last
//! value, a message field that appears twice is merged, and a oneof keeps its last member.

mod columns;
mod example;
mod feature_name;
mod frame;
mod importer;
mod options;
mod sparse;

pub use importer::import_tfrecord;
pub use options::{TfRecordCompression, TfRecordOptions};
pub use sparse::{SparseFeature, VarLenFeature};
