//! The MPI backend's types when the crate is built without the `mpi` feature:
//! [`MpiWorld::init`] returns [`Error::MpiNotCompiled`], so code that uses them builds
//! everywhere.

use std::convert::Infallible;

use crate::error::{Error, Result};
use crate::mpi::MpiConfig;

/// This process's membership of an MPI job (no value exists in this build).
#[derive(Debug, Clone)]
pub struct MpiWorld(Infallible);

impl MpiWorld {
    /// Fails with [`Error::MpiNotCompiled`].
    pub fn init() -> Result<Self> {
        Err(Error::MpiNotCompiled)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        match self.0 {}
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        match self.0 {}
    }

    /// This process's rank among the processes on its host.
    pub fn local_rank(&self) -> usize {
        match self.0 {}
    }

    /// The number of processes on this host.
    pub fn local_size(&self) -> usize {
        match self.0 {}
    }

    /// The MPI library's version string.
    pub fn library(&self) -> &str {
        match self.0 {}
    }

    /// A communicator over all processes.
    pub fn communicator(&self, _config: MpiConfig) -> Result<MpiComm> {
        match self.0 {}
    }

    /// Leaves the job cleanly.
    pub fn finalize(self) -> Result<()> {
        match self.0 {}
    }

    /// Ends the whole job now.
    pub fn abort(&self, _why: &str) -> ! {
        match self.0 {}
    }
}

/// One process's communicator over all processes of the job (no value exists in this build).
#[derive(Debug)]
pub struct MpiComm(Infallible);

impl MpiComm {
    /// The timeout of a collective.
    pub fn timeout(&self) -> std::time::Duration {
        match self.0 {}
    }

    /// The world this communicator belongs to.
    pub fn world(&self) -> &MpiWorld {
        match self.0 {}
    }
}

crate::communicator::uninhabited_communicator!(MpiComm);
