//! The allocation figure the summary prints is measured, and it is zero: with the counting
//! allocator installed, a steady training step makes no allocation of the workspace's beyond
//! a GEMM library's packing buffers (none on this crate's own kernels, the default with
//! AVX-512), whether gradients are reduced in place after backward or bucket by bucket on
//! communication threads, with and without ZeRO-1.
//!
//! One test in its own binary, so that the global allocator counts only this run.

mod common;

use common::{TempDir, config};
use dp_mem::CountingAlloc;
use dp_model::GemmBackend;
use dp_train::{RunOptions, TrainConfig, train};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

#[test]
fn a_steady_step_allocates_nothing_of_the_workspace() {
    let out = TempDir::new("alloc");
    let (small, one_bucket) = (dp_train::ByteSize(10 << 10), TrainConfig::default().bucket_size);
    for (name, bucket_size, zero_stage) in
        [("in-place", one_bucket, 0), ("buckets", small, 0), ("zero1", small, 1)]
    {
        let c = TrainConfig { bucket_size, zero_stage, eval_data: None, ..config(2, 12) };
        let summary = train(c, &RunOptions::new(out.0.join(name)), &mut ()).unwrap();
        let allocs = summary.allocs_per_step.expect("counted with the allocator installed");
        let workspace = allocs - summary.gemm_allocs_per_step;
        // The libraries allocate on every call; dp-model's own kernels hold their buffers.
        let library =
            matches!(GemmBackend::current(), GemmBackend::GemmCrate | GemmBackend::Matrixmultiply);
        assert_eq!(
            summary.gemm_allocs_per_step > 0.0,
            library,
            "{name}: {} GEMM allocations per step on {}",
            summary.gemm_allocs_per_step,
            GemmBackend::current().name()
        );
        assert_eq!(
            workspace, 0.0,
            "{name}: {allocs} allocations per step, {} GEMMs",
            summary.gemm_allocs_per_step
        );
    }
}
