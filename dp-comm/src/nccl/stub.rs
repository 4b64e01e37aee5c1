//! The NCCL backend's types when the crate is built without the `cuda` feature: constructors
//! return [`Error::CudaNotCompiled`], so code that uses them builds everywhere.

use std::convert::Infallible;

use crate::error::{Error, Result};
use crate::nccl::NcclConfig;

/// Whether NCCL can be used here: never, in a build without the `cuda` feature.
pub fn nccl_available() -> Result<()> {
    Err(Error::CudaNotCompiled)
}

/// An NCCL unique id (no value exists in this build).
#[derive(Debug, Clone)]
pub struct NcclId(Infallible);

impl NcclId {
    /// Fails with [`Error::CudaNotCompiled`].
    pub fn new() -> Result<Self> {
        Err(Error::CudaNotCompiled)
    }

    /// Fails with [`Error::CudaNotCompiled`].
    pub fn from_bytes(_bytes: &[u8; 128]) -> Result<Self> {
        Err(Error::CudaNotCompiled)
    }

    /// The id's bytes, to send to the other processes.
    pub fn to_bytes(&self) -> [u8; 128] {
        match self.0 {}
    }
}

/// One rank of an NCCL group (no value exists in this build).
#[derive(Debug)]
pub struct NcclComm(Infallible);

impl NcclComm {
    /// Fails with [`Error::CudaNotCompiled`].
    pub fn from_id(
        _id: &NcclId,
        _rank: usize,
        _world_size: usize,
        _config: NcclConfig,
    ) -> Result<Self> {
        Err(Error::CudaNotCompiled)
    }

    /// Whether the communicator failed (aborted by the watchdog or an NCCL error).
    pub fn is_poisoned(&self) -> bool {
        match self.0 {}
    }
}

/// Runs one thread per GPU of this process, each with its rank's communicator.
#[derive(Debug)]
pub struct NcclGroup;

impl NcclGroup {
    /// Fails with [`Error::CudaNotCompiled`].
    pub fn run<R: Send>(
        _world_size: usize,
        _config: NcclConfig,
        _body: impl Fn(&mut NcclComm) -> R + Sync,
    ) -> Result<Vec<R>> {
        Err(Error::CudaNotCompiled)
    }
}

crate::communicator::uninhabited_communicator!(NcclComm);
