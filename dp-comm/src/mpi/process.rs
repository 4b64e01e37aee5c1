//! MPI through the `mpi` crate's bindings to the system's Open MPI or MPICH.
//!
//! The raw bindings are used rather than the crate's safe layer because a collective here must
//! be started, polled against a deadline and, past it, abandoned by aborting the job; the safe
//! layer's scoped requests can only be waited for.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mpi::ffi;

use crate::call::{Desc, Kind, difference};
use crate::communicator::Communicator;
use crate::element::{DType, Element, ReduceOp, finish};
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::mpi::MpiConfig;

/// Elements per MPI call: MPI counts are C `int`s, so longer buffers go in pieces.
const MAX_COUNT: usize = 1 << 30;

/// What every handle on the world shares.
#[derive(Debug)]
struct WorldState {
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    /// `MPI_IN_PLACE` (see [`in_place`]).
    in_place: usize,
    library: String,
    finalized: AtomicBool,
}

/// This process's membership of the MPI job: its rank, the world's size, the ranks on its
/// host. Cheap to clone; every [`MpiComm`] holds one, so MPI stays initialized while any
/// communicator lives.
#[derive(Debug, Clone)]
pub struct MpiWorld {
    state: Arc<WorldState>,
}

/// Turns an MPI return code into a `Result`.
fn check(call: &'static str, code: c_int) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    let mut text = vec![0 as c_char; 1024];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds more than MPI_MAX_ERROR_STRING (256 in Open MPI and MPICH).
    let known = unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr(), &mut len) } == 0;
    let message = if known {
        let bytes: Vec<u8> = text[..len.max(0) as usize].iter().map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    } else {
        "unknown error".into()
    };
    Err(Error::Mpi { call, code, message })
}

impl MpiWorld {
    /// Joins the job this process was launched into, with `MPI_THREAD_MULTIPLE`. Fails if MPI
    /// was initialized already in this process, if the library cannot give full thread
    /// support, or if the world MPI reports is not the one the launcher announced (`srun`
    /// without `--mpi=pmix`, which starts processes that each think they are alone).
    pub fn init() -> Result<Self> {
        // Checking and initializing are one step: two threads must not both initialize.
        static INIT: Mutex<()> = Mutex::new(());
        let _once = INIT.lock().unwrap_or_else(PoisonError::into_inner);
        // Before MPI_Init, which may set variables of its own (Open MPI's singletons do).
        let launch = Launch::detect()?;
        let mut initialized: c_int = 0;
        // SAFETY: MPI_Initialized may be called at any time.
        check("MPI_Initialized", unsafe { ffi::MPI_Initialized(&mut initialized) })?;
        if initialized != 0 {
            return Err(Error::Config {
                field: "MpiWorld",
                what: "MPI is already initialized in this process (init it once)".into(),
            });
        }
        let mut provided: c_int = 0;
        // SAFETY: MPI is not initialized (checked above); null argc/argv are allowed.
        let code = unsafe {
            ffi::MPI_Init_thread(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                ffi::RSMPI_THREAD_MULTIPLE,
                &mut provided,
            )
        };
        check("MPI_Init_thread", code)?;
        // A process that cannot join leaves MPI finalized, free to exit cleanly.
        Self::joined(&launch, provided).inspect_err(|_| {
            // SAFETY: MPI is initialized, and nothing of it is handed out.
            unsafe { ffi::MPI_Finalize() };
        })
    }

    /// The world just joined, checked: full thread support, and the size the launcher said.
    fn joined(launch: &Launch, provided: c_int) -> Result<Self> {
        // SAFETY: reading constants the MPI library defines.
        let (world, multiple) = unsafe { (ffi::RSMPI_COMM_WORLD, ffi::RSMPI_THREAD_MULTIPLE) };
        // SAFETY: MPI is initialized; the world communicator is valid.
        check("MPI_Comm_set_errhandler", unsafe {
            ffi::MPI_Comm_set_errhandler(world, ffi::RSMPI_ERRORS_RETURN)
        })?;
        let library = library_version();
        if provided < multiple {
            return Err(Error::Mpi {
                call: "MPI_Init_thread",
                code: provided,
                message: format!(
                    "{library} does not provide MPI_THREAD_MULTIPLE, which replica and communication threads need"
                ),
            });
        }
        let (rank, size) = rank_and_size(world)?;
        let mut local = null_comm();
        // SAFETY: MPI is initialized; `local` receives a new communicator, freed below.
        check("MPI_Comm_split_type", unsafe {
            ffi::MPI_Comm_split_type(
                world,
                ffi::RSMPI_COMM_TYPE_SHARED,
                rank as c_int,
                ffi::RSMPI_INFO_NULL,
                &mut local,
            )
        })?;
        let (local_rank, local_size) = rank_and_size(local)?;
        // SAFETY: `local` was created above and is not used again.
        check("MPI_Comm_free", unsafe { ffi::MPI_Comm_free(&mut local) })?;
        let in_place = in_place(&library)?;
        let world = MpiWorld {
            state: Arc::new(WorldState {
                rank,
                size,
                local_rank,
                local_size,
                in_place,
                library,
                finalized: AtomicBool::new(false),
            }),
        };
        if let Launch::Mpi { launcher, world_size: Some(announced) } = launch
            && *announced != size
        {
            return Err(Error::Launch {
                variable: launch.size_variable().unwrap_or("the world size"),
                what: format!(
                    "is {announced} (set by {launcher}) but MPI sees {size} process(es): the launcher and the MPI library this binary links do not match (under SLURM, use srun --mpi=pmix or pmi2)"
                ),
            });
        }
        Ok(world)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.state.rank
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.state.size
    }

    /// This process's rank among the processes on its host (the GPU it would use).
    pub fn local_rank(&self) -> usize {
        self.state.local_rank
    }

    /// The number of processes on this host.
    pub fn local_size(&self) -> usize {
        self.state.local_size
    }

    /// The MPI library's version string.
    pub fn library(&self) -> &str {
        &self.state.library
    }

    /// A communicator over all processes, of its own (`MPI_Comm_dup`), so that collectives on
    /// it never match another communicator's. Collective: every process calls it, from one
    /// thread, in the same order.
    pub fn communicator(&self, config: MpiConfig) -> Result<MpiComm> {
        if config.timeout.is_zero() {
            return Err(Error::Config { field: "timeout", what: "must not be zero".into() });
        }
        self.check_live()?;
        let mut comm = null_comm();
        // SAFETY: MPI is initialized and not finalized; `comm` receives a new communicator.
        check("MPI_Comm_dup", unsafe { ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut comm) })?;
        // SAFETY: `comm` is the communicator just made.
        check("MPI_Comm_set_errhandler", unsafe {
            ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN)
        })?;
        Ok(MpiComm {
            comm,
            rank: self.state.rank,
            size: self.state.size,
            timeout: config.timeout,
            calls: vec![0; 2 * self.state.size],
            failed: None,
            world: self.clone(),
        })
    }

    fn check_live(&self) -> Result<()> {
        if self.state.finalized.load(Ordering::Acquire) {
            return Err(Error::Config { field: "MpiWorld", what: "is finalized".into() });
        }
        Ok(())
    }

    /// Leaves the job cleanly (`MPI_Finalize`). Every communicator and every other handle on
    /// the world must be gone; call it from the thread that called [`MpiWorld::init`]. A
    /// process that exits without it is taken by the launcher as failed, which ends the job.
    pub fn finalize(self) -> Result<()> {
        if Arc::strong_count(&self.state) > 1 {
            return Err(Error::Config {
                field: "MpiWorld",
                what: "cannot finalize while communicators or other handles on it live".into(),
            });
        }
        self.state.finalized.store(true, Ordering::Release);
        // SAFETY: MPI is initialized, and no handle remains that could use it afterwards.
        check("MPI_Finalize", unsafe { ffi::MPI_Finalize() })
    }

    /// Ends the whole job now: prints `why` with this rank, then `MPI_Abort`, which makes the
    /// launcher kill every process. For failures after which no rank can go on safely.
    pub fn abort(&self, why: &str) -> ! {
        eprintln!("dp-comm: rank {} of {}: {why}; aborting the job", self.rank(), self.size());
        // SAFETY: MPI_Abort may be called at any time after initialization; it does not
        // return when it succeeds.
        unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 70) };
        std::process::abort()
    }
}

fn null_comm() -> ffi::MPI_Comm {
    // SAFETY: reading a constant the MPI library defines.
    unsafe { ffi::RSMPI_COMM_NULL }
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading a constant the MPI library defines.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// `MPI_IN_PLACE`, which `mpi.h` defines as a macro the bindings cannot carry: `(void *) 1`
/// in Open MPI, `(void *) -1` in MPICH and the libraries built on it. A library of another
/// family is refused rather than guessed at: a wrong value is a wild pointer to MPI.
fn in_place(library: &str) -> Result<usize> {
    const MPICH_FAMILY: [&str; 4] = ["MPICH", "Intel(R) MPI", "MVAPICH", "Microsoft MPI"];
    if library.contains("Open MPI") {
        Ok(1)
    } else if MPICH_FAMILY.iter().any(|name| library.contains(name)) {
        Ok(usize::MAX)
    } else {
        Err(Error::Mpi {
            call: "MPI_Get_library_version",
            code: 0,
            message: format!(
                "`{library}` is neither Open MPI nor of the MPICH family, whose MPI_IN_PLACE this build knows"
            ),
        })
    }
}

fn rank_and_size(comm: ffi::MPI_Comm) -> Result<(usize, usize)> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: `comm` is a valid communicator.
    check("MPI_Comm_rank", unsafe { ffi::MPI_Comm_rank(comm, &mut rank) })?;
    // SAFETY: as above.
    check("MPI_Comm_size", unsafe { ffi::MPI_Comm_size(comm, &mut size) })?;
    Ok((rank as usize, size as usize))
}

fn library_version() -> String {
    let mut text = vec![0 as c_char; 8192];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds more than MPI_MAX_LIBRARY_VERSION_STRING in both Open MPI (256)
    // and MPICH (8192).
    if unsafe { ffi::MPI_Get_library_version(text.as_mut_ptr(), &mut len) } != 0 {
        return "an unknown MPI library".into();
    }
    let bytes: Vec<u8> = text[..len.max(0) as usize].iter().map(|&c| c as u8).collect();
    let version = String::from_utf8_lossy(&bytes);
    version.lines().next().unwrap_or("").trim().trim_end_matches(',').to_string()
}

/// One process's communicator over all processes of the job.
///
/// Its collectives are `MPI_Iallreduce` and friends on the caller's buffers (in place, no
/// staging copy), completed by a loop that tests the request, yielding the core while it
/// waits, until the timeout; see the [module docs](crate::MpiWorld) for what a timeout does.
pub struct MpiComm {
    comm: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// Every rank's description of the call in progress: (packed call, length) pairs.
    calls: Vec<u64>,
    /// The first fatal error: every later call returns it.
    failed: Option<Error>,
    world: MpiWorld,
}

// SAFETY: MPI was initialized with MPI_THREAD_MULTIPLE (checked in `MpiWorld::init`), so any
// thread may call MPI; a communicator is used by one thread at a time because every
// collective takes `&mut self`.
unsafe impl Send for MpiComm {}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("world_size", &self.size)
            .field("timeout", &self.timeout)
            .field("failed", &self.failed)
            .finish()
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        // A communicator that failed may have a collective in flight; freeing it then is
        // undefined, and the job is ending anyway.
        if self.failed.is_none() && !self.world.state.finalized.load(Ordering::Acquire) {
            // SAFETY: no request on `comm` is pending (every collective completed) and MPI is
            // not finalized (finalize waits for every communicator's handle to go).
            unsafe { ffi::MPI_Comm_free(&mut self.comm) };
        }
    }
}

fn datatype(dtype: DType) -> ffi::MPI_Datatype {
    // SAFETY: reading constants the MPI library defines.
    unsafe {
        match dtype {
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::U32 => ffi::RSMPI_UINT32_T,
            DType::U64 => ffi::RSMPI_UINT64_T,
            DType::U8 => ffi::RSMPI_UINT8_T,
        }
    }
}

/// The MPI operation that computes `op` (averages are sums, divided afterwards).
fn operation(op: ReduceOp) -> ffi::MPI_Op {
    // SAFETY: reading constants the MPI library defines.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
            ReduceOp::Max => ffi::RSMPI_MAX,
            ReduceOp::Min => ffi::RSMPI_MIN,
        }
    }
}

impl MpiComm {
    /// The timeout of a collective.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The world this communicator belongs to.
    pub fn world(&self) -> &MpiWorld {
        &self.world
    }

    fn in_place(&self) -> *const c_void {
        self.world.state.in_place as *const c_void
    }

    /// Checks that every rank is about to make the same call. Every rank sees every rank's
    /// description, so all return the same error, and no buffer has been touched.
    fn enter(&mut self, desc: Desc, len: usize, bytes: usize) -> Result<()> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let mine = [desc.pack(), len as u64];
        let mut calls = std::mem::take(&mut self.calls);
        let mut request = null_request();
        // SAFETY: `mine` and `calls` (2 * size elements) outlive the request, which `finish`
        // completes (or the job is aborted).
        let code = unsafe {
            ffi::MPI_Iallgather(
                mine.as_ptr().cast(),
                2,
                ffi::RSMPI_UINT64_T,
                calls.as_mut_ptr().cast(),
                2,
                ffi::RSMPI_UINT64_T,
                self.comm,
                &mut request,
            )
        };
        let done = self.start("MPI_Iallgather", code).and_then(|()| {
            self.finish(request, desc.kind.name(), bytes, "waiting for every rank to arrive")
        });
        let (first_desc, first_len) = (calls[0], calls[1]);
        let found = (1..self.size)
            .find(|&p| calls[2 * p] != first_desc || calls[2 * p + 1] != first_len)
            .map(|p| (p, calls[2 * p], calls[2 * p + 1]));
        self.calls = calls;
        done?;
        if let Some((rank, d, l)) = found {
            let error = Error::Inconsistent {
                op: Kind::from_code(first_desc & 0xff),
                rank,
                detail: difference(first_desc, d, first_len as usize, l as usize),
            };
            self.failed = Some(error.clone());
            return Err(error);
        }
        Ok(())
    }

    /// The result of starting a non-blocking call: an error here means nothing is in flight,
    /// so it can be returned.
    fn start(&mut self, call: &'static str, code: c_int) -> Result<()> {
        check(call, code).inspect_err(|error| {
            self.failed = Some(error.clone());
        })
    }

    /// Completes `request` by testing it until it is done. Testing drives MPI's progress
    /// (Open MPI has no progress thread), so the loop tests often at first, then yields the
    /// core between tests, then sleeps a little: a peer that is late costs this rank almost
    /// no CPU, and one that is on time costs it no latency. Past the timeout, or on an error
    /// from MPI with the request in flight, the job is aborted (see the module docs).
    fn finish(
        &mut self,
        mut request: ffi::MPI_Request,
        op: &'static str,
        bytes: usize,
        phase: &str,
    ) -> Result<()> {
        let started = Instant::now();
        let mut tests = 0u32;
        loop {
            let mut done: c_int = 0;
            // SAFETY: `request` is a live request of this communicator.
            let code = unsafe { ffi::MPI_Test(&mut request, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            if let Err(error) = check("MPI_Test", code) {
                self.world.abort(&format!("{op} of {bytes} bytes failed ({phase}): {error}"));
            }
            if done != 0 {
                return Ok(());
            }
            tests = tests.saturating_add(1);
            let waited = started.elapsed();
            if waited >= self.timeout {
                self.world.abort(&format!(
                    "{op} of {bytes} bytes did not complete within {:?} ({phase}; a peer died, stalled, or is in another collective)",
                    self.timeout
                ));
            }
            if tests < 2000 {
                std::hint::spin_loop();
            } else if waited < Duration::from_secs(1) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Runs one non-blocking collective over `count` elements and completes it.
    fn run(
        &mut self,
        call: &'static str,
        op: &'static str,
        bytes: usize,
        start: impl FnOnce(*mut ffi::MPI_Request) -> c_int,
    ) -> Result<()> {
        let mut request = null_request();
        let code = start(&mut request);
        self.start(call, code)?;
        self.finish(request, op, bytes, "moving data")
    }

    fn fits(op: &'static str, len: usize) -> Result<c_int> {
        c_int::try_from(len).map_err(|_| Error::Config {
            field: "len",
            what: format!("{op} of {len} elements per rank exceeds MPI's int counts"),
        })
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let desc = Desc { kind: Kind::AllReduce, dtype: Some(T::DTYPE), op: Some(op), root: 0 };
        self.enter(desc, buf.len(), size_of_val(buf))?;
        let (dtype, mpi_op, in_place) = (datatype(T::DTYPE), operation(op), self.in_place());
        for piece in buf.chunks_mut(MAX_COUNT) {
            let (ptr, count) = (piece.as_mut_ptr(), piece.len());
            let comm = self.comm;
            // SAFETY: `piece` is the caller's buffer, borrowed until `run` has completed the
            // request; MPI_IN_PLACE makes it both input and output.
            self.run("MPI_Iallreduce", "all_reduce", count * size_of::<T>(), |request| unsafe {
                ffi::MPI_Iallreduce(
                    in_place,
                    ptr.cast(),
                    count as c_int,
                    dtype,
                    mpi_op,
                    comm,
                    request,
                )
            })?;
        }
        finish(buf, op, self.size);
        Ok(())
    }

    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        if root >= self.size {
            return Err(Error::InvalidRank { op: "broadcast", rank: root, world_size: self.size });
        }
        let desc = Desc { kind: Kind::Broadcast, dtype: Some(T::DTYPE), op: None, root };
        self.enter(desc, buf.len(), size_of_val(buf))?;
        let dtype = datatype(T::DTYPE);
        for piece in buf.chunks_mut(MAX_COUNT) {
            let (ptr, count, comm) = (piece.as_mut_ptr(), piece.len(), self.comm);
            // SAFETY: as in `all_reduce`.
            self.run("MPI_Ibcast", "broadcast", count * size_of::<T>(), |request| unsafe {
                ffi::MPI_Ibcast(ptr.cast(), count as c_int, dtype, root as c_int, comm, request)
            })?;
        }
        Ok(())
    }

    fn all_gather<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        Error::check_parts("all_gather", output.len(), input.len(), self.size)?;
        let count = Self::fits("all_gather", input.len())?;
        let desc = Desc { kind: Kind::AllGather, dtype: Some(T::DTYPE), op: None, root: 0 };
        self.enter(desc, input.len(), size_of_val(output))?;
        let (dtype, comm) = (datatype(T::DTYPE), self.comm);
        let (src, dst) = (input.as_ptr(), output.as_mut_ptr());
        // SAFETY: `input` and `output` (`size` times its length, checked above) are borrowed
        // until `run` has completed the request.
        self.run("MPI_Iallgather", "all_gather", size_of_val(output), |request| unsafe {
            ffi::MPI_Iallgather(src.cast(), count, dtype, dst.cast(), count, dtype, comm, request)
        })
    }

    fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        Error::check_parts("reduce_scatter", input.len(), output.len(), self.size)?;
        let count = Self::fits("reduce_scatter", output.len())?;
        let desc = Desc { kind: Kind::ReduceScatter, dtype: Some(T::DTYPE), op: Some(op), root: 0 };
        self.enter(desc, output.len(), size_of_val(input))?;
        let (dtype, mpi_op, comm) = (datatype(T::DTYPE), operation(op), self.comm);
        let (src, dst) = (input.as_ptr(), output.as_mut_ptr());
        let bytes = size_of_val(input);
        self.run("MPI_Ireduce_scatter_block", "reduce_scatter", bytes, |request| {
            // SAFETY: as in `all_gather`, with `input` holding `size` parts.
            unsafe {
                ffi::MPI_Ireduce_scatter_block(
                    src.cast(),
                    dst.cast(),
                    count,
                    dtype,
                    mpi_op,
                    comm,
                    request,
                )
            }
        })?;
        finish(output, op, self.size);
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        let desc = Desc { kind: Kind::Barrier, dtype: None, op: None, root: 0 };
        self.enter(desc, 0, 0)?;
        let comm = self.comm;
        // SAFETY: a barrier touches no buffer.
        self.run("MPI_Ibarrier", "barrier", 0, |request| unsafe {
            ffi::MPI_Ibarrier(comm, request)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_is_known_by_library_family_or_refused() {
        assert_eq!(in_place("Open MPI v4.1.4, package: Debian OpenMPI").unwrap(), 1);
        assert_eq!(in_place("MPICH Version: 4.0.2").unwrap(), usize::MAX);
        assert_eq!(in_place("Intel(R) MPI Library 2021.6 for Linux* OS").unwrap(), usize::MAX);
        assert!(in_place("IBM Spectrum MPI 10.4").is_err());
    }
}
