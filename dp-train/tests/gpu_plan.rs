//! Plans of a GPU run (`device = cuda`) on a machine without one: the budget is the GPU's,
//! the plan predicts the device's memory with dp-model's [`GpuMemory::predict`] for the
//! settings it chose, turns on the device's memory savers to fit, names the least budget
//! when nothing fits, and `largest_model` searches the GPU's memory.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::TempDir;
use dp_data::{TextOptions, WriterOptions, import_text};
use dp_model::{GpuMemory, GpuState, ModelOptions, ModelSpec, StatePrecision};
use dp_train::{
    ByteSize, Device, GradCompression, MemoryPlan, RunOptions, TrainConfig, largest_model,
    plan_memory, train,
};

const CONTEXT: usize = 24;

/// A byte-level token dataset of a small text, imported once for all the tests.
fn text() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dp-train-gpu-plan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let words = ["the", "device", "holds", "what", "the", "plan", "says", "."];
        let text: String =
            (0..4000).map(|i| words[(i * 7 + i / 8) % 8]).collect::<Vec<_>>().join(" ");
        let file = dir.join("corpus.txt");
        std::fs::write(&file, text).unwrap();
        import_text(&[file.as_path()], &dir, &TextOptions::default(), WriterOptions::default())
            .unwrap();
        dir
    })
}

/// A GPT of two blocks 64 wide on the GPU, with Adam, under `budget`.
fn config(budget: Option<u64>) -> TrainConfig {
    TrainConfig {
        train_data: text().join("train"),
        eval_data: None,
        model: "gpt:2,2,64".into(),
        context: Some(CONTEXT),
        device: Device::Cuda,
        replicas: 1,
        optimizer: Some(common::adam()),
        global_batch: 32,
        steps: Some(1),
        memory_budget: budget.map(ByteSize),
        ..TrainConfig::default()
    }
}

/// What dp-model predicts for the run `plan` chose: its model at its micro-batch and savers,
/// Adam's two moments in its state's precision.
fn predicted(plan: &MemoryPlan) -> GpuMemory {
    let config = &plan.config;
    let spec = ModelSpec::builtin(&config.model, &[CONTEXT], 256).unwrap();
    let recompute = config.recompute.model();
    let options = ModelOptions::new(plan.micro_batch, config.seed)
        .recompute(recompute)
        .saved(config.activations);
    let decayed_ranges = match config.decay_bias_and_norm {
        Some(false) => Some(spec.layout().unwrap().decayed_ranges().len()),
        _ => None,
    };
    let state = GpuState {
        buffers: 2,
        precision: StatePrecision::from_bits(config.optimizer_bits).unwrap(),
        shard: None,
        decayed_ranges,
        pruned: false,
    };
    GpuMemory::predict(&spec, &options, config.precision, state).unwrap()
}

#[test]
fn a_gpt_is_fitted_to_the_gpus_memory_with_the_devices_savers() {
    let given = plan_memory(&config(None), 1).unwrap();
    let whole = given.gpu.expect("the GPU's memory under device = cuda");
    assert_eq!(whole, predicted(&given));
    assert_eq!(whole.by_tag().total(), whole.total());
    // Adam's two moments, and the ranges weight decay applies to.
    assert!(whole.blocks >= whole.total(), "{whole:?}");
    assert!(whole.optimizer_state >= 2 * whole.grads, "{whole:?}");
    let printed = given.to_string();
    assert!(printed.contains("memory plan    GPU memory") && printed.contains("on the GPU"));
    assert!(printed.contains("saved activations") && printed.contains("optimizer state"));

    // A byte less than the run as given: a saver turns on, and the plan fits.
    let fitted = plan_memory(&config(Some(whole.blocks - 1)), 1).unwrap();
    let device = fitted.gpu.expect("the GPU's memory");
    assert!(!fitted.turned_on.is_empty(), "{fitted}");
    assert!(device.blocks < whole.blocks, "{fitted}");
    assert_eq!(device, predicted(&fitted), "{fitted}");
    assert_eq!(fitted.budgeted_bytes(), device.blocks);
    let savers = ["recompute", "activations", "grad_accum", "optimizer_bits"];
    assert!(savers.iter().any(|s| fitted.turned_on.join(" ").contains(s)), "{fitted}");
    // Only what the device has: the host's settings stay as given.
    assert_eq!(
        (fitted.config.data_prefetch, fitted.config.replicas),
        (given.config.data_prefetch, 1)
    );
    assert!(fitted.to_string().contains("turned on"), "{fitted}");
}

#[test]
fn a_gpu_budget_below_every_plan_names_the_least_and_train_refuses_before_the_gpu() {
    let error = plan_memory(&config(Some(1 << 20)), 1).unwrap_err().to_string();
    for what in ["memory_budget", "of GPU memory", "the least it can take is"] {
        assert!(error.contains(what), "{error}");
    }
    // `train` plans the same way before it asks for a GPU.
    let out = TempDir::new("gpu-plan-refused");
    let refused = train(config(Some(1 << 20)), &RunOptions::new(&out.0), &mut ());
    let refused = refused.unwrap_err().to_string();
    assert!(refused.contains("of GPU memory"), "{refused}");
}

#[test]
fn the_largest_gpt_for_a_gpu_budget_fits_it_and_the_next_does_not() {
    let budget = 48 << 20;
    let largest = largest_model("gpt", &config(Some(budget)), 1).unwrap();
    let device = largest.gpu.expect("the GPU's memory");
    assert!(device.blocks <= budget, "{largest}");
    assert_eq!(device, predicted(&largest));
    let n: usize = largest.config.model["gpt:".len()..].split(',').next().unwrap().parse().unwrap();
    assert_eq!(largest.config.model, format!("gpt:{n},{n},{}", 64 * n));
    assert!(n >= 2, "{largest}");
    let next = TrainConfig {
        model: format!("gpt:{},{},{}", n + 1, n + 1, 64 * (n + 1)),
        ..config(Some(budget))
    };
    let error = plan_memory(&next, 1).unwrap_err().to_string();
    assert!(error.contains("memory_budget") && error.contains("of GPU memory"), "{error}");
}

/// Over two GPUs: ZeRO-1 keeps the state of rank 0's shard only, and an int8 compressed
/// all-reduce takes its buffers from the model's pool (the residual of every gradient, a
/// piece's payload and both ranks', the partial maxima).
#[test]
fn zero_1_and_a_compressed_all_reduce_among_gpus_are_counted() {
    let whole = plan_memory(&config(None), 2).unwrap().gpu.unwrap();
    let two = TrainConfig {
        zero_stage: 1,
        compression: GradCompression::Int8,
        bucket_size: ByteSize(4096),
        ..config(None)
    };
    let plan = plan_memory(&two, 2).unwrap();
    let device = plan.gpu.unwrap();
    let params = ModelSpec::builtin("gpt:2,2,64", &[CONTEXT], 256).unwrap().layout().unwrap().len();
    let payload = (4 + 1024) as u64;
    assert_eq!(device.comm, 4 * params as u64 + 3 * payload + 4 * 1024, "{plan}");
    assert!(device.optimizer_state < whole.optimizer_state, "{plan}");
    assert!(plan.to_string().contains("compressed all-reduce"), "{plan}");
}
