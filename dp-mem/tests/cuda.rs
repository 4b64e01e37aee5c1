//! Device and pinned memory through the pool (feature `cuda`): accounted by tag like host
//! memory, cached and reused without going back to the driver, given back by `empty_cache`,
//! and an out-of-memory error that names the tag. Without a GPU (or without the feature) the
//! tests say why they skip, after checking the error that says so.

use dp_mem::{CudaBackend, Error, PinnedBackend, Pool, PoolConfig, Tag, Tracker, cuda_available};

/// `None` (after printing why) where CUDA memory cannot be had; checks the error first.
fn gpu() -> Option<CudaBackend> {
    match cuda_available().and_then(|()| CudaBackend::new(0)) {
        Ok(backend) => Some(backend),
        Err(error) => {
            let text = error.to_string();
            match error {
                Error::CudaNotCompiled => assert!(text.contains("`cuda` feature"), "{text}"),
                Error::CudaUnavailable { .. } => {
                    assert!(text.contains("libcuda") || text.contains("GPU"), "{text}")
                }
                other => panic!("unexpected error {other}"),
            }
            assert!(std::env::var_os("DP_REQUIRE_GPU").is_none(), "a GPU was required: {text}");
            eprintln!("skipping CUDA memory test: {text}");
            None
        }
    }
}

#[test]
fn without_cuda_the_constructors_say_why() {
    if cfg!(feature = "cuda") && cuda_available().is_ok() {
        return;
    }
    assert!(CudaBackend::new(0).is_err());
    assert!(PinnedBackend::new(0).is_err());
    assert!(gpu().is_none());
}

#[test]
fn device_buffers_are_accounted_cached_and_given_back() {
    let Some(backend) = gpu() else { return };
    let (free_before, total) = backend.memory_info().unwrap();
    let tracker = Tracker::new();
    let pool = Pool::with_backend(&tracker, backend, PoolConfig::default());
    let params = pool.alloc::<f32>(1 << 20, Tag::Param).unwrap();
    let grads = pool.alloc::<f32>(1 << 20, Tag::Grad).unwrap();
    assert_ne!(params.as_ptr(), grads.as_ptr());
    assert_eq!(tracker.snapshot().tag(Tag::Param).current, 4 << 20);
    let (free_allocated, _) = pool.backend().memory_info().unwrap();
    assert!(free_before - free_allocated >= 8 << 20, "{free_before} -> {free_allocated}");

    // A dropped buffer's block comes back for the next request, without the driver.
    let address = grads.as_ptr();
    drop(grads);
    let again = pool.alloc::<f32>(1 << 20, Tag::Grad).unwrap();
    assert_eq!(again.as_ptr(), address);
    assert_eq!((pool.stats().hits, pool.stats().misses), (1, 2));
    drop((params, again));
    assert_eq!(pool.stats().live_buffers, 0);
    assert!(pool.empty_cache() >= 8 << 20);
    let (free_after, _) = pool.backend().memory_info().unwrap();
    assert!(free_after >= free_allocated + (8 << 20), "{free_allocated} -> {free_after}");

    // More than the GPU has: the driver's error, with the tag and what to do.
    let error = pool.alloc::<u8>(2 * total as usize, Tag::Activation).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("cuda") && text.contains("Activation"), "{text}");
    assert!(text.contains("empty_cache"), "{text}");
    // And over the budget: the pool's report names the tag and the knob.
    tracker.set_budget(Some(1 << 20));
    let error = pool.alloc::<f32>(1 << 20, Tag::Activation).unwrap_err();
    assert!(matches!(error, Error::OutOfMemory(_)), "{error}");
}

#[test]
fn pinned_buffers_are_zeroed_host_memory() {
    if gpu().is_none() {
        return;
    }
    let tracker = Tracker::new();
    let pool = Pool::with_backend(&tracker, PinnedBackend::new(0).unwrap(), PoolConfig::default());
    let mut staging = pool.alloc_zeroed::<f32>(256 * 784, Tag::Data).unwrap();
    assert!(staging.iter().all(|&v| v == 0.0));
    staging[7] = 1.5;
    assert_eq!(staging[7], 1.5);
    assert_eq!(tracker.snapshot().tag(Tag::Data).current, 256 * 784 * 4);
}
