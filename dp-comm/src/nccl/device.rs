//! The NCCL backend proper, through cudarc's driver and NCCL bindings (loaded at run time).

use std::ffi::{CStr, c_void};
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError,
};
use cudarc::nccl::result::{self as nccl, NcclError, NcclStatus};
use cudarc::nccl::sys::{self, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

use crate::communicator::Communicator;
use crate::element::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::nccl::NcclConfig;

/// The file names cudarc tries for `lib`, for error messages.
fn candidates(lib: &str) -> String {
    cudarc::get_lib_name_candidates(lib).join(", ")
}

/// Checks that the CUDA driver and NCCL libraries can be loaded, so that no later call panics
/// inside cudarc's loader. The error says what was looked for and how to fix it.
///
/// cudarc looks for NCCL under names like `libnccl.so`; NCCL installs and the
/// `nvidia-nccl-cu13` wheel ship `libnccl.so.2`. When only that name loads, the error says so
/// and how to make it visible (a `libnccl.so` symlink on `LD_LIBRARY_PATH`, which
/// `scripts/gpu-check.sh` sets up): the dynamic loader reads `LD_LIBRARY_PATH` once at process
/// start, so a library cannot fix this for its own process.
pub fn nccl_available() -> Result<()> {
    // SAFETY: loading the driver library runs its initializers, which is what any CUDA program
    // does; nothing else is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::LibraryNotFound {
            library: "the CUDA driver (libcuda)",
            looked_for: candidates("cuda"),
            hint: "Install the NVIDIA driver, or put the directory holding libcuda.so on \
                   LD_LIBRARY_PATH."
                .into(),
        });
    }
    // SAFETY: as above, for NCCL.
    if !unsafe { sys::is_culib_present() } {
        // SAFETY: as above; the handle is dropped at once.
        let versioned = unsafe { libloading::Library::new("libnccl.so.2") }.is_ok();
        let hint = if versioned {
            "libnccl.so.2 loads, but cudarc looks only for the names above: make a directory \
             with a symlink `libnccl.so -> /path/to/libnccl.so.2` and put it on LD_LIBRARY_PATH \
             before the process starts (scripts/gpu-check.sh does this)."
        } else {
            "Install NCCL (a system package, or `pip install nvidia-nccl-cu13`) and put a \
             directory holding libnccl.so (a symlink to libnccl.so.2 will do) on LD_LIBRARY_PATH."
        };
        return Err(Error::LibraryNotFound {
            library: "NCCL (libnccl)",
            looked_for: format!(
                "{}; and libnccl.so.2: {}",
                candidates("nccl"),
                if versioned { "found" } else { "not found" }
            ),
            hint: hint.into(),
        });
    }
    Ok(())
}

fn cuda_error(call: &'static str, error: DriverError) -> Error {
    let message = match error.error_string() {
        Ok(text) => format!("{:?}: {}", error.0, text.to_string_lossy()),
        Err(_) => format!("{:?}", error.0),
    };
    Error::Cuda { call, message }
}

/// NCCL's code, its text, and the communicator's last-error text when it has one.
fn nccl_error(call: &'static str, error: NcclError, comm: ncclComm_t) -> Error {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let text = unsafe { CStr::from_ptr(sys::ncclGetErrorString(error.0)) };
    let mut message = text.to_string_lossy().into_owned();
    // SAFETY: ncclGetLastError accepts a live communicator or null and returns a
    // NUL-terminated string owned by NCCL (or null).
    let last = unsafe { sys::ncclGetLastError(comm) };
    if !last.is_null() {
        // SAFETY: non-null, NUL-terminated, valid until the next NCCL call on this thread.
        let last = unsafe { CStr::from_ptr(last) }.to_string_lossy();
        if !last.is_empty() {
            message = format!("{message} ({last})");
        }
    }
    Error::Nccl { call, code: error.0 as i32, message }
}

fn data_type(dtype: DType) -> ncclDataType_t {
    match dtype {
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::F64 => ncclDataType_t::ncclFloat64,
        DType::I32 => ncclDataType_t::ncclInt32,
        DType::I64 => ncclDataType_t::ncclInt64,
        DType::U32 => ncclDataType_t::ncclUint32,
        DType::U64 => ncclDataType_t::ncclUint64,
        DType::U8 => ncclDataType_t::ncclUint8,
    }
}

fn reduce_op(op: ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
    }
}

fn rank_arg(op: &'static str, rank: usize, world_size: usize) -> Result<i32> {
    i32::try_from(rank).map_err(|_| Error::InvalidRank { op, rank, world_size })
}

/// A communicator handle made on NCCL's initialization thread, on its way to the rank's thread.
struct MadeComm(ncclComm_t);

// SAFETY: the handle is only moved, never used, on the initialization thread once NCCL has
// returned it; from then on the rank's thread alone uses it (NCCL allows a communicator to be
// used from another thread than the one that made it, one thread at a time).
unsafe impl Send for MadeComm {}

/// Runs NCCL's blocking initialization on a thread of its own, so that a peer that never
/// joins costs this rank an [`Error::Timeout`] after `timeout` instead of a hang. There is no
/// communicator to abort yet, so the abandoned thread stays blocked inside NCCL (and its
/// communicator, should it ever complete, is never freed): a leak on a path that ends the
/// run, instead of a hung process.
fn init_rank(
    ctx: &Arc<CudaContext>,
    id: sys::ncclUniqueId,
    nranks: i32,
    rank: i32,
    timeout: Duration,
) -> Result<ncclComm_t> {
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    let ctx = Arc::clone(ctx);
    std::thread::Builder::new()
        .name("nccl-init".into())
        .spawn(move || {
            let result =
                ctx.bind_to_thread().map_err(|e| cuda_error("cuCtxSetCurrent", e)).and_then(|()| {
                    let mut raw = MaybeUninit::uninit();
                    // SAFETY: `raw` is written by NCCL on success; the id is a valid unique id.
                    unsafe { nccl::comm_init_rank(raw.as_mut_ptr(), nranks, id, rank) }
                        .map_err(|e| nccl_error("ncclCommInitRank", e, std::ptr::null_mut()))?;
                    // SAFETY: initialized by the successful call above.
                    Ok(MadeComm(unsafe { raw.assume_init() }))
                });
            // The receiver is gone only after a timeout, which already reported the failure.
            let _ = sender.send(result);
        })
        .map_err(|e| Error::Config {
            field: "thread",
            what: format!("cannot spawn NCCL's init: {e}"),
        })?;
    let started = Instant::now();
    match receiver.recv_timeout(timeout) {
        Ok(result) => result.map(|made| made.0),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            Err(Error::Timeout { op: "init", waited: started.elapsed(), missing: None })
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::Config {
            field: "init",
            what: "NCCL's initialization thread panicked".into(),
        }),
    }
}

/// An NCCL unique id: rank 0 makes it and every rank passes it to [`NcclComm::from_id`].
#[derive(Debug, Clone, Copy)]
pub struct NcclId(sys::ncclUniqueId);

impl NcclId {
    /// A fresh id (rank 0 calls this once per group).
    pub fn new() -> Result<Self> {
        nccl_available()?;
        nccl::get_uniqueid()
            .map(NcclId)
            .map_err(|e| nccl_error("ncclGetUniqueId", e, std::ptr::null_mut()))
    }

    /// The id received from rank 0.
    pub fn from_bytes(bytes: &[u8; 128]) -> Result<Self> {
        Ok(NcclId(sys::ncclUniqueId { internal: bytes.map(|b| b as std::ffi::c_char) }))
    }

    /// The id's bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal.map(|c| c as u8)
    }
}

/// One rank of an NCCL group: a [`Communicator`] over host slices (staged through a device
/// buffer) and, with `*_device` methods, over device buffers. Not `Send`: create it on the
/// thread that uses it.
#[derive(Debug)]
pub struct NcclComm {
    raw: ncclComm_t,
    stream: Arc<CudaStream>,
    done: CudaEvent,
    staging: CudaSlice<u8>,
    staging_ptr: u64,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    failed: Option<Error>,
}

impl NcclComm {
    /// Joins the group of `world_size` ranks named by `id` as `rank`, on device
    /// `config.device`. Every rank calls this at about the same time; NCCL's initialization
    /// waits until all have, for at most `config.timeout` (then [`Error::Timeout`]).
    pub fn from_id(
        id: &NcclId,
        rank: usize,
        world_size: usize,
        config: NcclConfig,
    ) -> Result<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::InvalidRank { op: "NcclComm::from_id", rank, world_size });
        }
        if config.staging_bytes < 4096 {
            return Err(Error::Config {
                field: "staging_bytes",
                what: format!("is {}, must be at least 4096", config.staging_bytes),
            });
        }
        if config.timeout.is_zero() {
            return Err(Error::Config { field: "timeout", what: "must not be zero".into() });
        }
        nccl_available()?;
        let ctx = CudaContext::new(config.device).map_err(|e| cuda_error("cuCtxCreate", e))?;
        let stream = ctx.new_stream().map_err(|e| cuda_error("cuStreamCreate", e))?;
        let done = ctx.new_event(None).map_err(|e| cuda_error("cuEventCreate", e))?;
        let staging = stream
            .alloc_zeros::<u8>(config.staging_bytes)
            .map_err(|e| cuda_error("cuMemAlloc", e))?;
        let (staging_ptr, record) = staging.device_ptr(&stream);
        drop(record);
        let nranks = rank_arg("NcclComm::from_id", world_size, world_size)?;
        let me = rank_arg("NcclComm::from_id", rank, world_size)?;
        let raw = init_rank(&ctx, id.0, nranks, me, config.timeout)?;
        let mut comm = NcclComm {
            raw,
            stream,
            done,
            staging,
            staging_ptr,
            rank,
            world_size,
            timeout: config.timeout,
            failed: None,
        };
        // The staging buffer's zeroing must finish before NCCL uses it.
        comm.finish("init")?;
        Ok(comm)
    }

    /// The stream collectives run on; enqueue work that produces or consumes device buffers on
    /// it to keep the order without extra synchronization.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Whether the communicator failed (aborted by the watchdog or an NCCL error).
    pub fn is_poisoned(&self) -> bool {
        self.failed.is_some()
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(error) => Err(error.clone()),
            None => {
                self.stream.context().bind_to_thread().map_err(|e| cuda_error("cuCtxSetCurrent", e))
            }
        }
    }

    /// Records `error`, aborts the communicator (so that kernels waiting on peers exit), and
    /// returns the error.
    fn fail(&mut self, error: Error) -> Error {
        if !self.raw.is_null() {
            // SAFETY: `raw` is a live communicator, aborted once and then forgotten.
            let _ = unsafe { nccl::comm_abort(self.raw) };
            self.raw = std::ptr::null_mut();
        }
        self.failed.get_or_insert(error).clone()
    }

    fn nccl(&mut self, call: &'static str, result: Result<NcclStatus, NcclError>) -> Result<()> {
        match result {
            Ok(_) => Ok(()),
            Err(e) => {
                let error = nccl_error(call, e, self.raw);
                Err(self.fail(error))
            }
        }
    }

    fn cuda(&mut self, call: &'static str, result: Result<(), DriverError>) -> Result<()> {
        result.map_err(|e| self.fail(cuda_error(call, e)))
    }

    /// Waits until everything enqueued on the stream has completed, under the watchdog: past
    /// the timeout, or on an asynchronous NCCL error, the communicator is aborted.
    fn finish(&mut self, op: &'static str) -> Result<()> {
        let recorded = self.done.record(&self.stream);
        self.cuda("cuEventRecord", recorded)?;
        let start = Instant::now();
        let mut round = 0u32;
        loop {
            match self.done.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(self.fail(cuda_error("cuEventQuery", e))),
            }
            let mut state = ncclResult_t::ncclSuccess;
            // SAFETY: `raw` is a live communicator and `state` a valid out-pointer.
            let queried = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut state) };
            for result in [queried, state] {
                if !matches!(result, ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress) {
                    let error = nccl_error("ncclCommGetAsyncError", NcclError(result), self.raw);
                    return Err(self.fail(error));
                }
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                return Err(self.fail(Error::Timeout { op, waited, missing: None }));
            }
            round = round.saturating_add(1);
            if round < 2_000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    fn cu_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    /// Copies host bytes into the staging buffer at `offset`.
    fn upload(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        debug_assert!(offset + bytes.len() <= self.staging.len());
        // SAFETY: the range lies within the staging buffer; the host bytes stay borrowed until
        // `finish` has waited for the copy.
        let result = unsafe {
            cudarc::driver::result::memcpy_htod_async(
                self.staging_ptr + offset as u64,
                bytes,
                self.stream.cu_stream(),
            )
        };
        self.cuda("cuMemcpyHtoDAsync", result)
    }

    /// Copies staging bytes at `offset` into host memory.
    fn download(&mut self, offset: usize, bytes: &mut [u8]) -> Result<()> {
        debug_assert!(offset + bytes.len() <= self.staging.len());
        // SAFETY: as in `upload`; the host bytes stay borrowed until `finish` has waited.
        let result = unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                bytes,
                self.staging_ptr + offset as u64,
                self.stream.cu_stream(),
            )
        };
        self.cuda("cuMemcpyDtoHAsync", result)
    }

    fn staging_at(&self, offset: usize) -> *mut c_void {
        (self.staging_ptr + offset as u64) as usize as *mut c_void
    }

    /// All-reduces a device buffer in place and waits for it.
    pub fn all_reduce_device<T: Element + DeviceRepr>(
        &mut self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.check()?;
        let stream = self.stream.clone();
        let len = buf.len();
        let (ptr, record) = buf.device_ptr_mut(&stream);
        // SAFETY: a live device allocation of `len` elements of `T` on this rank's context,
        // which nothing else uses until `finish` has waited for the collective.
        let queued = unsafe { self.all_reduce_device_ptr::<T>(ptr, len, op) };
        drop(record);
        queued?;
        self.finish("all_reduce")
    }

    /// Makes this communicator's stream wait, on the device, for the work queued on `stream`
    /// so far: a collective enqueued next sees what that work writes, while the host goes on.
    pub fn wait_for(&mut self, stream: &CudaStream) -> Result<()> {
        self.check()?;
        let joined = self.stream.join(stream);
        self.cuda("cuStreamWaitEvent", joined)
    }

    /// Enqueues an in-place all-reduce of `len` elements of `T` at device address `ptr` on
    /// this communicator's stream and returns without waiting: several such calls overlap
    /// with other streams' work, and [`NcclComm::wait`] waits for them all. This is how
    /// gradient buckets are reduced while backward still runs.
    ///
    /// # Safety
    ///
    /// `ptr` must address `len` live elements of `T` in device memory of this rank's
    /// context, which nothing reads or writes until the collective has completed, except
    /// work ordered after it (through [`NcclComm::wait`], or a stream that waits on this
    /// one's).
    pub unsafe fn all_reduce_device_ptr<T: Element>(
        &mut self,
        ptr: u64,
        len: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.check()?;
        let p = ptr as usize as *mut c_void;
        // SAFETY: the caller guarantees the buffer, on our context, for the collective.
        let result = unsafe {
            nccl::all_reduce(
                p,
                p,
                len,
                data_type(T::DTYPE),
                reduce_op(op),
                self.raw,
                self.cu_stream(),
            )
        };
        self.nccl("ncclAllReduce", result)
    }

    /// Waits for every collective enqueued so far, under the watchdog (see the module docs).
    pub fn wait(&mut self) -> Result<()> {
        self.check()?;
        self.finish("all_reduce")
    }

    /// Broadcasts a device buffer from `root` in place and waits for it.
    pub fn broadcast_device<T: Element + DeviceRepr>(
        &mut self,
        buf: &mut CudaSlice<T>,
        root: usize,
    ) -> Result<()> {
        let stream = self.stream.clone();
        let len = buf.len();
        let (ptr, record) = buf.device_ptr_mut(&stream);
        // SAFETY: as in `all_reduce_device`.
        let queued = unsafe { self.broadcast_device_ptr::<T>(ptr, len, root) };
        drop(record);
        queued?;
        self.finish("broadcast")
    }

    /// Enqueues an in-place broadcast from `root` of `len` elements of `T` at device address
    /// `ptr` on this communicator's stream and returns without waiting, as
    /// [`NcclComm::all_reduce_device_ptr`] does: how a ZeRO-1 shard's updated parameters
    /// reach the other ranks.
    ///
    /// # Safety
    ///
    /// As for [`NcclComm::all_reduce_device_ptr`].
    pub unsafe fn broadcast_device_ptr<T: Element>(
        &mut self,
        ptr: u64,
        len: usize,
        root: usize,
    ) -> Result<()> {
        if root >= self.world_size {
            return Err(Error::InvalidRank {
                op: "broadcast",
                rank: root,
                world_size: self.world_size,
            });
        }
        self.check()?;
        let p = ptr as usize as *mut c_void;
        // SAFETY: the caller guarantees the buffer, on our context; `root` is in range.
        let result = unsafe {
            nccl::broadcast(p, p, len, data_type(T::DTYPE), root as i32, self.raw, self.cu_stream())
        };
        self.nccl("ncclBroadcast", result)
    }

    /// All-gathers device buffers (`output` holds `world_size` inputs) and waits for it.
    pub fn all_gather_device<T: Element + DeviceRepr>(
        &mut self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
    ) -> Result<()> {
        Error::check_parts("all_gather", output.len(), input.len(), self.world_size)?;
        let stream = self.stream.clone();
        let (src, record_src) = input.device_ptr(&stream);
        let (dst, record_dst) = output.device_ptr_mut(&stream);
        // SAFETY: both are live device allocations of the checked sizes on this context.
        let queued = unsafe { self.all_gather_device_ptr::<T>(src, dst, input.len()) };
        drop((record_src, record_dst));
        queued?;
        self.finish("all_gather")
    }

    /// Enqueues an all-gather of `len` elements of `T` at device address `src` from every
    /// rank into `dst` (`world_size * len` elements, rank by rank) on this communicator's
    /// stream and returns without waiting, as [`NcclComm::all_reduce_device_ptr`] does: how
    /// compressed gradient pieces reach every rank.
    ///
    /// # Safety
    ///
    /// As for [`NcclComm::all_reduce_device_ptr`], for `src` (read) and `dst` (written).
    pub unsafe fn all_gather_device_ptr<T: Element>(
        &mut self,
        src: u64,
        dst: u64,
        len: usize,
    ) -> Result<()> {
        self.check()?;
        // SAFETY: the caller guarantees both buffers, on our context, for the collective.
        let result = unsafe {
            nccl::all_gather(
                src as usize as *const c_void,
                dst as usize as *mut c_void,
                len,
                data_type(T::DTYPE),
                self.raw,
                self.cu_stream(),
            )
        };
        self.nccl("ncclAllGather", result)
    }

    /// Reduce-scatters device buffers (`input` holds `world_size` outputs) and waits for it.
    pub fn reduce_scatter_device<T: Element + DeviceRepr>(
        &mut self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<()> {
        Error::check_parts("reduce_scatter", input.len(), output.len(), self.world_size)?;
        self.check()?;
        let stream = self.stream.clone();
        let count = output.len();
        let (src, record_src) = input.device_ptr(&stream);
        let (dst, record_dst) = output.device_ptr_mut(&stream);
        // SAFETY: both are live device allocations of the checked sizes on this context.
        let result = unsafe {
            nccl::reduce_scatter(
                src as usize as *const c_void,
                dst as usize as *mut c_void,
                count,
                data_type(T::DTYPE),
                reduce_op(op),
                self.raw,
                self.cu_stream(),
            )
        };
        drop((record_src, record_dst));
        self.nccl("ncclReduceScatter", result)?;
        self.finish("reduce_scatter")
    }

    /// Elements of `T` per piece when a piece needs `parts` staging slots of its size.
    /// Runs an in-place collective on a host buffer, piece by piece through the staging
    /// buffer: upload, `call(staging, len, comm, stream)`, download, wait under the watchdog.
    fn in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        call_name: &'static str,
        op: &'static str,
        mut call: impl FnMut(
            *mut c_void,
            usize,
            ncclComm_t,
            sys::cudaStream_t,
        ) -> Result<NcclStatus, NcclError>,
    ) -> Result<()> {
        let per = self.piece::<T>(1);
        for piece in buf.chunks_mut(per) {
            self.upload(0, bytemuck::cast_slice(piece))?;
            let result = call(self.staging_at(0), piece.len(), self.raw, self.cu_stream());
            self.nccl(call_name, result)?;
            self.download(0, bytemuck::cast_slice_mut(piece))?;
            self.finish(op)?;
        }
        Ok(())
    }

    fn piece<T>(&self, parts: usize) -> usize {
        (self.staging.len() / (size_of::<T>() * parts)).max(1)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // Abort rather than destroy: it never waits for peers, so a drop cannot hang.
            // SAFETY: `raw` is a live communicator, released once.
            let _ = unsafe { nccl::comm_abort(self.raw) };
        }
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.check()?;
        let (dtype, op) = (data_type(T::DTYPE), reduce_op(op));
        self.in_place(buf, "ncclAllReduce", "all_reduce", |p, len, comm, stream| {
            // SAFETY: the staging buffer holds `len` elements of `T`.
            unsafe { nccl::all_reduce(p, p, len, dtype, op, comm, stream) }
        })
    }

    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        let n = self.world_size;
        if root >= n {
            return Err(Error::InvalidRank { op: "broadcast", rank: root, world_size: n });
        }
        self.check()?;
        let dtype = data_type(T::DTYPE);
        self.in_place(buf, "ncclBroadcast", "broadcast", |p, len, comm, stream| {
            // SAFETY: the staging buffer holds `len` elements; `root` is in range.
            unsafe { nccl::broadcast(p, p, len, dtype, root as i32, comm, stream) }
        })
    }

    fn all_gather<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        let n = self.world_size;
        Error::check_parts("all_gather", output.len(), input.len(), n)?;
        self.check()?;
        let (len, per, elem) = (input.len(), self.piece::<T>(n + 1), size_of::<T>());
        let mut at = 0;
        while at < len {
            let m = per.min(len - at);
            self.upload(0, bytemuck::cast_slice(&input[at..at + m]))?;
            let recv = m * elem;
            // SAFETY: the staging buffer holds the piece (`m` elements) and, after it, the
            // gathered `n * m` elements (`per` was sized for `n + 1` slots).
            let result = unsafe {
                nccl::all_gather(
                    self.staging_at(0),
                    self.staging_at(recv),
                    m,
                    data_type(T::DTYPE),
                    self.raw,
                    self.cu_stream(),
                )
            };
            self.nccl("ncclAllGather", result)?;
            for r in 0..n {
                let dst = &mut output[r * len + at..r * len + at + m];
                self.download(recv + r * m * elem, bytemuck::cast_slice_mut(dst))?;
            }
            self.finish("all_gather")?;
            at += m;
        }
        Ok(())
    }

    fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.world_size;
        Error::check_parts("reduce_scatter", input.len(), output.len(), n)?;
        self.check()?;
        let (len, per, elem) = (output.len(), self.piece::<T>(n + 1), size_of::<T>());
        let mut at = 0;
        while at < len {
            let m = per.min(len - at);
            for r in 0..n {
                self.upload(
                    r * m * elem,
                    bytemuck::cast_slice(&input[r * len + at..r * len + at + m]),
                )?;
            }
            let recv = n * m * elem;
            // SAFETY: the staging buffer holds the `n * m` gathered pieces and, after them,
            // the `m` results (`per` was sized for `n + 1` slots).
            let result = unsafe {
                nccl::reduce_scatter(
                    self.staging_at(0),
                    self.staging_at(recv),
                    m,
                    data_type(T::DTYPE),
                    reduce_op(op),
                    self.raw,
                    self.cu_stream(),
                )
            };
            self.nccl("ncclReduceScatter", result)?;
            self.download(recv, bytemuck::cast_slice_mut(&mut output[at..at + m]))?;
            self.finish("reduce_scatter")?;
            at += m;
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.check()?;
        let p = self.staging_at(0);
        // SAFETY: one byte of the staging buffer, reduced in place.
        let result = unsafe {
            nccl::all_reduce(
                p,
                p,
                1,
                ncclDataType_t::ncclUint8,
                ncclRedOp_t::ncclMax,
                self.raw,
                self.cu_stream(),
            )
        };
        self.nccl("ncclAllReduce", result)?;
        self.finish("barrier")
    }
}

/// Runs one thread per GPU of this process, each with its rank's communicator on device
/// `rank`.
#[derive(Debug)]
pub struct NcclGroup;

impl NcclGroup {
    /// Makes a unique id, starts `world_size` threads, builds rank `r`'s communicator on device
    /// `r` inside thread `r`, runs `body` there, and returns the results in rank order (or the
    /// first rank's error).
    pub fn run<R: Send>(
        world_size: usize,
        config: NcclConfig,
        body: impl Fn(&mut NcclComm) -> R + Sync,
    ) -> Result<Vec<R>> {
        let id = NcclId::new()?;
        let body = &body;
        let results: Vec<Result<R>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..world_size)
                .map(|rank| {
                    s.spawn(move || {
                        let config = NcclConfig { device: rank, ..config };
                        let mut comm = NcclComm::from_id(&id, rank, world_size, config)?;
                        Ok(body(&mut comm))
                    })
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(rank, h)| h.join().unwrap_or(Err(Error::PeerLost { rank })))
                .collect()
        });
        results.into_iter().collect()
    }
}
