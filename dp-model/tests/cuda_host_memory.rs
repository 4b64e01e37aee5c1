//! What the CUDA path takes from host memory, in a process of its own: after
//! [`CudaRuntime::load`], a model and its steps add little more than the host memory they
//! account (their page-locked staging buffers, the CPU model) and the batch itself, so a run
//! that loads the runtime before it measures its starting memory predicts its peak (GPU runs only;
//! elsewhere the test says why it skips, unless `DP_REQUIRE_GPU` is set).

mod support;

use dp_mem::{Pool, Tracker, process_memory};
use dp_model::{CudaModel, CudaRuntime, Model, ModelOptions, ModelSpec, StepOptions, Targets};
use support::Rng;

/// Plain SGD with momentum, the update these steps take.
const MOMENTUM: dp_model::SgdConfig =
    dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 };

const MIB: u64 = 1 << 20;

fn rss() -> u64 {
    process_memory().expect("/proc/self/status").rss
}

#[test]
fn after_the_runtime_a_model_and_its_steps_add_what_they_account() {
    let before = rss();
    // Held to the end: the memory it brought in stays counted.
    let Some(_runtime) = support::on_gpu("the CUDA host memory test", CudaRuntime::load(0)) else {
        return;
    };
    let loaded = rss();

    let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
    let spec = ModelSpec::mlp(784, &[512, 256], 10);
    let batch = 4096;
    let cpu = Model::<f32>::new(&spec, &pool, ModelOptions::new(batch, 1)).unwrap();
    let mut gpu = CudaModel::from_model(&cpu, 0, &tracker, pool.tracker()).unwrap();
    let mut rng = Rng::new(3);
    let (x, labels) = (rng.array::<f32>(batch, 784), rng.labels(batch, 10));
    let mut velocity = gpu.state_buffer().unwrap();
    for step in 0..20 {
        let options = StepOptions { step, ..StepOptions::default() };
        gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
        gpu.sgd_step(Some(&mut velocity), 1e-3, &MOMENTUM).unwrap();
    }
    gpu.wait().unwrap();
    let after = rss();

    let accounted = pool.tracker().snapshot().peak_held;
    let batch_bytes = (x.len() * 4 + labels.len() * 8) as u64;
    let added = after.saturating_sub(loaded);
    println!(
        "runtime {} MiB; a model and 20 steps {} MiB, accounting {} MiB and a {} MiB batch",
        loaded.saturating_sub(before) / MIB,
        added / MIB,
        accounted / MIB,
        batch_bytes / MIB
    );
    // What is left unaccounted (cuBLAS kernels for the larger shapes, loaded on first use; the
    // allocator's own) stays within a tenth of the runtime's, as the memory plan's prediction
    // must stay within 1.1x of the peak.
    let unaccounted = added.saturating_sub(accounted + batch_bytes);
    let runtime_bytes = loaded.saturating_sub(before);
    assert!(
        unaccounted <= runtime_bytes / 10,
        "{} MiB unaccounted against a {} MiB runtime",
        unaccounted / MIB,
        runtime_bytes / MIB
    );
}
