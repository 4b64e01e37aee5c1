//! After warm-up, a training step (forward, loss, backward, optimizer) allocates nothing
//! from this crate's code. A GEMM library (the `gemm` crate, matrixmultiply) allocates its
//! packing buffers inside each call; that is the one exception, so it is counted: the step
//! must allocate exactly what its GEMMs allocate when run bare (nothing, on this crate's own
//! kernels).

mod support;

use dp_mem::{CountingAlloc, Pool, Tracker};
use dp_model::{
    BareGemm, Model, ModelOptions, ModelSpec, Optimizer, PruneSchedule, Pruner, Recompute, Sgd,
    Sparsity, StepOptions, Targets,
};
use support::Rng;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

#[test]
fn a_steady_step_allocates_only_inside_gemm() {
    let pool = Pool::new(&Tracker::new());
    let cases = [
        (ModelSpec::mlp(784, &[512, 256], 10), Recompute::Off, 64),
        (ModelSpec::lenet([1, 28, 28], 10), Recompute::Off, 16),
        (ModelSpec::lenet([1, 28, 28], 10), Recompute::Auto, 16),
    ];
    for (spec, recompute, batch) in cases {
        let options = ModelOptions::new(batch, 1).recompute(recompute.clone());
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
        let x = rng.array::<f32>(batch, model.input_len());
        let y = rng.labels(batch, 10);
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
            "{} ({recompute:?}): step {} allocation calls, its {} GEMMs bare {}",
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
