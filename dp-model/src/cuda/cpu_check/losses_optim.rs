//! The losses, the optimizer steps, gradient clipping and the pruning mask.

use dp_mem::{Pool, Tracker};
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::RngCore;

use super::{Grid, Kernels, SIZES, close, random};
use crate::ops::loss::{Targets, loss, smoothed_loss};
use crate::optim::{
    Adam, AdamConfig, AdamUpdate, Optimizer, Sgd, SgdConfig, clip_grad_norm, grad_norm,
};

/// The kernels [`check`] covers.
pub(super) const KERNELS: &[&str] = &[
    "dp_softmax_cross_entropy",
    "dp_squared_error",
    "dp_sgd_step",
    "dp_adam_step",
    "dp_square_partials",
    "dp_norm",
    "dp_clip",
    "dp_apply_mask",
];

/// Every kernel of [`KERNELS`] on `grid`, against the CPU ops.
pub(super) fn check(k: &Kernels, grid: Grid, rng: &mut Xoshiro256PlusPlus) {
    for n in SIZES {
        for mask in [false, true] {
            optimizers(k, grid, n, mask, rng);
        }
        clip(k, grid, n, rng);
        prune_mask(k, grid, n, rng);
    }
    for (rows, cols) in [(0, 3), (1, 1), (5, 3), (33, 10)] {
        for smoothing in [0.0, 0.1] {
            cross_entropy(k, grid, rows, cols, smoothing, rng);
        }
        squared_error(k, grid, rows, cols, rng);
    }
}

type CrossEntropy = unsafe extern "C" fn(
    *const f32,
    *const i64,
    *mut f32,
    *mut f32,
    *mut i32,
    *mut i32,
    i64,
    i64,
    f32,
    f32,
);

/// Softmax cross-entropy with label `smoothing`, every third sample ignored.
fn cross_entropy(
    k: &Kernels,
    grid: Grid,
    rows: usize,
    cols: usize,
    smoothing: f32,
    rng: &mut Xoshiro256PlusPlus,
) {
    let what = format!("[{rows}, {cols}] smoothed by {smoothing}, grid {grid:?}");
    let logits = random(rows * cols, rng);
    let denominator = rows.max(1) as f32;
    // Every third sample ignored (a negative label), as a padded batch marks them.
    let labels: Vec<i64> = (0..rows)
        .map(|r| if r % 3 == 2 { -1 } else { (rng.next_u32() as usize % cols) as i64 })
        .collect();
    let kernel = k.get::<CrossEntropy>("dp_softmax_cross_entropy");
    let mut want_grad = vec![0.0; rows * cols];
    let targets = Targets::Classes(&labels);
    let s = f64::from(smoothing);
    let want = smoothed_loss(&logits, rows, cols, &targets, denominator, s, Some(&mut want_grad));
    // Into a buffer of its own, and over the logits themselves (as the GPU step runs it).
    for in_place in [false, true] {
        let what = format!("{what}, in place {in_place}");
        let (mut grad, mut row_loss) = (vec![f32::NAN; rows * cols], vec![f32::NAN; rows]);
        let (mut counted, mut correct) = (vec![-1i32; rows], vec![-1i32; rows]);
        let mut over = logits.clone();
        let (z, g) = match in_place {
            true => (over.as_mut_ptr().cast_const(), over.as_mut_ptr()),
            false => (logits.as_ptr(), grad.as_mut_ptr()),
        };
        k.launch(grid, || {
            // SAFETY: the buffers hold `rows * cols` or `rows` values.
            unsafe {
                kernel(
                    z,
                    labels.as_ptr(),
                    g,
                    row_loss.as_mut_ptr(),
                    counted.as_mut_ptr(),
                    correct.as_mut_ptr(),
                    rows as i64,
                    cols as i64,
                    1.0 / denominator,
                    smoothing,
                )
            }
        });
        let grad = if in_place { over } else { grad };
        close(&grad, &want_grad, &format!("cross-entropy gradient of {what}"));
        let sum: f64 = row_loss.iter().map(|&l| l as f64).sum();
        assert!(
            (sum - want.loss_sum).abs() <= 1e-5 * want.loss_sum.abs().max(1.0),
            "cross-entropy of {what}: {sum} against {}",
            want.loss_sum
        );
        let counted = counted.iter().sum::<i32>() as usize;
        assert_eq!(counted, want.samples, "samples counted of {what}");
        assert_eq!(correct.iter().sum::<i32>() as usize, want.correct, "correct samples of {what}");
    }
}

fn squared_error(k: &Kernels, grid: Grid, rows: usize, cols: usize, rng: &mut Xoshiro256PlusPlus) {
    type SquaredError =
        unsafe extern "C" fn(*const f32, *const f32, *mut f32, *mut f32, *mut i32, i64, i64, f32);
    let what = format!("[{rows}, {cols}], grid {grid:?}");
    let (logits, values) = (random(rows * cols, rng), random(rows * cols, rng));
    let denominator = rows.max(1) as f32;
    let kernel = k.get::<SquaredError>("dp_squared_error");
    let mut want_grad = vec![0.0; rows * cols];
    let targets = ndarray::Array2::from_shape_vec((rows, cols), values.clone()).expect("shape");
    let targets = Targets::Values(targets.view());
    let want = loss(&logits, rows, cols, &targets, denominator, Some(&mut want_grad));
    // Into a buffer of its own, and over the outputs themselves (as the GPU step runs it).
    for in_place in [false, true] {
        let what = format!("{what}, in place {in_place}");
        let (mut grad, mut row_loss, mut correct) =
            (vec![f32::NAN; rows * cols], vec![f32::NAN; rows], vec![-1i32; rows]);
        let mut over = logits.clone();
        let (z, g) = match in_place {
            true => (over.as_mut_ptr().cast_const(), over.as_mut_ptr()),
            false => (logits.as_ptr(), grad.as_mut_ptr()),
        };
        k.launch(grid, || {
            // SAFETY: the buffers hold `rows * cols` or `rows` values.
            unsafe {
                kernel(
                    z,
                    values.as_ptr(),
                    g,
                    row_loss.as_mut_ptr(),
                    correct.as_mut_ptr(),
                    rows as i64,
                    cols as i64,
                    1.0 / denominator,
                )
            }
        });
        let grad = if in_place { over } else { grad };
        close(&grad, &want_grad, &format!("squared error gradient of {what}"));
        let sum: f64 = row_loss.iter().map(|&l| l as f64).sum();
        assert!(
            (sum - want.loss_sum).abs() <= 1e-5 * want.loss_sum.abs().max(1.0),
            "squared error of {what}: {sum} against {}",
            want.loss_sum
        );
        assert_eq!(correct.iter().sum::<i32>() as usize, want.correct, "correct samples of {what}");
    }
}

/// The decay mask of `n` parameters as the kernels take it (flat `[start, end)` pairs) and as
/// the CPU optimizers do: a few ranges that leave parameters out at both ends and between.
fn decay_mask(n: usize) -> (Vec<i64>, Vec<std::ops::Range<usize>>) {
    let ranges: Vec<_> = [1..1 + n / 4, n / 2..n / 2 + n / 8 + 1, n - n / 8..n]
        .into_iter()
        .filter(|r| r.start < r.end && r.end <= n)
        .fold(Vec::new(), |mut all: Vec<std::ops::Range<usize>>, r| {
            if all.last().is_none_or(|last| last.end < r.start) {
                all.push(r);
            }
            all
        });
    (ranges.iter().flat_map(|r| [r.start as i64, r.end as i64]).collect(), ranges)
}

/// Both optimizers, decaying every parameter or (with `mask`) those of [`decay_mask`].
fn optimizers(k: &Kernels, grid: Grid, n: usize, mask: bool, rng: &mut Xoshiro256PlusPlus) {
    let (p0, grads) = (random(n, rng), random(n, rng));
    let (flat, ranges) = decay_mask(n);
    // As `device.rs` passes them: a null mask and -1 when everything decays.
    let decayed = if mask { (flat.as_ptr(), ranges.len() as i64) } else { (std::ptr::null(), -1) };
    let ranges = mask.then_some(ranges);
    let what = format!("{n} values, decay mask {ranges:?}, grid {grid:?}");
    sgd(k, grid, &p0, &grads, decayed, ranges.clone(), &what);
    adam(k, grid, &p0, &grads, decayed, ranges, &what);
}

/// A decay mask as the kernels take it: its `[start, end)` pairs and how many (-1: none).
type Mask = (*const i64, i64);

fn sgd(
    k: &Kernels,
    grid: Grid,
    p0: &[f32],
    grads: &[f32],
    (decayed, count): Mask,
    ranges: Option<Vec<std::ops::Range<usize>>>,
    what: &str,
) {
    type SgdKernel = unsafe extern "C" fn(
        *mut f32,
        *const f32,
        *mut f32,
        i64,
        f32,
        f32,
        f32,
        i32,
        *const i64,
        i64,
    );
    let pool = Pool::new(&Tracker::new());
    let (n, lr, steps) = (p0.len(), 0.05, 3);
    let sgd_kernel = k.get::<SgdKernel>("dp_sgd_step");
    for (momentum, nesterov) in [(0.0, false), (0.9, false), (0.9, true)] {
        let config = SgdConfig { momentum, nesterov, weight_decay: 0.01 };
        let mut cpu = Sgd::<f32>::new(n, config, &pool).expect("sgd");
        if let Some(ranges) = &ranges {
            cpu.decay_only(ranges.clone());
        }
        let (mut want, mut p, mut v) = (p0.to_vec(), p0.to_vec(), vec![0.0f32; n]);
        for _ in 0..steps {
            cpu.step(&mut want, grads, lr).expect("sgd step");
            // As `device.rs` passes them: no velocity without momentum.
            let v_ptr = if momentum > 0.0 { v.as_mut_ptr() } else { std::ptr::null_mut() };
            k.launch(grid, || {
                // SAFETY: `p`, `grads` and `v` hold `n` values, `decayed` `2 * count`.
                unsafe {
                    sgd_kernel(
                        p.as_mut_ptr(),
                        grads.as_ptr(),
                        v_ptr,
                        n as i64,
                        lr as f32,
                        0.01,
                        momentum as f32,
                        i32::from(nesterov),
                        decayed,
                        count,
                    )
                }
            });
        }
        let what = format!("SGD momentum {momentum} nesterov {nesterov}, {what}");
        close(&p, &want, &what);
        if momentum > 0.0 {
            close(&v, cpu.state().buffers[0], &format!("velocity of {what}"));
        }
    }
}

fn adam(
    k: &Kernels,
    grid: Grid,
    p0: &[f32],
    grads: &[f32],
    (decayed, count): Mask,
    ranges: Option<Vec<std::ops::Range<usize>>>,
    what: &str,
) {
    type AdamKernel = unsafe extern "C" fn(
        *mut f32,
        *const f32,
        *mut f32,
        *mut f32,
        i64,
        f32,
        f32,
        f32,
        f32,
        f32,
        f32,
        f32,
        *const i64,
        i64,
    );
    let pool = Pool::new(&Tracker::new());
    let (n, lr, steps) = (p0.len(), 0.05, 3);
    let adam_kernel = k.get::<AdamKernel>("dp_adam_step");
    for decoupled in [false, true] {
        let config = AdamConfig { weight_decay: 0.01, decoupled, ..AdamConfig::default() };
        let mut cpu = Adam::<f32>::new(n, config, &pool).expect("adam");
        if let Some(ranges) = &ranges {
            cpu.decay_only(ranges.clone());
        }
        let (mut want, mut p) = (p0.to_vec(), p0.to_vec());
        let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
        for step in 1..=steps {
            cpu.step(&mut want, grads, lr).expect("adam step");
            let s = AdamUpdate::new(&config, step, lr);
            let args = [s.step_size, s.sqrt_c2, s.beta1, s.beta2, s.eps, s.coupled_wd, s.shrink]
                .map(|a| a as f32);
            k.launch(grid, || {
                // SAFETY: `p`, `grads`, `m` and `v` hold `n` values, `decayed` `2 * count`.
                unsafe {
                    adam_kernel(
                        p.as_mut_ptr(),
                        grads.as_ptr(),
                        m.as_mut_ptr(),
                        v.as_mut_ptr(),
                        n as i64,
                        args[0],
                        args[1],
                        args[2],
                        args[3],
                        args[4],
                        args[5],
                        args[6],
                        decayed,
                        count,
                    )
                }
            });
        }
        let what = format!("Adam decoupled {decoupled}, {what}");
        close(&p, &want, &what);
        let state = cpu.state();
        close(&m, state.buffers[0], &format!("first moment of {what}"));
        close(&v, state.buffers[1], &format!("second moment of {what}"));
    }
}

/// Clipping by global norm in its three launches, with `parts` partial sums: the norm
/// against `grad_norm`, then the gradients clipped from above the limit, left alone below
/// it, and left alone when a gradient is NaN or infinite.
fn clip(k: &Kernels, grid: Grid, n: usize, rng: &mut Xoshiro256PlusPlus) {
    type Partials = unsafe extern "C" fn(*const f32, i64, *mut f64, i64);
    type Norm = unsafe extern "C" fn(*const f64, i64, *mut f64);
    type Clip = unsafe extern "C" fn(*mut f32, i64, *const f64, f64);
    let (partials_kernel, norm_kernel, clip_kernel) = (
        k.get::<Partials>("dp_square_partials"),
        k.get::<Norm>("dp_norm"),
        k.get::<Clip>("dp_clip"),
    );
    let g0 = random(n, rng);
    let mut cases: Vec<(Vec<f32>, f64)> = Vec::new();
    let norm0 = grad_norm(&g0);
    for max_norm in [norm0 / 3.0, norm0 * 2.0 + 0.5] {
        cases.push((g0.clone(), max_norm));
    }
    for bad in [f32::NAN, f32::INFINITY] {
        let mut g = g0.clone();
        if let Some(v) = g.get_mut(n / 2) {
            *v = bad;
            cases.push((g, 0.5));
        }
    }
    for (g, max_norm) in cases {
        for parts in [1usize, 3, 64] {
            let what = format!("{n} values, {parts} parts, max norm {max_norm}, grid {grid:?}");
            let (mut partials, mut norm) = (vec![f64::NAN; parts], f64::NAN);
            let mut got = g.clone();
            // SAFETY: `got` holds `n` values, `partials` `parts`.
            k.launch(grid, || unsafe {
                partials_kernel(got.as_ptr(), n as i64, partials.as_mut_ptr(), parts as i64)
            });
            // SAFETY: `partials` holds `parts` values.
            k.launch(grid, || unsafe { norm_kernel(partials.as_ptr(), parts as i64, &mut norm) });
            // SAFETY: `got` holds `n` values.
            k.launch(grid, || unsafe { clip_kernel(got.as_mut_ptr(), n as i64, &norm, max_norm) });
            let mut want = g.clone();
            let want_norm = clip_grad_norm(&mut want, max_norm);
            let same = if want_norm.is_finite() {
                (norm - want_norm).abs() <= 1e-12 * want_norm
            } else {
                norm == want_norm || norm.is_nan() && want_norm.is_nan()
            };
            assert!(same, "gradient norm of {what}: {norm}, the CPU gives {want_norm}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            if want_norm.is_finite() {
                close(&got, &want, &format!("clipped gradients of {what}"));
            } else {
                assert_eq!(bits(&got), bits(&want), "unclipped gradients of {what}");
            }
        }
    }
}

/// `dp_apply_mask` against `Pruner::apply`: a mask grown on random weights (two thirds of
/// them pruned, per layer of an MLP), applied to parameters that moved off zero.
fn prune_mask(k: &Kernels, grid: Grid, n: usize, rng: &mut Xoshiro256PlusPlus) {
    use crate::prune::{PruneSchedule, Pruner, Sparsity};
    let Some(hidden) = n.checked_sub(13).map(|h| h / 13).filter(|&h| h > 0) else { return };
    let spec = crate::ModelSpec::mlp(12, &[hidden], 1);
    let layout = spec.layout().expect("a layout");
    let mut pruner = Pruner::new(&layout, Sparsity::PerLayer(0.66), PruneSchedule::one_shot())
        .expect("a pruner");
    let mut want = random(layout.len(), rng);
    pruner.update(0, &mut want);
    assert!(pruner.sparsity() > 0.5, "a mask to apply");
    let moved: Vec<f32> = want.iter().map(|&v| if v == 0.0 { 0.25 } else { v }).collect();
    let mut got = moved.clone();
    let kernel = k.get::<unsafe extern "C" fn(*mut f32, *const u64, i64)>("dp_apply_mask");
    let words = pruner.mask_words();
    // SAFETY: `got` holds the layout's parameters, `words` a bit for each.
    k.launch(grid, || unsafe { kernel(got.as_mut_ptr(), words.as_ptr(), got.len() as i64) });
    pruner.apply(&mut want);
    assert_eq!(got, want, "{} parameters, grid {grid:?}", got.len());
}
