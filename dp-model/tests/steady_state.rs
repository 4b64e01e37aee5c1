//! After warm-up, a training step (forward, loss, backward, optimizer) allocates nothing
//! from this crate's code. A GEMM library (the `gemm` crate, matrixmultiply) allocates its
//! packing buffers inside each call; that is the one exception, so it is counted: the step
//! must allocate exactly what its GEMMs allocate when run bare (nothing, on this crate's own
//! kernels).

mod support;

use dp_mem::{CountingAlloc, Pool, Tracker};
use dp_model::{
    BareGemm, GemmBackend, Model, ModelOptions, ModelSpec, Optimizer, PruneSchedule, Pruner,
    Recompute, SavedPrecision, Sgd, Sparsity, StepOptions, Targets,
};
use support::Rng;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

#[test]
fn a_steady_step_allocates_only_inside_gemm() {
    // This crate's own kernels where the CPU has them: the `gemm` crate, the default on AVX2,
    // allocates in every call, and a convolution runs its products in chunks, more calls than
    // its shapes (so then only the models without convolutions are compared).
    if !GemmBackend::Avx512.available() && GemmBackend::Avx2.available() {
        // SAFETY: set before any thread starts and before anything reads it.
        unsafe { std::env::set_var("DP_GEMM", "avx2") };
    }
    let own = matches!(GemmBackend::current(), GemmBackend::Avx512 | GemmBackend::Avx2);
    println!("GEMM backend: {}", GemmBackend::current().name());
    let pool = Pool::new(&Tracker::new());
    let gpt = dp_model::GptShape { layers: 2, heads: 2, dim: 32, dropout: 0.1 };
    let (f32, bf16) = (SavedPrecision::F32, SavedPrecision::Bf16);
    let resnet = ModelSpec::resnet_cifar(20, [3, 8, 8], 10).unwrap();
    let cases = [
        (ModelSpec::mlp(784, &[512, 256], 10), Recompute::Off, 64, f32),
        (ModelSpec::mlp(784, &[512, 256], 10), Recompute::Off, 64, bf16),
        (ModelSpec::lenet([1, 28, 28], 10), Recompute::Off, 16, f32),
        (ModelSpec::lenet([1, 28, 28], 10), Recompute::Auto, 16, f32),
        (ModelSpec::lenet([1, 28, 28], 10), Recompute::Off, 16, bf16),
        (ModelSpec::lenet([1, 28, 28], 10), Recompute::Auto, 16, bf16),
        (resnet.clone(), Recompute::Off, 4, bf16),
        (resnet, Recompute::Auto, 4, bf16),
        (ModelSpec::gpt("gpt", 10, 24, gpt), Recompute::Off, 4, f32),
        (ModelSpec::gpt("gpt", 10, 24, gpt), Recompute::Auto, 4, f32),
        (ModelSpec::gpt("gpt", 10, 24, gpt), Recompute::Off, 4, bf16),
        (ModelSpec::gpt("gpt", 10, 24, gpt), Recompute::Auto, 4, bf16),
    ];
    for (spec, recompute, batch, saved) in cases {
        if !own && (spec.name == "lenet" || spec.name.starts_with("resnet")) {
            println!(
                "{} skipped: the `gemm` crate allocates per chunk of a convolution",
                spec.name
            );
            continue;
        }
        let options = ModelOptions::new(batch, 1).recompute(recompute.clone()).saved(saved);
        let mut model = Model::<f32>::new(&spec, &pool, options).unwrap();
        let mut opt = Sgd::new(
            model.params().len(),
            dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
            &pool,
        )
        .unwrap();
        let mut pruner =
            Pruner::new(model.layout(), Sparsity::Global(0.5), PruneSchedule::one_shot()).unwrap();
        let mut rng = Rng::new(1);
        // Token ids for a language model (valid features for the others).
        let x = rng.array::<f32>(batch, model.input_len()).mapv(|v| (v.abs() * 9.0).floor());
        let y = rng.labels(batch * model.rows_per_sample(), 10);
        let mut step = |model: &mut Model<f32>, t: u64| {
            let opts = StepOptions { step: t, ..Default::default() };
            let loss = model.forward_backward(x.view(), Targets::Classes(&y), &opts).unwrap();
            let (params, grads) = model.params_and_grads();
            opt.step(params, grads, 0.01).unwrap();
            pruner.update(t, params);
            loss
        };
        step(&mut model, 0);
        let (_, counts) = CountingAlloc::measure(|| step(&mut model, 1)).unwrap();

        let mut bare: Vec<BareGemm<f32>> =
            model.gemm_shapes(batch).into_iter().map(BareGemm::new).collect();
        let (_, gemm_counts) =
            CountingAlloc::measure(|| bare.iter_mut().for_each(BareGemm::run)).unwrap();
        println!(
            "{} ({recompute:?}, {saved:?}): step {} allocation calls, its {} GEMMs bare {}",
            spec.name,
            counts.calls(),
            bare.len(),
            gemm_counts.calls()
        );
        assert_eq!(counts.calls(), gemm_counts.calls(), "{}: allocations outside GEMM", spec.name);

        let (_, eval_counts) = CountingAlloc::measure(|| {
            model.forward_eval(x.view()).unwrap();
        })
        .unwrap();
        assert!(eval_counts.calls() <= gemm_counts.calls());
    }
}
