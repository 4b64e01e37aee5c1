//! Replicas that are threads of several processes, reduced the way Horovod's hierarchical
//! all-reduce does it: the threads of a process in shared memory, then one rank per process
//! across processes, then the result back to the threads.

use crate::communicator::Communicator;
use crate::element::{Element, ReduceOp, finish};
use crate::error::{Error, Result};
use crate::local::LocalComm;

/// One replica thread's communicator in a world of `processes x threads` ranks: a
/// [`LocalComm`] among the threads of its process, and, on each process's thread 0 only, a
/// communicator among processes (an [`MpiComm`](crate::MpiComm), or any other backend).
///
/// Global rank `p * threads + t` is thread `t` of process `p`. Every collective keeps the
/// guarantees of its parts: sizes are checked first, results are the same on every rank
/// (the threads of a process get thread 0's result by broadcast), and a failure in either part
/// is an error on every rank of the process that sees it. Without processes (`global` is
/// `None`), it is the local communicator and costs nothing more.
///
/// ```
/// use dp_comm::{Communicator, Hierarchical, LocalComm, LocalGroup, ReduceOp};
///
/// // Two "processes" of two threads, with a local group standing in for MPI.
/// let mut leaders = LocalGroup::new(2)?.into_iter();
/// let mut comms: Vec<Hierarchical<LocalComm>> = Vec::new();
/// for _process in 0..2 {
///     comms.extend(Hierarchical::group(LocalGroup::new(2)?, leaders.next()));
/// }
/// std::thread::scope(|s| {
///     for mut comm in comms {
///         s.spawn(move || {
///             let mut x = [comm.rank() as f32];
///             comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
///             assert_eq!(x, [6.0]); // 0 + 1 + 2 + 3
///         });
///     }
/// });
/// # Ok::<(), dp_comm::Error>(())
/// ```
#[derive(Debug)]
pub struct Hierarchical<G: Communicator> {
    local: LocalComm,
    /// The communicator among processes, on thread 0 of each process.
    global: Option<G>,
    process: usize,
    processes: usize,
    /// Thread 0's copy of its process's part of an all-gather (MPI's all-gather cannot read
    /// its input from inside its output through safe slices), and a reduce-scatter's whole
    /// input. Grown on first use, then reused.
    scratch: Vec<u64>,
}

impl<G: Communicator> Hierarchical<G> {
    /// The communicators of one process's threads, `local[t]` becoming thread `t`'s. `global`
    /// is this process's communicator among processes (`None` for a process that is the
    /// whole world); it goes to thread 0.
    pub fn group(local: Vec<LocalComm>, global: Option<G>) -> Vec<Self> {
        let (process, processes) = global.as_ref().map_or((0, 1), |g| (g.rank(), g.world_size()));
        let mut global = global;
        local
            .into_iter()
            .map(|local| {
                let global = if local.rank() == 0 { global.take() } else { None };
                Hierarchical { local, global, process, processes, scratch: Vec::new() }
            })
            .collect()
    }

    /// This thread's rank among its process's threads.
    pub fn local_rank(&self) -> usize {
        self.local.rank()
    }

    /// The number of threads per process.
    pub fn threads(&self) -> usize {
        self.local.world_size()
    }

    /// This process's rank among processes.
    pub fn process(&self) -> usize {
        self.process
    }

    /// The number of processes.
    pub fn processes(&self) -> usize {
        self.processes
    }

    /// `len` elements of scratch, grown when needed.
    fn scratch<T: Element>(scratch: &mut Vec<u64>, len: usize) -> &mut [T] {
        let words = (len * size_of::<T>()).div_ceil(8);
        if scratch.len() < words {
            scratch.resize(words, 0);
        }
        &mut bytemuck::cast_slice_mut::<u64, T>(&mut scratch[..words])[..len]
    }
}

impl<G: Communicator> Communicator for Hierarchical<G> {
    fn rank(&self) -> usize {
        self.process * self.local.world_size() + self.local.rank()
    }

    fn world_size(&self) -> usize {
        self.processes * self.local.world_size()
    }

    fn all_reduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        if self.processes == 1 {
            return self.local.all_reduce(buf, op);
        }
        // Averages are sums until the end, divided once by the whole world.
        let sum = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        self.local.all_reduce(buf, sum)?;
        if let Some(global) = &mut self.global {
            global.all_reduce(buf, sum)?;
        }
        self.local.broadcast(buf, 0)?;
        finish(buf, op, self.world_size());
        Ok(())
    }

    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        let n = self.world_size();
        if root >= n {
            return Err(Error::InvalidRank { op: "broadcast", rank: root, world_size: n });
        }
        let threads = self.local.world_size();
        let (root_process, root_thread) = (root / threads, root % threads);
        if self.processes == 1 {
            return self.local.broadcast(buf, root_thread);
        }
        // The root's process brings the value to its thread 0, the threads 0 pass it between
        // processes, and the other processes hand it to their threads.
        if self.process == root_process {
            self.local.broadcast(buf, root_thread)?;
        }
        if let Some(global) = &mut self.global {
            global.broadcast(buf, root_process)?;
        }
        if self.process != root_process {
            self.local.broadcast(buf, 0)?;
        }
        Ok(())
    }

    fn all_gather<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        Error::check_parts("all_gather", output.len(), input.len(), self.world_size())?;
        let block = input.len() * self.local.world_size();
        let mine = self.process * block..(self.process + 1) * block;
        self.local.all_gather(input, &mut output[mine.clone()])?;
        if self.processes == 1 {
            return Ok(());
        }
        if let Some(global) = &mut self.global {
            let part = Self::scratch::<T>(&mut self.scratch, block);
            part.copy_from_slice(&output[mine]);
            global.all_gather(part, output)?;
        }
        self.local.broadcast(output, 0)
    }

    /// Goes as a whole all-reduce of a copy of `input`, of which each rank keeps its part:
    /// twice the traffic of a true reduce-scatter, for a collective training does not use.
    fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        Error::check_parts("reduce_scatter", input.len(), output.len(), self.world_size())?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let whole = Self::scratch::<T>(&mut scratch, input.len());
        whole.copy_from_slice(input);
        let result = self.all_reduce(whole, op);
        let part = self.rank() * output.len()..(self.rank() + 1) * output.len();
        if result.is_ok() {
            output.copy_from_slice(&whole[part]);
        }
        self.scratch = scratch;
        result
    }

    fn barrier(&mut self) -> Result<()> {
        self.local.barrier()?;
        if self.processes == 1 {
            return Ok(());
        }
        if let Some(global) = &mut self.global {
            global.barrier()?;
        }
        self.local.barrier()
    }
}
