//! The GPU path's image models against the CPU's on the same inputs and seed (GPU runs only;
//! elsewhere the tests say why they skip, unless `DP_REQUIRE_GPU` is set, as
//! `scripts/gpu-check.sh` does): in f32 a step's loss, the batch norms' running statistics
//! and (on the models' smooth twins, see `support::smooth`) the gradients, five clipped
//! Nesterov steps without decay on biases and norms, and evaluation agree within 1e-4
//! relative; with bf16 products the step agrees as closely as bf16's 8 bits allow. These check
//! CUDA itself (the driver, cuBLAS, NVRTC's code) under the step: the step's own logic is run
//! without a GPU on an emulated device (`cuda::device::emulator`), each kernel against its CPU
//! op (`cuda::cpu_check`).

mod support;

use dp_mem::{Pool, Tracker};
use dp_model::{
    CudaModel, Error, Model, ModelOptions, ModelSpec, Optimizer, Precision, Sgd, SgdConfig,
    StepOptions, Targets, clip_grad_norm,
};
use support::Rng;

/// Each image model family at a size the CPU steps through in a moment: convolutions with
/// bias and max pooling (LeNet), a CNN with batch norm on flat features too, a CIFAR ResNet
/// (strided projections, residual sums, global average pooling) and ResNet-18 (its 7x7
/// stride-2 stem and 3x3 stride-2 max pooling with padding).
fn models() -> Vec<(ModelSpec, usize)> {
    vec![
        (ModelSpec::lenet([1, 28, 28], 10), 16),
        (ModelSpec::cnn([3, 32, 32], 10), 8),
        (ModelSpec::resnet_cifar(20, [3, 16, 16], 10).expect("a ResNet depth"), 8),
        (ModelSpec::resnet18([3, 64, 64], 10), 4),
    ]
}

fn pair(
    spec: &ModelSpec,
    options: ModelOptions,
    precision: Precision,
    (tracker, pool): (&Tracker, &Pool),
) -> Option<(Model<f32>, CudaModel)> {
    let cpu = Model::<f32>::new(spec, pool, options).unwrap();
    let gpu = CudaModel::with_precision(&cpu, 0, (tracker, pool.tracker()), precision);
    Some((cpu, support::on_gpu(&format!("GPU {} test", spec.name), gpu)?))
}

fn max_relative_difference(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).map(|(x, y)| f64::from((x - y).abs() / scale)).fold(0.0, f64::max)
}

fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

#[test]
fn a_first_step_of_each_image_model_matches_the_cpu() {
    for (spec, batch) in models() {
        for spec in [spec.clone(), support::smooth(&spec)] {
            let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
            // Label smoothing, as the ResNet recipe trains.
            let options = ModelOptions::new(batch, 3).label_smoothing(0.1);
            let Some((mut cpu, mut gpu)) = pair(&spec, options, Precision::F32, (&tracker, &pool))
            else {
                return;
            };
            let mut rng = Rng::new(17);
            let x = rng.array::<f32>(batch, spec.input.iter().product());
            let mut labels = rng.labels(batch, 10);
            labels[1] = -1;
            let options = StepOptions { step: 2, ..StepOptions::default() };
            let a = cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            let b = gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            let name = &spec.name;
            assert_eq!((a.samples, a.correct), (b.samples, b.correct), "{name}");
            assert!(relative(b.loss_sum, a.loss_sum) <= 1e-4, "{name}: {a:?} vs {b:?}");
            // The running statistics the step moved come back with the parameters.
            let mut back = Model::<f32>::new(&spec, &pool, ModelOptions::new(batch, 99)).unwrap();
            gpu.download_params(&mut back).unwrap();
            let stats = max_relative_difference(back.buffers(), cpu.buffers());
            assert!(stats <= 1e-4, "{name}: running statistics differ by {stats}");
            assert_eq!(back.params(), cpu.params(), "a step without an update changes nothing");
            // Gradients are compared where they are continuous (see `support::smooth`).
            if spec.layers.contains(&dp_model::LayerSpec::Relu) {
                continue;
            }
            let mut grads = vec![0f32; cpu.params().len()];
            gpu.download_grads(&mut grads).unwrap();
            let diff = max_relative_difference(&grads, cpu.grads());
            println!("{name} (tanh): loss {} vs {}, gradients {diff:e}", a.loss_sum, b.loss_sum);
            assert!(diff <= 1e-4, "{name}: gradients differ by {diff}");
        }
    }
}

#[test]
fn five_clipped_nesterov_steps_follow_the_cpu_and_so_does_evaluation() {
    let spec = support::smooth(&ModelSpec::resnet_cifar(20, [3, 16, 16], 10).unwrap());
    let batch = 16;
    let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
    let options = ModelOptions::new(batch, 5);
    let Some((mut cpu, mut gpu)) = pair(&spec, options, Precision::F32, (&tracker, &pool)) else {
        return;
    };
    let config = SgdConfig { momentum: 0.9, nesterov: true, weight_decay: 5e-4 };
    let decayed = cpu.layout().decayed_ranges();
    let mut sgd = Sgd::<f32>::new(cpu.params().len(), config, &pool).unwrap();
    sgd.decay_only(decayed.clone());
    gpu.decay_only(&decayed).unwrap();
    let mut velocity = gpu.state_buffer().unwrap();
    let mut rng = Rng::new(23);
    let (lr, max_norm) = (0.1, 0.5);
    for step in 0..5u64 {
        let x = rng.array::<f32>(batch, 3 * 16 * 16);
        let labels = rng.labels(batch, 10);
        let options = StepOptions { step, ..StepOptions::default() };
        let a = cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
        let b = gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
        assert!(relative(b.loss_sum, a.loss_sum) <= 1e-4, "step {step}: {a:?} vs {b:?}");
        let (params, grads) = cpu.params_and_grads_mut();
        let norm = clip_grad_norm(grads, max_norm);
        assert!(norm > max_norm, "step {step}: the limit clips ({norm})");
        sgd.step(params, grads, lr).unwrap();
        gpu.clip_grad_norm(max_norm).unwrap();
        gpu.sgd_step(Some(&mut velocity), lr, &config).unwrap();
    }
    let mut back = Model::<f32>::new(&spec, &pool, ModelOptions::new(batch, 99)).unwrap();
    gpu.download_params(&mut back).unwrap();
    let diff = max_relative_difference(back.params(), cpu.params());
    let stats = max_relative_difference(back.buffers(), cpu.buffers());
    println!("5 clipped Nesterov steps: parameters differ by {diff:e}, running stats {stats:e}");
    assert!(diff <= 1e-4 && stats <= 1e-4, "{diff} {stats}");
    // Evaluation normalizes by the running statistics and reports the plain loss.
    let x = rng.array::<f32>(batch, 3 * 16 * 16);
    let labels = rng.labels(batch, 10);
    let a = cpu.evaluate(x.view(), Targets::Classes(&labels)).unwrap();
    let b = gpu.evaluate(x.view(), Targets::Classes(&labels)).unwrap();
    assert_eq!((a.samples, a.correct), (b.samples, b.correct));
    assert!(relative(b.loss_sum, a.loss_sum) <= 1e-4, "evaluation: {a:?} vs {b:?}");
}

#[test]
fn bf16_products_step_as_f32_within_bf16s_precision() {
    let spec = support::smooth(&ModelSpec::resnet_cifar(20, [3, 16, 16], 10).unwrap());
    let batch = 16;
    let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
    let options = ModelOptions::new(batch, 7);
    let Some((mut cpu, mut gpu)) = pair(&spec, options, Precision::Bf16, (&tracker, &pool)) else {
        return;
    };
    assert_eq!(gpu.precision(), Precision::Bf16);
    let mut rng = Rng::new(29);
    let x = rng.array::<f32>(batch, 3 * 16 * 16);
    let labels = rng.labels(batch, 10);
    let options = StepOptions::default();
    let a = cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
    let b = gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
    let mut grads = vec![0f32; cpu.params().len()];
    gpu.download_grads(&mut grads).unwrap();
    let cosine = support::cosine(&grads, cpu.grads());
    println!("bf16 step: loss {} vs f32 {}, gradient cosine {cosine}", b.loss_sum, a.loss_sum);
    // bf16 keeps 8 significant bits: a relative error of 2^-9 per operand (on the emulated
    // device, ResNet-18's gradients keep a cosine of 0.987 with f32's, ResNet-20's more).
    assert!(relative(b.loss_sum, a.loss_sum) <= 1e-2, "{a:?} vs {b:?}");
    assert!(cosine >= 0.98, "{cosine}");
}

#[test]
fn a_batch_the_device_cannot_hold_is_refused_before_any_step() {
    // A ResNet-20 at batch 256 needs tens of MiB of activations; its device tracker's budget
    // leaves 8 MiB.
    let spec = ModelSpec::resnet_cifar(20, [3, 32, 32], 10).unwrap();
    let pool = Pool::new(&Tracker::new());
    let cpu = Model::<f32>::new(&spec, &pool, ModelOptions::new(256, 1)).unwrap();
    let tracker = Tracker::new();
    tracker.set_budget(Some(8 << 20));
    match CudaModel::from_model(&cpu, 0, &tracker, pool.tracker()) {
        Err(Error::DeviceMemory { what }) => {
            assert!(what.contains("batch 256") && what.contains("device memory budget"), "{what}");
            assert_eq!(tracker.snapshot().total.current, 0, "nothing was taken");
        }
        other => {
            let on_gpu = support::on_gpu("GPU memory test", other.map(|_| ()));
            assert!(on_gpu.is_none(), "a model over the budget was put on the GPU");
        }
    }
}
