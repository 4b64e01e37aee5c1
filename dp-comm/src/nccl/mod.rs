//! The NCCL backend for CUDA GPUs (feature `cuda`).
//!
//! One [`NcclComm`] per rank, created on the thread (or in the process) that uses it: NCCL
//! handles are not `Send`. [`NcclGroup::run`] starts one thread per GPU of this process and
//! builds their communicators; across processes, rank 0 makes an [`NcclId`], sends its 128
//! bytes to the others (over whatever the launcher provides), and every rank calls
//! [`NcclComm::from_id`].
//!
//! Collectives run on device buffers (`*_device` methods, with the feature) or, through the
//! [`Communicator`](crate::Communicator) trait, on host slices, staged through a device buffer
//! allocated once at construction. To overlap with compute, `wait_for` orders NCCL's stream
//! after another stream's queued work on the device, `all_reduce_device_ptr` enqueues without
//! waiting, and `wait` waits for everything enqueued. Every collective waits for its completion under a
//! watchdog: one that does not complete within the timeout aborts the communicator and returns
//! [`Error::Timeout`](crate::Error::Timeout); NCCL errors carry NCCL's code and text.
//!
//! Without the `cuda` feature the same types exist and their constructors return
//! [`Error::CudaNotCompiled`](crate::Error::CudaNotCompiled), so callers need no `#[cfg]`.

use std::time::Duration;

use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::launch::Launch;

#[cfg(feature = "cuda")]
mod device;
#[cfg(not(feature = "cuda"))]
mod stub;

#[cfg(feature = "cuda")]
pub use device::{NcclComm, NcclGroup, NcclId, nccl_available};
#[cfg(not(feature = "cuda"))]
pub use stub::{NcclComm, NcclGroup, NcclId, nccl_available};

impl NcclId {
    /// Rank 0's id on every rank of `comm`: rank 0 makes it and `comm` broadcasts its 128
    /// bytes. With an [`MpiComm`](crate::MpiComm) this is how processes started by `mpirun`
    /// or `srun` bootstrap NCCL, as Horovod does; each then calls [`NcclComm::from_id`] with
    /// its rank (and its host-local rank as the device). A rank 0 that cannot make an id (no
    /// NCCL there) fails with its reason, and every other rank with an error naming rank 0,
    /// instead of waiting for an id that never comes.
    pub fn shared(comm: &mut impl Communicator) -> Result<Self> {
        let made = if comm.rank() == 0 { Some(NcclId::new()) } else { None };
        // Byte 128 says whether rank 0 has an id.
        let mut bytes = [0u8; 129];
        if let Some(Ok(id)) = &made {
            bytes[..128].copy_from_slice(&id.to_bytes());
            bytes[128] = 1;
        }
        comm.broadcast(&mut bytes, 0)?;
        match made {
            Some(made) => made,
            None if bytes[128] == 1 => {
                let mut id = [0u8; 128];
                id.copy_from_slice(&bytes[..128]);
                NcclId::from_bytes(&id)
            }
            None => Err(Error::Config {
                field: "NcclId",
                what: "rank 0 could not make an NCCL id (its own error says why)".into(),
            }),
        }
    }
}

impl NcclId {
    /// The id of a group of processes started by `torchrun`'s environment contract, which
    /// every process derives alike, without MPI: NCCL's own rendezvous, whose root rank 0
    /// opens at `NCCL_COMM_ID`. When that variable is not set, it is set to
    /// `MASTER_ADDR:MASTER_PORT+1` (`MASTER_PORT` itself is `torchrun`'s store). Each process
    /// then calls [`NcclComm::from_id`] with `RANK`, `WORLD_SIZE` and `LOCAL_RANK` as its
    /// device. Fails for a `launch` that is not [`Launch::Env`].
    ///
    /// # Safety
    ///
    /// It may set an environment variable: no other thread may read or write the environment
    /// while it runs (call it before starting threads).
    pub unsafe fn from_env_launch(launch: &Launch) -> Result<Self> {
        let address = nccl_comm_id(launch)?;
        if std::env::var_os("NCCL_COMM_ID").is_none() {
            // SAFETY: the caller guarantees that no other thread uses the environment now.
            unsafe { std::env::set_var("NCCL_COMM_ID", address) };
        }
        NcclId::new()
    }
}

/// `NCCL_COMM_ID` for an environment launch: `host:port` (IPv6 hosts in brackets), one port
/// above `torchrun`'s store.
fn nccl_comm_id(launch: &Launch) -> Result<String> {
    let Launch::Env { master_addr, master_port, .. } = launch else {
        return Err(Error::Launch {
            variable: "RANK",
            what: "is not set: this process was not started by torchrun's contract".into(),
        });
    };
    let port = master_port.checked_add(1).ok_or(Error::Launch {
        variable: "MASTER_PORT",
        what: "is 65535, which leaves no port above it for NCCL's rendezvous".into(),
    })?;
    let host = if master_addr.contains(':') && !master_addr.starts_with('[') {
        format!("[{master_addr}]")
    } else {
        master_addr.clone()
    };
    Ok(format!("{host}:{port}"))
}

/// Options of an [`NcclComm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NcclConfig {
    /// The CUDA device ordinal this rank uses. [`NcclGroup::run`] sets it to the rank.
    pub device: usize,
    /// How long a collective may take before the watchdog aborts the communicator.
    pub timeout: Duration,
    /// Bytes of the device buffer that host-slice collectives stage through (larger inputs go
    /// through it in pieces).
    pub staging_bytes: usize,
}

impl Default for NcclConfig {
    fn default() -> Self {
        NcclConfig { device: 0, timeout: crate::local::DEFAULT_TIMEOUT, staging_bytes: 64 << 20 }
    }
}

impl NcclConfig {
    /// The default configuration for `device`, with `timeout`.
    pub fn new(device: usize, timeout: Duration) -> Self {
        NcclConfig { device, timeout, ..NcclConfig::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(master_addr: &str, master_port: u16) -> Launch {
        let master_addr = master_addr.into();
        Launch::Env { rank: 0, world_size: 2, local_rank: 0, master_addr, master_port }
    }

    #[test]
    fn the_rendezvous_is_one_port_above_torchruns_store() {
        assert_eq!(nccl_comm_id(&env("node7", 29500)).unwrap(), "node7:29501");
        assert_eq!(nccl_comm_id(&env("fd00::7", 29500)).unwrap(), "[fd00::7]:29501");
        assert_eq!(nccl_comm_id(&env("[fd00::7]", 1)).unwrap(), "[fd00::7]:2");
        let last = nccl_comm_id(&env("node7", 65535)).unwrap_err();
        assert!(matches!(last, Error::Launch { variable: "MASTER_PORT", .. }), "{last}");
        let single = nccl_comm_id(&Launch::Single).unwrap_err();
        assert!(matches!(single, Error::Launch { variable: "RANK", .. }), "{single}");
    }
}
