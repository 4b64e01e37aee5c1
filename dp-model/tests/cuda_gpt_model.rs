//! The GPU path's language models against the CPU's on the same tokens and seed (GPU runs
//! only; elsewhere the tests say why they skip, unless `DP_REQUIRE_GPU` is set, as
//! `scripts/gpu-check.sh` does): a GPT's first steps (loss and gradients within 1e-4 in f32,
//! accumulation, evaluation) and its bf16 step. The step's own logic is also run without a GPU
//! on an emulated device (`cuda::device::emulator`), each kernel against its CPU op
//! (`cuda::cpu_check`); this checks CUDA itself under it.

mod support;

use dp_mem::{Pool, Tracker};
use dp_model::{
    CudaModel, GptShape, Model, ModelOptions, ModelSpec, Precision, StepOptions, Targets,
};
use ndarray::Array2;
use support::Rng;

/// A GPT of nanoGPT's layout at a size the CPU steps through in a moment, with dropout, over
/// a vocabulary of 65 (nanoGPT's characters) and a context of 64.
fn gpt() -> ModelSpec {
    ModelSpec::gpt("gpt", 65, 64, GptShape { layers: 2, heads: 4, dim: 64, dropout: 0.1 })
}

/// `rows` windows of token ids and each position's next token.
fn tokens(rows: usize, rng: &mut Rng) -> (Array2<f32>, Vec<i64>) {
    let ids: Vec<f32> = (0..rows * 64).map(|_| (rng.next_u64() % 65) as f32).collect();
    let labels = ids[1..].iter().map(|&v| v as i64).chain([0]).collect();
    (Array2::from_shape_vec((rows, 64), ids).unwrap(), labels)
}

fn max_relative_difference(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).map(|(x, y)| f64::from((x - y).abs() / scale)).fold(0.0, f64::max)
}

fn pair(precision: Precision, pool: &Pool, tracker: &Tracker) -> Option<(Model<f32>, CudaModel)> {
    let options = ModelOptions::new(4, 3).label_smoothing(0.1);
    let cpu = Model::<f32>::new(&gpt(), pool, options).unwrap();
    let gpu = CudaModel::with_precision(&cpu, 0, (tracker, pool.tracker()), precision);
    Some((cpu, support::on_gpu("GPU GPT test", gpu)?))
}

#[test]
fn a_gpts_first_steps_and_evaluation_match_the_cpu() {
    let (pool, tracker) = (Pool::new(&Tracker::new()), Tracker::new());
    let Some((mut cpu, mut gpu)) = pair(Precision::F32, &pool, &tracker) else { return };
    let mut rng = Rng::new(3);
    let mut grads = vec![0f32; cpu.params().len()];
    for (step, accumulate) in [(0u64, false), (1, true)] {
        let (x, labels) = tokens(4, &mut rng);
        let options = StepOptions { step, accumulate, ..StepOptions::default() };
        let a = cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
        let b = gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
        assert_eq!((a.samples, a.correct), (b.samples, b.correct), "step {step}");
        let loss = (a.loss_sum - b.loss_sum).abs() / a.loss_sum;
        gpu.download_grads(&mut grads).unwrap();
        let diff = max_relative_difference(&grads, cpu.grads());
        println!(
            "GPT step {step}: loss {} vs {}, gradients differ by {diff:e}",
            a.loss_sum, b.loss_sum
        );
        assert!(loss <= 1e-4 && diff <= 1e-4, "step {step}: loss {loss:e}, gradients {diff:e}");
    }
    let (x, labels) = tokens(3, &mut rng);
    let a = cpu.evaluate(x.view(), Targets::Classes(&labels)).unwrap();
    let b = gpu.evaluate(x.view(), Targets::Classes(&labels)).unwrap();
    assert!((a.loss_sum - b.loss_sum).abs() <= 1e-4 * a.loss_sum, "{a:?} vs {b:?}");
}

#[test]
fn a_gpts_bf16_step_follows_its_f32_step() {
    let (pool, tracker) = (Pool::new(&Tracker::new()), Tracker::new());
    let Some((mut cpu, mut gpu)) = pair(Precision::Bf16, &pool, &tracker) else { return };
    let (x, labels) = tokens(4, &mut Rng::new(5));
    let options = StepOptions::default();
    let a = cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
    let b = gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
    let mut grads = vec![0f32; cpu.params().len()];
    gpu.download_grads(&mut grads).unwrap();
    let cosine = support::cosine(&grads, cpu.grads());
    println!("GPT bf16 step: loss {} vs f32 {}, gradient cosine {cosine}", b.loss_sum, a.loss_sum);
    assert!((a.loss_sum - b.loss_sum).abs() <= 1e-2 * a.loss_sum && cosine >= 0.98, "{cosine}");
}
