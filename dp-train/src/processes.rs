//! The processes of a run: how many, which one this is, and how they agree before training.
//! Process 0 decides what others could decide differently (the effective config, the run
//! directory's name) and shares it; a setup step that fails on any process fails on all of
//! them, so no process waits for a peer that has given up.

use dp_comm::{Communicator, MpiComm, MpiConfig, MpiWorld, NcclId};

use crate::error::{Error, Result};

/// This process's place among the processes of a run on several GPUs, one each.
#[derive(Debug, Clone)]
// Only the NCCL reducer reads the group (a build without `cuda` never makes one).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct GpuPeers {
    /// The NCCL group's id, the same on every process.
    pub(crate) id: NcclId,
    /// The batch norms' NCCL group, with `sync_bn`.
    pub(crate) norms: Option<NcclId>,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// The GPU of this process: its rank among the processes on its host.
    pub(crate) device: usize,
}

/// This process's place among the run's processes, and the communicator they set up on.
pub(crate) struct Processes {
    /// Among processes; `None` when this process is the whole run.
    comm: Option<MpiComm>,
    rank: usize,
    count: usize,
    /// Processes on this host, which share its cores (and its GPUs, one each).
    on_host: usize,
    /// This process's rank among those on its host.
    local_rank: usize,
}

impl Processes {
    pub(crate) fn new(world: Option<&MpiWorld>) -> Result<Self> {
        match world {
            None => Ok(Processes { comm: None, rank: 0, count: 1, on_host: 1, local_rank: 0 }),
            Some(world) => Ok(Processes {
                comm: Some(world.communicator(MpiConfig::default())?),
                rank: world.rank(),
                count: world.size(),
                on_host: world.local_size(),
                local_rank: world.local_rank(),
            }),
        }
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }

    pub(crate) fn on_host(&self) -> usize {
        self.on_host
    }

    pub(crate) fn is_first(&self) -> bool {
        self.rank == 0
    }

    /// Process 0's `text`, on every process; its error is this process's own on process 0
    /// and an error naming process 0 elsewhere.
    pub(crate) fn share(&mut self, text: Result<String>) -> Result<String> {
        let Some(comm) = &mut self.comm else { return text };
        let mut bytes = match &text {
            Ok(text) if self.rank == 0 => text.as_bytes().to_vec(),
            _ => Vec::new(),
        };
        // The length, with u64::MAX for "process 0 failed".
        let mut len = [if self.rank == 0 && text.is_err() { u64::MAX } else { bytes.len() as u64 }];
        comm.broadcast(&mut len, 0)?;
        if len[0] == u64::MAX {
            return match text {
                Err(error) if self.rank == 0 => Err(error),
                _ => Err(Error::Process { rank: 0, what: "failed to set up the run".into() }),
            };
        }
        bytes.resize(len[0] as usize, 0);
        comm.broadcast(&mut bytes, 0)?;
        if self.rank == 0 {
            return text;
        }
        String::from_utf8(bytes)
            .map_err(|_| Error::Process { rank: 0, what: "sent text that is not UTF-8".into() })
    }

    /// This process's place among those on its host (the GPU it takes).
    pub(crate) fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// With several processes, their NCCL group (and with `sync_bn` a second one, for the
    /// batch norms' statistics): process 0 makes each id and shares it (as Horovod does), and
    /// each process takes the GPU of its rank on its host. `None` for a run of one process,
    /// whose GPU has no one to reduce with.
    pub(crate) fn gpu_peers(&mut self, sync_bn: bool) -> Result<Option<GpuPeers>> {
        let Some(comm) = &mut self.comm else { return Ok(None) };
        if self.count == 1 {
            return Ok(None);
        }
        let id = NcclId::shared(comm)?;
        let norms = if sync_bn { Some(NcclId::shared(comm)?) } else { None };
        let (rank, world, device) = (self.rank, self.count, self.local_rank);
        Ok(Some(GpuPeers { id, norms, rank, world, device }))
    }

    /// `result` where it is `Ok` on every process; otherwise an error on every process: this
    /// process's own, or one naming the first process that failed.
    pub(crate) fn agree<T>(&mut self, result: Result<T>) -> Result<T> {
        let Some(comm) = &mut self.comm else { return result };
        let mine = [u8::from(result.is_err())];
        let mut all = vec![0u8; self.count];
        comm.all_gather(&mine, &mut all)?;
        match (result, all.iter().position(|&failed| failed != 0)) {
            (Err(error), _) => Err(error),
            (Ok(_), Some(rank)) => {
                Err(Error::Process { rank, what: "failed to set up the run".into() })
            }
            (Ok(value), None) => Ok(value),
        }
    }
}
