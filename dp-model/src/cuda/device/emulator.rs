//! The GPU step run on the CPU, to check it without a GPU: a [`Device`] whose memory is host
//! memory, whose kernels are the CUDA source compiled as C++ behind the CPU check's shim and
//! run one grid thread at a time, and whose GEMM is the definition's triple loop (reading bf16
//! operands as the tensor cores do). Everything the step itself does (its buffer plans,
//! offsets, leading dimensions, chunks, the order of its launches) runs as on a GPU, and the
//! tests below compare it with the CPU model. What this cannot check is CUDA itself: the
//! driver's copies, cuBLAS's reading of the same GEMM descriptions, NVRTC's compilation of
//! the same source (tests/cuda_kernels.rs) and the GPU's timing; tests/cuda_image_model.rs
//! checks those on a GPU.

use std::ffi::c_void;
use std::process::Command;

use dp_mem::SystemBackend;
use libloading::{Library, Symbol};

use super::{Device, Gemm};
use crate::cuda::CUDA_KERNEL_SOURCE;
use crate::cuda::cpu_check::SHIM;
use crate::error::{Error, Result};

/// The grid every launch runs on: a few blocks of a few threads, neither dividing the
/// sizes the kernels meet, so the grid-stride loops wrap and stop mid-block.
const GRID: (u32, u32) = (3, 5);

/// For each kernel, a function taking its arguments' addresses (as `cuLaunchKernel` does)
/// and calling it with them: `extern "C" void <name>__packed(void** p)`.
fn packed_wrappers(source: &str) -> String {
    let mut out = String::new();
    for declaration in source.split("__global__ void ").skip(1) {
        let (name, rest) = declaration.split_once('(').expect("a kernel's parameters");
        let params = &rest[..rest.find(')').expect("the parameters' end")];
        let args: Vec<String> = params
            .split(',')
            .enumerate()
            .map(|(i, param)| {
                let param = param.split_whitespace().collect::<Vec<_>>().join(" ");
                let cut = param.rfind([' ', '*']).expect("a parameter's type and name");
                let ty = param[..=cut].trim();
                format!("*({ty}*)p[{i}]")
            })
            .collect();
        out += &format!(
            "extern \"C\" void {name}__packed(void** p) {{ {name}({}); }}\n",
            args.join(", ")
        );
    }
    out
}

/// The CPU as a device.
pub(super) struct Emulator {
    library: Library,
    _dir: tempfile::TempDir,
}

impl Emulator {
    /// The kernels compiled with the C++ compiler (`$CXX`, else `c++`); an error saying why
    /// where none runs.
    pub(super) fn new() -> std::result::Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let source = dir.path().join("emulated.cpp");
        let code = format!("{SHIM}\n{CUDA_KERNEL_SOURCE}\n{}", packed_wrappers(CUDA_KERNEL_SOURCE));
        std::fs::write(&source, code).map_err(|e| format!("{}: {e}", source.display()))?;
        let library = dir.path().join("libemulated.so");
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let output = Command::new(&compiler)
            .args(["-std=c++17", "-O2", "-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .map_err(|e| format!("no C++ compiler ({compiler}: {e})"))?;
        assert!(
            output.status.success(),
            "the emulated kernels do not compile with {compiler}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // SAFETY: built just above from the kernels, the shim and the wrappers, which run no
        // code when loaded.
        let library = unsafe { Library::new(&library) }.map_err(|e| e.to_string())?;
        Ok(Emulator { library, _dir: dir })
    }
}

/// Value `i` of a GEMM operand at `at`: `f32`, or bf16 widened.
///
/// # Safety
///
/// `at` holds at least `i + 1` values of the type.
unsafe fn value(at: u64, i: usize, half: bool) -> f64 {
    // SAFETY: as the caller guarantees.
    unsafe {
        if half {
            let bits = *(at as usize as *const u16).add(i);
            f64::from(f32::from_bits(u32::from(bits) << 16))
        } else {
            f64::from(*(at as usize as *const f32).add(i))
        }
    }
}

impl Device for Emulator {
    type Memory = SystemBackend;
    type Staging = SystemBackend;
    /// Small, so that the tests' convolutions take several chunks.
    const CHUNK_VALUES: usize = 1 << 12;

    unsafe fn launch(
        &self,
        name: &'static str,
        n: usize,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let _ = n;
        // SAFETY: the shim's setter and the kernel's wrapper, by the names the library was
        // built with.
        let (place, kernel) = unsafe {
            let place: Symbol<'_, unsafe extern "C" fn(u32, u32, u32, u32)> =
                self.library.get(b"dp_cpu_thread").map_err(|e| missing(name, e))?;
            let kernel: Symbol<'_, unsafe extern "C" fn(*mut *mut c_void)> = self
                .library
                .get(format!("{name}__packed").as_bytes())
                .map_err(|e| missing(name, e))?;
            (place, kernel)
        };
        let (blocks, threads) = GRID;
        for b in 0..blocks {
            for t in 0..threads {
                // SAFETY: sets the grid position; the kernel reads `params` as the caller
                // guarantees they are.
                unsafe {
                    place(blocks, threads, b, t);
                    kernel(params.as_mut_ptr());
                }
            }
        }
        Ok(())
    }

    unsafe fn gemm(&self, gemm: Gemm) -> Result<()> {
        let Gemm { half, trans: (ta, tb), mnk: (m, n, k), a, b, beta, c } = gemm;
        for j in 0..n {
            for i in 0..m {
                let mut sum = 0f64;
                for l in 0..k {
                    let at_a = if ta { l + i * a.1 } else { i + l * a.1 };
                    let at_b = if tb { j + l * b.1 } else { l + j * b.1 };
                    // SAFETY: the caller guarantees the matrices are there.
                    sum += unsafe { value(a.0, at_a, half) * value(b.0, at_b, half) };
                }
                // SAFETY: as above.
                let out = unsafe { &mut *(c.0 as usize as *mut f32).add(i + j * c.1) };
                *out = if beta == 0.0 { sum as f32 } else { (sum + f64::from(beta * *out)) as f32 };
            }
        }
        Ok(())
    }

    unsafe fn copy_in(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: as the caller guarantees.
        unsafe { std::ptr::copy_nonoverlapping(src, dst as usize as *mut u8, bytes) };
        Ok(())
    }

    unsafe fn copy_out(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: as the caller guarantees.
        unsafe { std::ptr::copy_nonoverlapping(src as usize as *const u8, dst, bytes) };
        Ok(())
    }

    unsafe fn zero(&self, dst: u64, bytes: usize) -> Result<()> {
        // SAFETY: as the caller guarantees.
        unsafe { std::ptr::write_bytes(dst as usize as *mut u8, 0, bytes) };
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Never: every batch goes through the staging buffer, which this way is checked too.
    fn reads_directly<T>(&self, _values: &[T]) -> bool {
        false
    }
}

fn missing(name: &str, error: libloading::Error) -> Error {
    Error::CudaStep { what: format!("{name} is not in the emulated kernels: {error}") }
}

#[cfg(test)]
pub(super) mod tests {
    use dp_mem::{Pool, SystemBackend, Tracker};

    use super::Emulator;
    use crate::cuda::device::{GpuModel, Parts};
    use crate::model::{Model, ModelOptions, StepOptions};
    use crate::ops::gemm::{Bf16Kernels, Precision};
    use crate::ops::loss::Targets;
    use crate::optim::{Optimizer, Sgd, SgdConfig, clip_grad_norm};
    use crate::spec::{LayerSpec, ModelSpec};

    /// The emulated device, or `None` (after saying why) where no C++ compiler runs.
    pub(in crate::cuda::device) fn emulator() -> Option<Emulator> {
        match Emulator::new() {
            Ok(emulator) => Some(emulator),
            Err(why) if std::env::var_os("DP_REQUIRE_CXX").is_none() => {
                eprintln!("skipped: the GPU step is not emulated on the CPU: {why}");
                None
            }
            Err(why) => panic!("DP_REQUIRE_CXX is set, and {why}"),
        }
    }

    /// The CPU model of `spec` and the same on the emulated device, its memory unlimited.
    fn pair(
        spec: &ModelSpec,
        options: ModelOptions,
        precision: Precision,
        pool: &Pool,
    ) -> Option<(Model<f32>, GpuModel<Emulator>)> {
        let device = emulator()?;
        let cpu = Model::<f32>::new(spec, pool, options).expect("a CPU model");
        let (tracker, host) = (Tracker::new(), Tracker::new());
        let parts = Parts {
            device,
            memory: SystemBackend,
            free: u64::MAX,
            staging: SystemBackend,
            trackers: (&tracker, &host),
            precision,
        };
        let gpu = GpuModel::build(&cpu, parts).expect("the model on the emulated device");
        Some((cpu, gpu))
    }

    /// The largest difference relative to the largest value of `want`.
    fn difference(got: &[f32], want: &[f32]) -> f64 {
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
        got.iter().zip(want).map(|(g, w)| f64::from((g - w).abs() / scale)).fold(0.0, f64::max)
    }

    fn cosine(a: &[f32], b: &[f32]) -> f64 {
        let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
        let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        dot / (norm(a) * norm(b))
    }

    /// Values in [-1, 1) from a counter hash, the same on every run.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        (0..len as u64)
            .map(|i| {
                let z = (i ^ (seed << 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn batch(spec: &ModelSpec, rows: usize, seed: u64) -> (ndarray::Array2<f32>, Vec<i64>) {
        let input: usize = spec.input.iter().product();
        let x = ndarray::Array2::from_shape_vec((rows, input), values(rows * input, seed));
        let labels = (0..rows as i64).map(|r| (r * 7 + seed as i64) % 10).collect();
        (x.expect("a batch"), labels)
    }

    /// An MLP with each activation and dropout, and each image model family small: LeNet
    /// (convolutions with bias, max pooling), the CNN (batch norm on images), a ResNet-8
    /// (projections, residual sums, global average pooling) and ResNet-18 (its 7x7 stride-2
    /// stem and padded 3x3 stride-2 max pooling).
    fn models() -> Vec<(ModelSpec, usize)> {
        let mlp = ModelSpec {
            name: "mlp".into(),
            input: vec![20],
            layers: vec![
                LayerSpec::Linear { out: 16 },
                LayerSpec::Gelu,
                LayerSpec::Dropout { p: 0.25 },
                LayerSpec::Linear { out: 12 },
                LayerSpec::Tanh,
                LayerSpec::Linear { out: 10 },
            ],
        };
        vec![
            (mlp, 9),
            (ModelSpec::lenet([1, 16, 16], 10), 5),
            (ModelSpec::cnn([3, 8, 8], 10), 4),
            (ModelSpec::resnet_cifar(8, [3, 8, 8], 10).expect("a ResNet depth"), 6),
            // Large enough that the last stage's batch norms see more than a couple of values:
            // over two, a difference in the last bit of a sum is amplified by 1 / std.
            (ModelSpec::resnet18([3, 64, 64], 10), 3),
        ]
    }

    /// `spec` with every ReLU a tanh: a smooth model of the same shape, whose outputs backward
    /// reads as it reads a ReLU's. A ReLU's gradient jumps where its input crosses zero, and two
    /// correct implementations that round a sum differently (a GEMM's order) can put a value
    /// near zero on either side: gradients are compared on the smooth model.
    fn smooth(spec: &ModelSpec) -> ModelSpec {
        spec.replacing(&LayerSpec::Relu, &LayerSpec::Tanh)
    }

    /// Each model and its smooth twin: the same loss and running statistics; on the twin,
    /// the same gradients, announced layer by layer, and accumulated over a second batch.
    #[test]
    fn each_model_steps_on_the_emulated_device_as_on_the_cpu() {
        for (model, rows) in models() {
            for spec in [smooth(&model), model] {
                let name = &spec.name;
                let pool = Pool::new(&Tracker::new());
                let options = ModelOptions::new(rows, 3).label_smoothing(0.1);
                let Some((mut cpu, mut gpu)) = pair(&spec, options, Precision::F32, &pool) else {
                    return;
                };
                let (x, mut labels) = batch(&spec, rows, 1);
                labels[1] = -1;
                let options = StepOptions { step: 2, ..StepOptions::default() };
                let targets = Targets::Classes(&labels);
                let a = cpu.forward_backward(x.view(), targets, &options).unwrap();
                let mut ranges = Vec::new();
                let b = gpu
                    .forward_backward_with(x.view(), targets, &options, &mut |r| ranges.push(r))
                    .unwrap();
                assert_eq!((a.samples, a.correct), (b.samples, b.correct), "{name}");
                let loss = (a.loss_sum - b.loss_sum).abs() / a.loss_sum.abs();
                assert!(loss <= 1e-5, "{name}: loss {} vs {}", a.loss_sum, b.loss_sum);
                let mut back = Model::<f32>::new(&spec, &pool, ModelOptions::new(rows, 9)).unwrap();
                gpu.download_params(&mut back).unwrap();
                assert_eq!(back.params(), cpu.params(), "{name}: no update, no change");
                assert!(difference(back.buffers(), cpu.buffers()) <= 1e-5, "{name}: running stats");
                // Each layer's gradients are announced once, up the buffer from its start.
                let mut start = 0;
                for range in &ranges {
                    assert_eq!(range.start, start, "{name}: {ranges:?}");
                    start = range.end;
                }
                assert_eq!(start, cpu.params().len(), "{name}: {ranges:?}");
                if spec.layers.contains(&LayerSpec::Relu) {
                    continue;
                }
                // A GEMM sums in another order than the CPU's: through ResNet-18's twenty
                // layers, gradients differ by up to 3e-5 of the largest.
                let mut grads = vec![0f32; cpu.params().len()];
                gpu.download_grads(&mut grads).unwrap();
                let diff = difference(&grads, cpu.grads());
                assert!(diff <= 1e-4, "{name}: gradients differ by {diff:e}");
                // Accumulating a second batch adds its gradients.
                let (x, labels) = batch(&spec, rows - 1, 2);
                let more = StepOptions { accumulate: true, ..options };
                cpu.forward_backward(x.view(), Targets::Classes(&labels), &more).unwrap();
                gpu.forward_backward(x.view(), Targets::Classes(&labels), &more).unwrap();
                gpu.download_grads(&mut grads).unwrap();
                assert!(difference(&grads, cpu.grads()) <= 1e-4, "{name}: accumulated gradients");
            }
        }
    }

    #[test]
    fn clipped_nesterov_steps_without_decay_on_norms_and_evaluation_follow_the_cpu() {
        let spec = ModelSpec::resnet_cifar(8, [3, 8, 8], 10).expect("a ResNet depth");
        let pool = Pool::new(&Tracker::new());
        let Some((mut cpu, mut gpu)) = pair(&spec, ModelOptions::new(8, 5), Precision::F32, &pool)
        else {
            return;
        };
        let config = SgdConfig { momentum: 0.9, nesterov: true, weight_decay: 5e-4 };
        let decayed = cpu.layout().decayed_ranges();
        let mut sgd = Sgd::<f32>::new(cpu.params().len(), config, &pool).unwrap();
        sgd.decay_only(decayed.clone());
        gpu.decay_only(&decayed).unwrap();
        let mut velocity = gpu.state_buffer().unwrap();
        for step in 0..3u64 {
            let (x, labels) = batch(&spec, 8, 10 + step);
            let options = StepOptions { step, ..StepOptions::default() };
            cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            let (params, grads) = cpu.params_and_grads_mut();
            assert!(clip_grad_norm(grads, 0.05) > 0.05, "the limit clips");
            sgd.step(params, grads, 0.1).unwrap();
            gpu.clip_grad_norm(0.05).unwrap();
            gpu.sgd_step(Some(&mut velocity), 0.1, &config).unwrap();
        }
        let mut back = Model::<f32>::new(&spec, &pool, ModelOptions::new(8, 9)).unwrap();
        gpu.download_params(&mut back).unwrap();
        assert!(difference(back.params(), cpu.params()) <= 1e-5, "parameters");
        assert!(difference(back.buffers(), cpu.buffers()) <= 1e-5, "running statistics");
        let mut state = vec![0f32; cpu.params().len()];
        gpu.download_buffer(&velocity, &mut state).unwrap();
        assert!(difference(&state, sgd.state().buffers[0]) <= 1e-5, "momentum");
        let (x, labels) = batch(&spec, 7, 20);
        let a = cpu.evaluate(x.view(), Targets::Classes(&labels)).unwrap();
        let b = gpu.evaluate(x.view(), Targets::Classes(&labels)).unwrap();
        assert_eq!((a.samples, a.correct), (b.samples, b.correct));
        assert!((a.loss_sum - b.loss_sum).abs() <= 1e-5 * a.loss_sum, "{a:?} vs {b:?}");
    }

    #[test]
    fn bf16_products_step_as_f32_within_bf16s_precision() {
        for (spec, rows) in models() {
            let spec = smooth(&spec);
            let pool = Pool::new(&Tracker::new());
            let options = ModelOptions::new(rows, 7);
            let Some((mut cpu, mut gpu)) = pair(&spec, options, Precision::Bf16, &pool) else {
                return;
            };
            let (x, labels) = batch(&spec, rows, 3);
            let options = StepOptions::default();
            let a = cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            let b = gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            let mut grads = vec![0f32; cpu.params().len()];
            gpu.download_grads(&mut grads).unwrap();
            let loss = (a.loss_sum - b.loss_sum).abs() / a.loss_sum;
            // bf16 keeps 8 significant bits: each product's operands are off by up to 2^-9,
            // which ResNet-18's twenty layers compound to a cosine of 0.987 with f32's
            // gradients; an operand read from the wrong place or not rounded afresh gives far
            // less.
            let to_f32 = cosine(&grads, cpu.grads());
            assert!(
                loss <= 1e-2 && to_f32 >= 0.98,
                "{}: loss {loss:e}, cosine {to_f32}",
                spec.name
            );
            // Where the CPU multiplies in bf16 too, it rounds the same operands: the gradients
            // agree but for the order of the sums (0.9996 for ResNet-18). (On AVX512_BF16 the
            // products with fewer than 8 rows or columns stay f32 on the CPU,
            // `Bf16Kernels::pays`, so models with one have no such reference there.)
            if let Some(kernels) = Bf16Kernels::current() {
                let bf16 = ModelOptions::new(rows, 7).precision(Precision::Bf16);
                let mut bf16 = Model::<f32>::new(&spec, &pool, bf16).unwrap();
                if bf16.gemm_shapes(rows).iter().all(|s| kernels.pays(s.m, s.n)) {
                    bf16.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
                    let same = cosine(&grads, bf16.grads());
                    assert!(same >= 0.999, "{}: the CPU's bf16 step: cosine {same}", spec.name);
                } else {
                    eprintln!(
                        "{}: not compared with the CPU's bf16 step, which keeps some products \
                         in f32 on {}",
                        spec.name,
                        kernels.name()
                    );
                }
            }
            // Not f32 by accident: rounding moved the loss.
            assert!(a.loss_sum != b.loss_sum, "{}: bf16 products round", spec.name);
        }
    }

    #[test]
    fn squared_error_targets_step_as_on_the_cpu() {
        // The MLP, whose loss writes its gradient over the outputs, and the MLP ending in a
        // tanh, whose backward reads its output (so the gradient takes a buffer of its own).
        let (mlp, rows) = models().remove(0);
        let mut tanh = mlp.clone();
        tanh.layers.push(LayerSpec::Tanh);
        for spec in [mlp, tanh] {
            let pool = Pool::new(&Tracker::new());
            let Some((mut cpu, mut gpu)) =
                pair(&spec, ModelOptions::new(rows, 4), Precision::F32, &pool)
            else {
                return;
            };
            let (x, _) = batch(&spec, rows, 5);
            let values = ndarray::Array2::from_shape_vec((rows, 10), values(rows * 10, 6));
            let values = values.expect("targets");
            let options = StepOptions::default();
            let targets = Targets::Values(values.view());
            let a = cpu.forward_backward(x.view(), targets, &options).unwrap();
            let b = gpu.forward_backward(x.view(), targets, &options).unwrap();
            assert!((a.loss_sum - b.loss_sum).abs() <= 1e-5 * a.loss_sum, "{a:?} vs {b:?}");
            let mut grads = vec![0f32; cpu.params().len()];
            gpu.download_grads(&mut grads).unwrap();
            assert!(difference(&grads, cpu.grads()) <= 1e-5, "{:?}", spec.layers.last());
        }
    }

    /// Two replicas' sums of the same batch norm, added where they lie (the emulated device's
    /// memory is the host's), as NCCL would on GPUs.
    struct Summed {
        me: usize,
        barrier: std::sync::Arc<std::sync::Barrier>,
        slots: std::sync::Arc<std::sync::Mutex<[Vec<f64>; 2]>>,
    }

    impl crate::DeviceNormSync for Summed {
        fn sum(&mut self, values: u64, len: usize) -> Result<(), String> {
            // SAFETY: the model hands the address of `len` f64 values in its (host) memory,
            // which nothing else touches until this returns.
            let mine = unsafe { std::slice::from_raw_parts_mut(values as usize as *mut f64, len) };
            self.slots.lock().unwrap()[self.me] = mine.to_vec();
            self.barrier.wait();
            let total: Vec<f64> = {
                let slots = self.slots.lock().unwrap();
                slots[0].iter().zip(&slots[1]).map(|(a, b)| a + b).collect()
            };
            // Both have read the other's before either writes its next.
            self.barrier.wait();
            mine.copy_from_slice(&total);
            Ok(())
        }

        fn finish(&mut self) -> Result<(), String> {
            Ok(())
        }
    }

    /// Synchronized batch norm: two replicas of half a batch each, their statistics summed
    /// between the kernels, step as the CPU model does on the whole batch.
    #[test]
    fn synchronized_norms_over_two_emulated_devices_step_as_one_whole_batch() {
        if emulator().is_none() {
            return;
        }
        let spec = smooth(&ModelSpec::resnet_cifar(8, [3, 8, 8], 10).expect("a ResNet depth"));
        let (x, labels) = batch(&spec, 8, 4);
        let options = StepOptions { denominator: Some(8), ..StepOptions::default() };
        let pool = Pool::new(&Tracker::new());
        let mut whole = Model::<f32>::new(&spec, &pool, ModelOptions::new(8, 5)).unwrap();
        let expected = whole.forward_backward(x.view(), Targets::Classes(&labels), &options);
        let expected = expected.unwrap();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let slots = std::sync::Arc::new(std::sync::Mutex::new([Vec::new(), Vec::new()]));
        let halves: Vec<_> = std::thread::scope(|scope| {
            let runs: Vec<_> = (0..2)
                .map(|me| {
                    let sync = Summed { me, barrier: barrier.clone(), slots: slots.clone() };
                    let (x, labels, spec) = (&x, &labels, &spec);
                    scope.spawn(move || {
                        let pool = Pool::new(&Tracker::new());
                        let (_, mut gpu) =
                            pair(spec, ModelOptions::new(4, 5), Precision::F32, &pool).unwrap();
                        gpu.set_norm_sync(Some(Box::new(sync)));
                        let rows = me * 4..me * 4 + 4;
                        let x = x.slice(ndarray::s![rows.clone(), ..]);
                        let targets = Targets::Classes(&labels[rows]);
                        let loss = gpu.forward_backward(x, targets, &options).unwrap();
                        let mut grads = vec![0f32; whole_len(spec)];
                        gpu.download_grads(&mut grads).unwrap();
                        let back = Model::<f32>::new(spec, &pool, ModelOptions::new(4, 9));
                        let mut back = back.unwrap();
                        gpu.download_params(&mut back).unwrap();
                        (loss, grads, back.buffers().to_vec())
                    })
                })
                .collect();
            runs.into_iter().map(|run| run.join().unwrap()).collect()
        });
        let loss = halves[0].0.loss_sum + halves[1].0.loss_sum;
        assert!((loss - expected.loss_sum).abs() <= 1e-5 * expected.loss_sum, "{loss}");
        let grads: Vec<f32> = halves[0].1.iter().zip(&halves[1].1).map(|(a, b)| a + b).collect();
        let diff = difference(&grads, whole.grads());
        assert!(diff <= 1e-4, "summed gradients differ by {diff:e}");
        for (_, _, buffers) in &halves {
            let diff = difference(buffers, whole.buffers());
            assert!(diff <= 1e-5, "running statistics differ by {diff:e}");
        }
    }

    fn whole_len(spec: &ModelSpec) -> usize {
        spec.layout().expect("a layout").len()
    }

    /// A small GPT: embeddings, pre-norm blocks of layer norm, attention (two heads), a GELU
    /// MLP, dropout everywhere, residual sums, and the tied head.
    fn gpt() -> ModelSpec {
        let shape = crate::zoo::GptShape { layers: 2, heads: 2, dim: 16, dropout: 0.1 };
        ModelSpec::gpt("gpt", 23, 9, shape)
    }

    /// `rows` samples of token ids (as floats, ids repeating within and across samples) and
    /// each position's next-token label, one ignored.
    fn tokens(spec: &ModelSpec, rows: usize, seed: u64) -> (ndarray::Array2<f32>, Vec<i64>) {
        let t = spec.input[0];
        let ids: Vec<f32> =
            values(rows * t, seed).iter().map(|v| ((v + 1.0) * 11.5).floor()).collect();
        let mut labels: Vec<i64> = ids[1..].iter().map(|&v| v as i64).chain([3]).collect();
        labels[4] = -1;
        (ndarray::Array2::from_shape_vec((rows, t), ids).expect("a batch"), labels)
    }

    #[test]
    fn a_gpt_steps_and_evaluates_on_the_emulated_device_as_on_the_cpu() {
        let spec = gpt();
        let pool = Pool::new(&Tracker::new());
        let options = ModelOptions::new(3, 3).label_smoothing(0.1);
        let Some((mut cpu, mut gpu)) = pair(&spec, options, Precision::F32, &pool) else {
            return;
        };
        let mut grads = vec![0f32; cpu.params().len()];
        for (step, accumulate) in [(0u64, false), (1, true)] {
            let (x, labels) = tokens(&spec, 3 - step as usize, step);
            let options = StepOptions { step, accumulate, ..StepOptions::default() };
            let targets = Targets::Classes(&labels);
            let a = cpu.forward_backward(x.view(), targets, &options).unwrap();
            let mut ranges = Vec::new();
            let b = gpu
                .forward_backward_with(x.view(), targets, &options, &mut |r| ranges.push(r))
                .unwrap();
            assert_eq!((a.samples, a.correct), (b.samples, b.correct), "step {step}");
            let loss = (a.loss_sum - b.loss_sum).abs() / a.loss_sum;
            assert!(loss <= 1e-5, "step {step}: loss {} vs {}", a.loss_sum, b.loss_sum);
            gpu.download_grads(&mut grads).unwrap();
            let diff = difference(&grads, cpu.grads());
            assert!(diff <= 1e-4, "step {step}: gradients differ by {diff:e}");
            assert_eq!(ranges.last().map(|r| r.end), Some(cpu.params().len()));
        }
        let (x, labels) = tokens(&spec, 2, 7);
        let a = cpu.evaluate(x.view(), Targets::Classes(&labels)).unwrap();
        let b = gpu.evaluate(x.view(), Targets::Classes(&labels)).unwrap();
        assert!((a.loss_sum - b.loss_sum).abs() <= 1e-5 * a.loss_sum, "{a:?} vs {b:?}");
        // An id outside the vocabulary is refused before anything runs, naming it.
        let mut bad = x.clone();
        bad[[1, 2]] = 23.0;
        let error =
            gpu.forward_backward(bad.view(), Targets::Classes(&labels), &StepOptions::default());
        let error = error.expect_err("an id outside 0..23").to_string();
        assert!(error.contains("sample 1, position 2"), "{error}");
    }

    #[test]
    fn a_gpt_in_bf16_steps_as_the_cpus_bf16() {
        let spec = gpt();
        let pool = Pool::new(&Tracker::new());
        let Some((mut cpu, mut gpu)) = pair(&spec, ModelOptions::new(3, 4), Precision::Bf16, &pool)
        else {
            return;
        };
        let (x, labels) = tokens(&spec, 3, 1);
        let options = StepOptions::default();
        cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
        gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
        let mut grads = vec![0f32; cpu.params().len()];
        gpu.download_grads(&mut grads).unwrap();
        let to_f32 = cosine(&grads, cpu.grads());
        assert!(to_f32 >= 0.98, "cosine with f32's gradients {to_f32}");
        if Precision::Bf16.available() {
            let amx = ModelOptions::new(3, 4).precision(Precision::Bf16);
            let mut amx = Model::<f32>::new(&spec, &pool, amx).unwrap();
            amx.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            let same = cosine(&grads, amx.grads());
            assert!(same >= 0.999, "cosine with the CPU's bf16 gradients {same}");
        }
    }

    /// The memory savers: recomputation per block (`Recompute::Auto`: batch norms by their
    /// saved statistics, dropout by its masks; `Recompute::Selective`, the products' outputs
    /// kept) and activations kept for backward in bf16
    /// (`SavedPrecision::Bf16`: the CPU reads the same rounded values). With each, the device
    /// keeps fewer activation bytes and steps as the CPU does.
    #[test]
    fn memory_savers_step_as_on_the_cpu_in_less_memory() {
        use crate::model::{Recompute, SavedPrecision};
        let (mlp, _) = models().remove(0);
        let resnet = smooth(&ModelSpec::resnet_cifar(8, [3, 8, 8], 10).expect("a ResNet depth"));
        let savers: [fn(ModelOptions) -> ModelOptions; 3] = [
            |o| o.recompute(Recompute::Auto),
            |o| o.recompute(Recompute::Selective),
            |o| o.saved(SavedPrecision::Bf16),
        ];
        let extra = [vec![], vec![], vec![(mlp, 9, false)]];
        for (saver, models) in savers.into_iter().zip(extra) {
            let models = [(resnet.clone(), 6, false), (gpt(), 3, true)].into_iter().chain(models);
            for (spec, rows, tokens_in) in models {
                let pool = Pool::new(&Tracker::new());
                let plain = ModelOptions::new(rows, 3);
                let Some((mut cpu, mut gpu)) =
                    pair(&spec, saver(plain.clone()), Precision::F32, &pool)
                else {
                    return;
                };
                let Some((_, whole)) = pair(&spec, plain, Precision::F32, &pool) else { return };
                let (saved, kept) =
                    (gpu.memory().saved_activations, whole.memory().saved_activations);
                assert!(saved < kept, "{}: {saved} bytes saved against {kept}", spec.name);
                let (x, labels) =
                    if tokens_in { tokens(&spec, rows, 6) } else { batch(&spec, rows, 6) };
                let options = StepOptions { step: 1, ..StepOptions::default() };
                let targets = Targets::Classes(&labels);
                let a = cpu.forward_backward(x.view(), targets, &options).unwrap();
                let b = gpu.forward_backward(x.view(), targets, &options).unwrap();
                assert!((a.loss_sum - b.loss_sum).abs() <= 1e-5 * a.loss_sum, "{a:?} vs {b:?}");
                let mut grads = vec![0f32; cpu.params().len()];
                gpu.download_grads(&mut grads).unwrap();
                let diff = difference(&grads, cpu.grads());
                assert!(diff <= 1e-4, "{}: gradients differ by {diff:e}", spec.name);
                let mut back = Model::<f32>::new(&spec, &pool, ModelOptions::new(rows, 9)).unwrap();
                gpu.download_params(&mut back).unwrap();
                assert!(difference(back.buffers(), cpu.buffers()) <= 1e-5, "running statistics");
            }
        }
    }

    /// A pruning mask set on the device holds the parameters to it after every update, as
    /// `Pruner::apply` does on the CPU after the step.
    #[test]
    fn pruned_weights_stay_zero_through_updates() {
        let (spec, rows) = models().remove(0);
        let pool = Pool::new(&Tracker::new());
        let Some((mut cpu, mut gpu)) =
            pair(&spec, ModelOptions::new(rows, 2), Precision::F32, &pool)
        else {
            return;
        };
        let schedule = crate::prune::PruneSchedule::one_shot();
        let target = crate::prune::Sparsity::PerLayer(0.5);
        let mut pruner = crate::prune::Pruner::new(cpu.layout(), target, schedule).unwrap();
        pruner.update(0, cpu.params_mut());
        gpu.upload_params(&cpu).unwrap();
        gpu.set_prune_mask(pruner.mask_words()).unwrap();
        let config = SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 };
        let mut sgd = Sgd::<f32>::new(cpu.params().len(), config, &pool).unwrap();
        let mut velocity = gpu.state_buffer().unwrap();
        for step in 1..3u64 {
            let (x, labels) = batch(&spec, rows, step);
            let options = StepOptions { step, ..StepOptions::default() };
            cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            let (params, grads) = cpu.params_and_grads();
            sgd.step(params, grads, 0.1).unwrap();
            pruner.apply(cpu.params_mut());
            gpu.sgd_step(Some(&mut velocity), 0.1, &config).unwrap();
            gpu.apply_prune_mask().unwrap();
        }
        let mut back = Model::<f32>::new(&spec, &pool, ModelOptions::new(rows, 9)).unwrap();
        gpu.download_params(&mut back).unwrap();
        assert!(difference(back.params(), cpu.params()) <= 1e-5);
        let zeros = |p: &[f32]| p.iter().filter(|&&v| v == 0.0).count();
        assert_eq!(zeros(back.params()), zeros(cpu.params()));
        assert!(pruner.sparsity() > 0.4, "{}", pruner.sparsity());
    }
    /// Parameters after 8-bit updates against the CPU's: a gradient summed in another order
    /// can move a state value across a code's edge, which changes that parameter's step by a
    /// code's width (a percent of its block's largest value); the rest agree within 1e-5.
    fn follows(got: &[f32], want: &[f32], what: &str) {
        let off: Vec<f32> =
            got.iter().zip(want).map(|(a, b)| (a - b).abs()).filter(|&d| d > 1e-5).collect();
        let worst = off.iter().fold(0f32, |m, &d| m.max(d));
        assert!(
            off.len() * 1000 <= got.len() && worst <= 1e-3,
            "{what}: {} of {} off, worst {worst:e}",
            off.len(),
            got.len()
        );
    }

    /// 8-bit AdamW (decay off biases and norms) on the MLP and a smooth ResNet-8, and 8-bit
    /// Nesterov SGD on the MLP, follow the CPU's 8-bit optimizers; the state comes back in the
    /// CPU's layout, and a resumed device continues from the CPU's state as the CPU does.
    #[test]
    fn eight_bit_state_steps_as_on_the_cpu_and_moves_between_them() {
        use crate::optim::{Adam, AdamConfig, StateCodebook, StatePrecision};
        let resnet = smooth(&ModelSpec::resnet_cifar(8, [3, 8, 8], 10).expect("a ResNet depth"));
        let mlp = models().remove(0).0;
        for (spec, adam) in [(mlp.clone(), true), (mlp, false), (resnet, true)] {
            let pool = Pool::new(&Tracker::new());
            let options = ModelOptions::new(8, 5);
            let Some((mut cpu, mut gpu)) = pair(&spec, options, Precision::F32, &pool) else {
                return;
            };
            let n = cpu.params().len();
            let decayed = cpu.layout().decayed_ranges();
            let adam_config =
                AdamConfig { weight_decay: 0.1, decoupled: true, ..AdamConfig::default() };
            let sgd_config = SgdConfig { momentum: 0.9, nesterov: true, weight_decay: 5e-4 };
            let int8 = StatePrecision::Int8;
            let mut optimizer: Box<dyn Optimizer<f32>> = if adam {
                Box::new(Adam::<f32>::with_precision(n, adam_config, int8, &pool).unwrap())
            } else {
                Box::new(Sgd::<f32>::with_precision(n, sgd_config, int8, &pool).unwrap())
            };
            optimizer.decay_only(decayed.clone());
            gpu.decay_only(&decayed).unwrap();
            let books: &[StateCodebook] = if adam {
                &[StateCodebook::Signed, StateCodebook::Unsigned]
            } else {
                &[StateCodebook::Signed]
            };
            let fresh = |gpu: &GpuModel<Emulator>| {
                books.iter().map(|&b| gpu.quantized_state(b).unwrap()).collect::<Vec<_>>()
            };
            let mut state = fresh(&gpu);
            let step =
                |cpu: &mut Model<f32>,
                 gpu: &mut GpuModel<Emulator>,
                 optimizer: &mut dyn Optimizer<f32>,
                 state: &mut [crate::cuda::device::optim8::QuantizedDeviceBuf<Emulator>],
                 t: u64| {
                    let (x, labels) = batch(&spec, 8, 30 + t);
                    let options = StepOptions { step: t, ..StepOptions::default() };
                    cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
                    gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
                    let (params, grads) = cpu.params_and_grads();
                    optimizer.step(params, grads, 0.01).unwrap();
                    match state {
                        [m, v] => gpu.adam8_step((m, v), t, 0.01, &adam_config).unwrap(),
                        [velocity] => gpu.sgd8_step(velocity, 0.01, &sgd_config).unwrap(),
                        _ => unreachable!("one or two buffers"),
                    }
                };
            for t in 1..=3 {
                step(&mut cpu, &mut gpu, &mut *optimizer, &mut state, t);
            }
            let name = &spec.name;
            let mut back = Model::<f32>::new(&spec, &pool, ModelOptions::new(8, 9)).unwrap();
            gpu.download_params(&mut back).unwrap();
            follows(back.params(), cpu.params(), &format!("{name}: parameters"));
            // The state downloaded into a CPU optimizer: its codes are the CPU's (on the MLP,
            // all of them) but where a gradient summed in another order put a value across a
            // code's edge (a few codes in a thousand on ResNet-8).
            let mut copy: Box<dyn Optimizer<f32>> = if adam {
                Box::new(Adam::<f32>::with_precision(n, adam_config, int8, &pool).unwrap())
            } else {
                Box::new(Sgd::<f32>::with_precision(n, sgd_config, int8, &pool).unwrap())
            };
            for (device, host) in state.iter().zip(copy.state_mut().quantized) {
                gpu.download_quantized(device, host).unwrap();
            }
            let quantized = copy.state().quantized.into_iter().zip(optimizer.state().quantized);
            for ((got, want), book) in quantized.zip(books) {
                let pairs = || got.codes.iter().zip(want.codes);
                let same = pairs().filter(|(a, b)| a == b).count();
                // Codes lie densest near zero, so a code apart there is a smaller step than
                // one far out: compare what they decode to, in units of their block's scale.
                let decode = |code: u8| book.codebook().decode(code);
                let apart =
                    pairs().map(|(&a, &b)| (decode(a) - decode(b)).abs()).fold(0.0, f32::max);
                assert!(
                    same * 200 >= n * 199 && apart <= 0.02,
                    "{name}: {same} of {n} codes agree, at most {apart} of a scale apart"
                );
                assert!(difference(got.scales, want.scales) <= 1e-4, "{name}: scales");
            }
            // A device resumed from the CPU's state and parameters steps as the CPU does.
            gpu.upload_params(&cpu).unwrap();
            let mut resumed = fresh(&gpu);
            for (device, host) in resumed.iter_mut().zip(optimizer.state().quantized) {
                gpu.upload_quantized(device, host).unwrap();
            }
            step(&mut cpu, &mut gpu, &mut *optimizer, &mut resumed, 4);
            gpu.download_params(&mut back).unwrap();
            follows(back.params(), cpu.params(), &format!("{name}: resumed"));
            let short = crate::optim::QuantizedState { codes: &[0; 3], scales: &[0.0] };
            let error = gpu.upload_quantized(&mut resumed[0], short).unwrap_err().to_string();
            assert!(error.contains(&format!("{n} codes")), "{error}");
        }
    }
    /// An update over a ZeRO-1 shard (`set_update_range`, state as long as the shard, decay
    /// ranges counted from its start) moves the shard's parameters as the CPU's optimizer of
    /// the whole range does, and leaves the others alone; with 8-bit state too.
    #[test]
    fn a_shards_update_is_the_whole_updates_part() {
        use crate::optim::{Adam, AdamConfig, StateCodebook, StatePrecision};
        let spec = ModelSpec {
            name: "wide".into(),
            input: vec![64],
            layers: vec![
                LayerSpec::Linear { out: 64 },
                LayerSpec::Tanh,
                LayerSpec::Linear { out: 10 },
            ],
        };
        for precision in [StatePrecision::F32, StatePrecision::Int8] {
            let pool = Pool::new(&Tracker::new());
            let Some((mut cpu, mut gpu)) =
                pair(&spec, ModelOptions::new(6, 5), Precision::F32, &pool)
            else {
                return;
            };
            let (n, before) = (cpu.params().len(), cpu.params().to_vec());
            let shard = 2048..n - 100;
            let config = AdamConfig { weight_decay: 0.1, decoupled: true, ..AdamConfig::default() };
            let decayed = cpu.layout().decayed_ranges();
            let mut adam = Adam::<f32>::with_precision(n, config, precision, &pool).unwrap();
            adam.decay_only(decayed.clone());
            let in_shard: Vec<_> = decayed
                .iter()
                .map(|r| r.start.clamp(shard.start, shard.end)..r.end.clamp(shard.start, shard.end))
                .filter(|r| !r.is_empty())
                .map(|r| r.start - shard.start..r.end - shard.start)
                .collect();
            gpu.set_update_range(shard.clone()).unwrap();
            gpu.decay_only(&in_shard).unwrap();
            let (x, labels) = batch(&spec, 6, 3);
            let options = StepOptions::default();
            cpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            gpu.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
            let (params, grads) = cpu.params_and_grads();
            adam.step(params, grads, 0.01).unwrap();
            if precision == StatePrecision::F32 {
                let (mut m, mut v) = (gpu.state_buffer().unwrap(), gpu.state_buffer().unwrap());
                assert_eq!(m.len(), shard.len());
                gpu.adam_step((&mut m, &mut v), 1, 0.01, &config).unwrap();
            } else {
                let mut m = gpu.quantized_state(StateCodebook::Signed).unwrap();
                let mut v = gpu.quantized_state(StateCodebook::Unsigned).unwrap();
                gpu.adam8_step((&mut m, &mut v), 1, 0.01, &config).unwrap();
            }
            let mut back = Model::<f32>::new(&spec, &pool, ModelOptions::new(6, 9)).unwrap();
            gpu.download_params(&mut back).unwrap();
            let got = back.params();
            assert_eq!(&got[..shard.start], &before[..shard.start], "{precision:?}: before");
            assert_eq!(&got[shard.end..], &before[shard.end..], "{precision:?}: after");
            let want = &cpu.params()[shard.clone()];
            assert!(difference(&got[shard.clone()], want) <= 1e-6, "{precision:?}: the shard");
            assert!(gpu.set_update_range(0..n + 1).is_err());
        }
    }
    /// Decoding on the device, token by token with the KV cache there, gives the CPU
    /// generator's logits (the head tied to the table and a linear one), refuses what it
    /// refuses, and starts again after a reset.
    #[test]
    fn a_gpt_decodes_on_the_emulated_device_as_the_cpus_generator() {
        for tied in [true, false] {
            let mut spec = gpt();
            if !tied {
                *spec.layers.last_mut().unwrap() = LayerSpec::Linear { out: 23 };
            }
            let pool = Pool::new(&Tracker::new());
            let Some((cpu, gpu)) = pair(&spec, ModelOptions::new(2, 4), Precision::F32, &pool)
            else {
                return;
            };
            let (mut on_cpu, mut on_gpu) =
                (cpu.generator(&pool).unwrap(), gpu.generator().unwrap());
            assert_eq!(on_gpu.context(), 9);
            for (p, token) in [3usize, 22, 0, 7, 7, 1, 15, 9, 4].into_iter().enumerate() {
                let want = on_cpu.next(token).unwrap().to_vec();
                let got = on_gpu.next(token).unwrap();
                let diff = difference(got, &want);
                assert!(diff <= 1e-5, "tied {tied}, position {p}: logits differ by {diff:e}");
            }
            let full = on_gpu.next(0).unwrap_err().to_string();
            assert!(full.contains("at most 9 tokens"), "{full}");
            on_gpu.reset();
            let outside = on_gpu.next(23).unwrap_err().to_string();
            assert!(outside.contains("a token id in 0..23"), "{outside}");
            on_cpu.reset();
            let (a, b) = (on_cpu.next(5).unwrap().to_vec(), on_gpu.next(5).unwrap());
            assert!(difference(b, &a) <= 1e-5 && on_gpu.position() == 1, "after a reset");
        }
    }
}
