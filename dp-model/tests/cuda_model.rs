//! The GPU training step against the CPU's on the same model, inputs and seed: losses,
//! gradients and 20 optimizer steps agree within 1e-4 (GPU runs only; elsewhere the tests say
//! why they skip, unless `DP_REQUIRE_GPU` is set, as `scripts/gpu-check.sh` does).

mod support;

use dp_mem::{Pool, Tracker};
use dp_model::{
    Adam, CudaModel, Error, LayerSpec, Model, ModelOptions, ModelSpec, Optimizer, Sgd, StepOptions,
    Targets,
};
use support::Rng;

/// An MLP with every dense op the GPU path has: linear layers, each activation, dropout.
fn spec() -> ModelSpec {
    ModelSpec {
        name: "gpu-check".into(),
        input: vec![784],
        layers: vec![
            LayerSpec::Linear { out: 64 },
            LayerSpec::Gelu,
            LayerSpec::Dropout { p: 0.2 },
            LayerSpec::Linear { out: 32 },
            LayerSpec::Tanh,
            LayerSpec::Linear { out: 16 },
            LayerSpec::Relu,
            LayerSpec::Linear { out: 10 },
        ],
    }
}

/// The CPU model and its GPU copy (device memory under `tracker`, its page-locked staging
/// buffers under `pool`'s), or `None` (after printing why) without a GPU.
fn models(tracker: &Tracker, pool: &Pool) -> Option<(Model<f32>, CudaModel)> {
    let cpu = Model::<f32>::new(&spec(), pool, ModelOptions::new(64, 3)).unwrap();
    let gpu =
        support::on_gpu("GPU model test", CudaModel::from_model(&cpu, 0, tracker, pool.tracker()))?;
    Some((cpu, gpu))
}

fn max_relative_difference(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).map(|(x, y)| f64::from((x - y).abs() / scale)).fold(0.0, f64::max)
}

#[test]
fn a_gpu_step_matches_the_cpu_step() {
    let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
    let Some((mut cpu, mut gpu)) = models(&tracker, &pool) else { return };
    let mut rng = Rng::new(11);
    let x = rng.array::<f32>(64, 784);
    let mut labels = rng.labels(64, 10);
    labels[5] = -1;
    let options = StepOptions { step: 4, ..StepOptions::default() };
    let a = cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
    let b = gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
    assert_eq!((a.samples, a.correct), (b.samples, b.correct));
    assert!((a.loss_sum - b.loss_sum).abs() <= 1e-4 * a.loss_sum.abs(), "{a:?} {b:?}");
    let mut grads = vec![0f32; cpu.params().len()];
    gpu.download_grads(&mut grads).unwrap();
    let diff = max_relative_difference(&grads, cpu.grads());
    println!(
        "classification step: loss {} vs {}, gradients differ by {diff:e}",
        a.loss_sum, b.loss_sum
    );
    assert!(diff <= 1e-4, "{diff}");
    // Device memory is accounted by tag, the staged batch with the host's.
    assert_eq!(tracker.snapshot().tag(dp_mem::Tag::Param).current, cpu.params().len() as u64 * 4);
    let batch_bytes = 64 * 784 * 4;
    assert!(tracker.snapshot().tag(dp_mem::Tag::Data).current >= batch_bytes);
    assert!(pool.tracker().snapshot().tag(dp_mem::Tag::Data).current >= batch_bytes);

    // A regression's squared error.
    let targets = rng.array::<f32>(64, 10);
    let a = cpu.forward_backward(x.view(), Targets::Values(targets.view()), &options).unwrap();
    let b = gpu.forward_backward(x.view(), Targets::Values(targets.view()), &options).unwrap();
    assert!((a.loss_sum - b.loss_sum).abs() <= 1e-4 * a.loss_sum.abs(), "{a:?} {b:?}");
    gpu.download_grads(&mut grads).unwrap();
    assert!(max_relative_difference(&grads, cpu.grads()) <= 1e-4);
}

#[test]
fn each_layers_gradients_are_announced_once_in_the_order_backward_makes_them() {
    let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
    let Some((cpu, mut gpu)) = models(&tracker, &pool) else { return };
    let mut rng = Rng::new(2);
    let x = rng.array::<f32>(64, 784);
    let labels = rng.labels(64, 10);
    let mut ranges = Vec::new();
    let options = StepOptions::default();
    gpu.forward_backward_with(x.view(), Targets::Classes(&labels), &options, &mut |r| {
        ranges.push(r)
    })
    .unwrap();
    // Contiguous from the start of the buffer, which holds the last layer (the layout is
    // last layer first): one range per linear layer.
    let mut start = 0;
    for range in &ranges {
        assert_eq!(range.start, start, "{ranges:?}");
        start = range.end;
    }
    assert_eq!((start, ranges.len()), (cpu.params().len(), 4), "{ranges:?}");
}

#[test]
fn twenty_steps_on_the_gpu_follow_the_cpu() {
    for adam in [false, true] {
        let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
        let Some((mut cpu, mut gpu)) = models(&tracker, &pool) else { return };
        let len = cpu.params().len();
        let mut rng = Rng::new(5);
        // The same settings for both sides: the GPU's update takes the CPU optimizer's.
        let sgd_config = dp_model::SgdConfig { momentum: 0.9, nesterov: true, weight_decay: 1e-4 };
        let adam_config = dp_model::AdamConfig {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            decoupled: true,
        };
        let (mut sgd, mut adam_cpu) = (
            Sgd::<f32>::new(len, sgd_config, &pool).unwrap(),
            Adam::<f32>::new(len, adam_config, &pool).unwrap(),
        );
        let (mut first, mut second) = (gpu.state_buffer().unwrap(), gpu.state_buffer().unwrap());
        let lr = if adam { 1e-3 } else { 0.05 };
        for step in 0..20u64 {
            let x = rng.array::<f32>(64, 784);
            let labels = rng.labels(64, 10);
            let options = StepOptions { step, ..StepOptions::default() };
            let a = cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            let b = gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            let (pa, pb) = (a.mean_loss(), b.mean_loss());
            assert!(
                (pa - pb).abs() <= 1e-4 * pa.abs().max(1.0),
                "adam {adam} step {step}: {pa} vs {pb}"
            );
            let (params, grads) = cpu.params_and_grads();
            if adam {
                adam_cpu.step(params, grads, lr).unwrap();
                gpu.adam_step((&mut first, &mut second), step + 1, lr, &adam_config).unwrap();
            } else {
                sgd.step(params, grads, lr).unwrap();
                gpu.sgd_step(Some(&mut first), lr, &sgd_config).unwrap();
            }
        }
        let mut on_gpu = Model::<f32>::new(&spec(), &pool, ModelOptions::new(64, 99)).unwrap();
        gpu.download_params(&mut on_gpu).unwrap();
        let diff = max_relative_difference(on_gpu.params(), cpu.params());
        println!("20 steps ({}): parameters differ by {diff:e}", if adam { "Adam" } else { "SGD" });
        assert!(diff <= 1e-4, "{diff}");
    }
}

/// 8-bit AdamW on the device follows the CPU's 8-bit AdamW: the GPU's update rounds its
/// moments with fused multiply-adds where the CPU does not, so a rare value lands across a
/// code's edge; the losses stay within 1e-3 and almost every code agrees.
#[test]
fn twenty_eight_bit_adam_steps_on_the_gpu_follow_the_cpu() {
    let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
    let Some((mut cpu, mut gpu)) = models(&tracker, &pool) else { return };
    let len = cpu.params().len();
    let mut rng = Rng::new(6);
    let config = dp_model::AdamConfig { weight_decay: 0.01, decoupled: true, ..Default::default() };
    let int8 = dp_model::StatePrecision::Int8;
    let mut adam = Adam::<f32>::with_precision(len, config, int8, &pool).unwrap();
    let mut m = gpu.quantized_state(dp_model::StateCodebook::Signed).unwrap();
    let mut v = gpu.quantized_state(dp_model::StateCodebook::Unsigned).unwrap();
    for step in 0..20u64 {
        let x = rng.array::<f32>(64, 784);
        let labels = rng.labels(64, 10);
        let options = StepOptions { step, ..StepOptions::default() };
        let a = cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
        let b = gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
        let (pa, pb) = (a.mean_loss(), b.mean_loss());
        assert!((pa - pb).abs() <= 1e-3 * pa.abs().max(1.0), "step {step}: {pa} vs {pb}");
        let (params, grads) = cpu.params_and_grads();
        adam.step(params, grads, 1e-3).unwrap();
        gpu.adam8_step((&mut m, &mut v), step + 1, 1e-3, &config).unwrap();
    }
    let mut copy = Adam::<f32>::with_precision(len, config, int8, &pool).unwrap();
    for (device, host) in [&m, &v].into_iter().zip(copy.state_mut().quantized) {
        gpu.download_quantized(device, host).unwrap();
    }
    for (got, want) in copy.state().quantized.iter().zip(adam.state().quantized) {
        let same = got.codes.iter().zip(want.codes).filter(|(a, b)| a == b).count();
        println!("20 8-bit Adam steps: {same} of {len} codes as the CPU's");
        assert!(same * 100 >= len * 99, "{same} of {len} codes agree");
    }
}

#[test]
fn language_model_layers_are_refused_with_the_layer_named() {
    let pool = Pool::new(&Tracker::new());
    let shape = dp_model::GptShape { layers: 1, heads: 2, dim: 16, dropout: 0.0 };
    let spec = ModelSpec::gpt("tiny", 32, 8, shape);
    let gpt = Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 1)).unwrap();
    match CudaModel::from_model(&gpt, 0, &Tracker::new(), &Tracker::new()) {
        Err(Error::Spec { field, what }) => {
            assert!(field.starts_with("layers["), "{field}");
            assert!(what.contains("CPU only"), "{what}");
        }
        Err(error @ Error::CudaNotCompiled) => eprintln!("skipping: {error}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_batch_from_page_locked_memory_and_one_staged_in_pieces_step_alike() {
    // 512 rows of 784 values: more than one 1 MiB piece of the staging buffer.
    let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
    let cpu = Model::<f32>::new(&spec(), &pool, ModelOptions::new(512, 3)).unwrap();
    let gpu = CudaModel::from_model(&cpu, 0, &tracker, pool.tracker());
    let Some(mut gpu) = support::on_gpu("GPU model test", gpu) else { return };
    let mut cpu = cpu;
    let mut rng = Rng::new(5);
    let x = rng.array::<f32>(512, 784);
    let labels = rng.labels(512, 10);
    let pinned = dp_mem::Pool::with_backend(
        pool.tracker(),
        dp_mem::PinnedBackend::new(0).unwrap(),
        dp_mem::PoolConfig::default(),
    );
    let mut locked = pinned.alloc::<f32>(x.len(), dp_mem::Tag::Data).unwrap();
    locked.copy_from_slice(x.as_slice().unwrap());
    let locked = ndarray::ArrayView2::from_shape((512, 784), &locked[..]).unwrap();

    let options = StepOptions { step: 1, ..StepOptions::default() };
    let expected = cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
    let mut grads = [vec![0f32; cpu.params().len()], vec![0f32; cpu.params().len()]];
    let mut losses = [0f64; 2];
    for (i, input) in [x.view(), locked].into_iter().enumerate() {
        losses[i] =
            gpu.forward_backward(input, Targets::Classes(&labels), &options).unwrap().loss_sum;
        gpu.download_grads(&mut grads[i]).unwrap();
    }
    assert_eq!(losses[0].to_bits(), losses[1].to_bits(), "{losses:?}");
    assert!(grads[0] == grads[1], "the same batch, the same gradients");
    assert!((losses[0] - expected.loss_sum).abs() <= 1e-4 * expected.loss_sum.abs());
    let diff = max_relative_difference(&grads[0], cpu.grads());
    assert!(diff <= 1e-4, "{diff}");
}
