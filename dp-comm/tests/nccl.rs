//! The shared cases on the NCCL backend. They need a GPU, CUDA and NCCL; without them (or
//! without the `cuda` feature) they print why they are skipped and pass. World size: the
//! `DP_COMM_NCCL_RANKS` environment variable, 1 by default (one GPU per rank; NCCL refuses two
//! ranks on one GPU).

mod cases;

use dp_comm::{Error, NcclComm, NcclConfig, NcclGroup, NcclId, nccl_available};

fn world_size() -> usize {
    std::env::var("DP_COMM_NCCL_RANKS").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}

/// Runs `body` on every rank, or returns `None` after printing why it cannot run here.
fn run<R: Send>(body: impl Fn(&mut NcclComm) -> R + Sync) -> Option<Vec<R>> {
    if let Err(reason) = nccl_available() {
        eprintln!("skipping NCCL test: {reason}");
        return None;
    }
    match NcclGroup::run(world_size(), NcclConfig::default(), body) {
        Ok(results) => Some(results),
        Err(Error::Cuda { message, .. }) if message.contains("NO_DEVICE") => {
            eprintln!("skipping NCCL test: no CUDA device ({message})");
            None
        }
        Err(error) => panic!("NCCL group failed: {error}"),
    }
}

#[test]
fn shared_cases() {
    if let Some(results) = run(cases::all) {
        assert_eq!(results.len(), world_size());
    }
}

#[test]
fn staging_in_pieces_gives_the_same_results() {
    // A staging buffer much smaller than the data: every collective goes in several pieces.
    if nccl_available().is_err() {
        eprintln!("skipping NCCL test: {}", nccl_available().unwrap_err());
        return;
    }
    let mut config = NcclConfig::default();
    config.staging_bytes = 4096;
    let n = world_size();
    let results = NcclGroup::run(n, config, |comm| {
        cases::all_reduce(comm);
        cases::all_gather(comm);
        cases::reduce_scatter(comm);
    });
    if let Err(error) = results {
        assert!(error.to_string().contains("NO_DEVICE"), "{error}");
    }
}

#[test]
fn ids_round_trip_through_bytes() {
    // Skipped only where NCCL is absent (or not built in); any other failure fails the test.
    if let Err(reason) = nccl_available() {
        eprintln!("skipping NCCL test: {reason}");
        return;
    }
    let id = NcclId::new().expect("NCCL loads, so it makes an id");
    let bytes = id.to_bytes();
    assert_eq!(NcclId::from_bytes(&bytes).unwrap().to_bytes(), bytes);
}

#[test]
fn an_id_is_shared_from_rank_0_or_every_rank_fails() {
    let comms = dp_comm::LocalGroup::new(3).unwrap();
    let ids: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> =
            comms.into_iter().map(|mut c| s.spawn(move || NcclId::shared(&mut c))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    match &ids[0] {
        Ok(id) => {
            for other in &ids[1..] {
                assert_eq!(other.as_ref().unwrap().to_bytes(), id.to_bytes());
            }
        }
        Err(reason) => {
            eprintln!("rank 0 has no NCCL ({reason}); the others must say so");
            for other in &ids[1..] {
                let error = other.as_ref().unwrap_err();
                assert!(error.to_string().contains("rank 0 could not make an NCCL id"), "{error}");
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_feature_constructors_say_so() {
    assert_eq!(nccl_available(), Err(Error::CudaNotCompiled));
    assert!(matches!(NcclId::new(), Err(Error::CudaNotCompiled)));
    assert!(matches!(
        NcclGroup::run(1, NcclConfig::default(), |_| ()),
        Err(Error::CudaNotCompiled)
    ));
    assert!(Error::CudaNotCompiled.to_string().contains("--features cuda"));
}

#[cfg(feature = "cuda")]
#[test]
fn device_buffers() {
    use cudarc::driver::CudaSlice;
    use dp_comm::{Communicator, ReduceOp};
    let n = world_size();
    let len = 1200 * n;
    let Some(results) = run(|comm| {
        let stream = comm.stream().clone();
        let rank = comm.rank();
        let host: Vec<f32> = (0..len).map(|i| (i % 7 + rank) as f32).collect();
        let mut buf: CudaSlice<f32> = stream.clone_htod(&host).unwrap();
        comm.all_reduce_device(&mut buf, ReduceOp::Sum).unwrap();
        let mut gathered: CudaSlice<f32> = stream.alloc_zeros(len * n).unwrap();
        comm.all_gather_device(&buf, &mut gathered).unwrap();
        let mut part: CudaSlice<f32> = stream.alloc_zeros(len / n).unwrap();
        comm.reduce_scatter_device(&buf, &mut part, ReduceOp::Max).unwrap();
        comm.broadcast_device(&mut buf, 0).unwrap();
        (
            stream.clone_dtoh(&buf).unwrap(),
            stream.clone_dtoh(&gathered).unwrap(),
            stream.clone_dtoh(&part).unwrap(),
            rank,
        )
    }) else {
        return;
    };
    let ranks: usize = (0..n).sum();
    let want = |i: usize| (n * (i % 7) + ranks) as f32;
    for (reduced, gathered, part, rank) in results {
        assert!(reduced.iter().enumerate().all(|(i, x)| *x == want(i)));
        assert!(gathered.iter().enumerate().all(|(i, x)| *x == want(i % len)));
        let m = len / n;
        assert!(part.iter().enumerate().all(|(i, x)| *x == want(rank * m + i)));
    }
}

#[cfg(feature = "cuda")]
#[test]
fn enqueued_buckets_reduce_after_the_work_they_wait_for() {
    use cudarc::driver::{CudaSlice, DevicePtr};
    use dp_comm::{Communicator, ReduceOp};
    let n = world_size();
    let len = 4096;
    let Some(results) = run(|comm| {
        // The buffer is written on another stream, which the buckets wait for on the device.
        let producer = comm.stream().context().new_stream().unwrap();
        let rank = comm.rank();
        let mut buf: CudaSlice<f32> = producer.alloc_zeros(len).unwrap();
        let host: Vec<f32> = (0..len).map(|i| (i % 5 + rank) as f32).collect();
        producer.memcpy_htod(&host, &mut buf).unwrap();
        comm.wait_for(&producer).unwrap();
        let (base, record) = buf.device_ptr(&producer);
        drop(record);
        // Two buckets, the tail first, as backward makes them ready.
        for range in [len / 2..len, 0..len / 2] {
            let ptr = base + 4 * range.start as u64;
            // SAFETY: a live buffer of `len` f32 on this rank's context, untouched until
            // `wait` returns.
            unsafe { comm.all_reduce_device_ptr::<f32>(ptr, range.len(), ReduceOp::Sum) }.unwrap();
        }
        comm.wait().unwrap();
        producer.clone_dtoh(&buf).unwrap()
    }) else {
        return;
    };
    let ranks: usize = (0..n).sum();
    for reduced in results {
        assert!(reduced.iter().enumerate().all(|(i, x)| *x == (n * (i % 5) + ranks) as f32));
    }
}
