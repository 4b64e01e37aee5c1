//! Collectives for data-parallel training.

mod bucket;
mod communicator;
mod compress;
mod element;
mod error;
mod local;
mod nccl;

pub use bucket::{BucketConfig, BucketOrder, BucketReducer, DEFAULT_BUCKET_BYTES, Step};
pub use communicator::Communicator;
pub use compress::Compression;
pub use element::{DType, Element, ReduceOp};
pub use error::{Error, Result};
pub use nccl::{NcclComm, NcclConfig, NcclGroup, NcclId, nccl_available};
pub use local::{DEFAULT_TIMEOUT, LocalComm, LocalConfig, LocalGroup, MAX_LOCAL_WORLD};
mod measure;
pub use measure::{BenchConfig, BenchReport, BenchRow, copy_bandwidth, measure_all_reduce};
