//! Batch norm's kernels, run as whole passes in the order the GPU path launches them (partial
//! sums, then per-channel totals, statistics, affine constants and the elementwise pass),
//! against `BatchNorm` on channel-major images and flat features, with several numbers of
//! partial sums per channel, and with statistics summed over two simulated replicas.

use rand_xoshiro::Xoshiro256PlusPlus;

use super::{Grid, Kernels, close, near, random, within};
use crate::ops::batch_norm::{BatchNorm, NormPass};

/// The kernels [`check`] covers.
pub(super) const KERNELS: &[&str] = &[
    "dp_bn_partials",
    "dp_bn_moments",
    "dp_bn_record",
    "dp_bn_running",
    "dp_bn_affine",
    "dp_bn_apply",
    "dp_bn_grad_sums",
    "dp_bn_grad_consts",
    "dp_bn_input_grad",
];

/// A norm to check: channels, values per channel per sample, layout, batch (even: it splits
/// into two replicas), and the inputs' mean.
#[derive(Clone, Copy, Debug)]
struct Case {
    channels: usize,
    plane: usize,
    channel_major: bool,
    batch: usize,
    mean: f32,
}

/// Channel-major images and flat features, each once with a mean far from zero relative to
/// the spread (where moments taken about the wrong shift lose the variance in `f32`), and a
/// channel of 6 values (fewer than most numbers of parts).
const CASES: [Case; 4] = [
    Case { channels: 3, plane: 49, channel_major: true, batch: 6, mean: 100.0 },
    Case { channels: 2, plane: 3, channel_major: true, batch: 2, mean: 0.0 },
    Case { channels: 5, plane: 1, channel_major: false, batch: 10, mean: 0.0 },
    Case { channels: 4, plane: 1, channel_major: false, batch: 6, mean: 100.0 },
];

/// Every kernel of [`KERNELS`] on `grid`, against the CPU op.
pub(super) fn check(k: &Kernels, grid: Grid, rng: &mut Xoshiro256PlusPlus) {
    for case in CASES {
        let count = case.batch * case.plane;
        for parts in [1, 3, 64, count + 5] {
            let gpu = Gpu { k, grid, channels: case.channels, parts };
            let data = Data::new(case, rng);
            let want = data.cpu();
            let what = format!("{case:?}, {parts} parts, grid {grid:?}");
            single(&gpu, &data, &want, &what);
            synchronized(&gpu, &data, &want, &what);
        }
    }
}

/// A replica's activation as the kernels see it: channel `c`'s values at `c * cs + i * es`,
/// `i < count`.
#[derive(Clone, Copy, Debug)]
struct Layout {
    count: usize,
    cs: usize,
    es: usize,
}

impl Case {
    fn layout(&self, batch: usize) -> Layout {
        if self.channel_major {
            let count = batch * self.plane;
            Layout { count, cs: count, es: 1 }
        } else {
            Layout { count: batch, cs: 1, es: self.channels }
        }
    }

    /// The two replicas' halves of a whole batch's activation.
    fn halves(&self, values: &[f32]) -> [Vec<f32>; 2] {
        let half = self.batch / 2;
        if !self.channel_major {
            let (a, b) = values.split_at(half * self.channels);
            return [a.to_vec(), b.to_vec()];
        }
        let run = self.batch * self.plane;
        [0, 1].map(|r| {
            let range = r * half * self.plane..(r + 1) * half * self.plane;
            values.chunks_exact(run).flat_map(|channel| channel[range.clone()].to_vec()).collect()
        })
    }
}

/// A case's inputs and parameters.
struct Data {
    case: Case,
    norm: BatchNorm,
    x: Vec<f32>,
    dy: Vec<f32>,
    /// `[gamma, beta]`.
    params: Vec<f32>,
    /// `[running mean, running var]` before the step.
    buffers: Vec<f32>,
}

/// What the CPU op computes: training `y`, the saved `[mean, inv_std]`, the running
/// statistics after the step, `[dgamma, dbeta]`, `dx`, and evaluation's `y` with them.
struct Want {
    y: Vec<f32>,
    stats: Vec<f32>,
    buffers: Vec<f32>,
    grads: Vec<f32>,
    dx: Vec<f32>,
    eval_y: Vec<f32>,
}

impl Data {
    fn new(case: Case, rng: &mut Xoshiro256PlusPlus) -> Data {
        let c = case.channels;
        let len = c * case.batch * case.plane;
        // A spread of about 0.5 (std) around the case's mean.
        let x = random(len, rng).iter().map(|v| case.mean + 0.3 * v).collect();
        let dy = random(len, rng);
        let (p, b) = (random(2 * c, rng), random(2 * c, rng));
        let params = p.iter().enumerate().map(|(i, v)| if i < c { 1.0 + 0.2 * v } else { *v });
        let buffers = b.iter().enumerate();
        let buffers = buffers.map(|(i, v)| if i < c { *v } else { 1.0 + 0.3 * v.abs() });
        let (params, buffers) = (params.collect(), buffers.collect());
        let norm = BatchNorm {
            channels: c,
            plane: case.plane,
            channel_major: case.channel_major,
            momentum: 0.1,
            eps: 1e-5,
            offset: 0,
            buffer_offset: 0,
            stats_offset: 0,
        };
        Data { case, norm, x, dy, params, buffers }
    }

    /// How far `y = x * scale + shift` may be off with `stats` one rounding away from the
    /// CPU's: `x * scale` and `shift` cancel where the mean is far from zero, so the bound is
    /// relative to them rather than to `y`.
    fn y_bound(&self, stats: &[f32]) -> f32 {
        let c = self.case.channels;
        let x = self.x.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let scale = (0..c).map(|ch| (self.params[ch] * stats[c + ch]).abs()).fold(1.0, f32::max);
        let beta = self.params[c..].iter().fold(0.0f32, |m, v| m.max(v.abs()));
        1e-5 * (x * scale + beta)
    }

    fn cpu(&self) -> Want {
        let (n, batch, c) = (&self.norm, self.case.batch, self.case.channels);
        let mut scratch = vec![0.0f64; n.scratch_len()];
        let (mut buffers, mut stats) = (self.buffers.clone(), vec![0.0f32; 2 * c]);
        let (mut y, mut dx) = (vec![0.0f32; self.x.len()], vec![0.0f32; self.x.len()]);
        let (params, x, train) = (&self.params, &self.x, NormPass::Train);
        n.forward(batch, params, &mut buffers, &mut stats, x, &mut y, train, None, &mut scratch);
        let mut grads = vec![0.0f32; 2 * c];
        let (dy, dx_out) = (&self.dy, Some(&mut dx[..]));
        n.backward(batch, params, &mut grads, &stats, x, dy, dx_out, false, None, &mut scratch);
        let (mut eval_buffers, mut eval_stats) = (buffers.clone(), vec![0.0f32; 2 * c]);
        let mut eval_y = vec![0.0f32; self.x.len()];
        let (b, s, eval) = (&mut eval_buffers, &mut eval_stats, NormPass::Eval);
        n.forward(batch, params, b, s, x, &mut eval_y, eval, None, &mut scratch);
        Want { y, stats, buffers, grads, dx, eval_y }
    }
}

/// The kernels of one norm on one grid, with `parts` partial sums per channel.
struct Gpu<'a> {
    k: &'a Kernels,
    grid: Grid,
    channels: usize,
    parts: usize,
}

type Partials =
    unsafe extern "C" fn(*const f32, *const f32, *const f32, *mut f32, i64, i64, i64, i64, i64);
type Moments = unsafe extern "C" fn(*const f32, *const f32, *mut f64, i64, i64, i64, f64);
type Record =
    unsafe extern "C" fn(*const f64, *mut f32, *mut f32, *mut f32, *mut f32, i64, f64, f64);
type Running = unsafe extern "C" fn(*const f32, *const f32, *mut f32, *mut f32, i64, f64);
type Affine = unsafe extern "C" fn(*const f32, *const f32, *const f32, *const f32, *mut f32, i64);
type Apply = unsafe extern "C" fn(*const f32, *mut f32, *const f32, i64, i64, i64);
type GradSums =
    unsafe extern "C" fn(*const f32, *const f32, *mut f32, *mut f32, *mut f64, i64, i64, f64, i32);
type GradConsts = unsafe extern "C" fn(*const f64, *const f32, *const f32, *mut f32, i64);
type InputGrad = unsafe extern "C" fn(
    *const f32,
    *const f32,
    *mut f32,
    *const f32,
    *const f32,
    i64,
    i64,
    i64,
    i32,
);

impl Gpu<'_> {
    /// Each channel's partial sums of `x` (forward), or with `(dy, mean)` of the gradient.
    fn partials(&self, x: &[f32], backward: Option<(&[f32], &[f32])>, l: Layout) -> Vec<f32> {
        let kernel = self.k.get::<Partials>("dp_bn_partials");
        let mut partials = vec![f32::NAN; 2 * self.channels * self.parts];
        let (dy, mean) = match backward {
            Some((dy, mean)) => (dy.as_ptr(), mean.as_ptr()),
            None => (std::ptr::null(), std::ptr::null()),
        };
        let [c, count, cs, es, parts] = [self.channels, l.count, l.cs, l.es, self.parts];
        let [c, count, cs, es, parts] = [c, count, cs, es, parts].map(|v| v as i64);
        let out = partials.as_mut_ptr();
        // SAFETY: `x` (and `dy`) hold the layout's values, `mean` a value per channel,
        // `partials` two per channel and part.
        self.k.launch(self.grid, || unsafe {
            kernel(x.as_ptr(), dy, mean, out, c, count, cs, es, parts)
        });
        partials
    }

    /// `[sum x, sum x^2, count]` of a replica's `x`, as an all-reduce would sum them.
    fn moments(&self, x: &[f32], l: Layout) -> Vec<f64> {
        let partials = self.partials(x, None, l);
        let kernel = self.k.get::<Moments>("dp_bn_moments");
        let mut sums = vec![f64::NAN; 2 * self.channels + 1];
        let [c, parts, cs] = [self.channels, self.parts, l.cs].map(|v| v as i64);
        let (count, out) = (l.count as f64, sums.as_mut_ptr());
        // SAFETY: `partials` as `partials` wrote them, `sums` holds `2C + 1` values.
        self.k.launch(self.grid, || unsafe {
            kernel(partials.as_ptr(), x.as_ptr(), out, c, parts, cs, count)
        });
        sums
    }

    /// The saved `[mean, inv_std]` from (reduced) `sums`, moving `running`.
    fn record(&self, sums: &[f64], running: &mut [f32]) -> Vec<f32> {
        let kernel = self.k.get::<Record>("dp_bn_record");
        let c = self.channels;
        let mut stats = vec![f32::NAN; 2 * c];
        let (mean, inv_std) = stats.split_at_mut(c);
        let (running_mean, running_var) = running.split_at_mut(c);
        let ptrs = (mean.as_mut_ptr(), inv_std.as_mut_ptr());
        let running = (running_mean.as_mut_ptr(), running_var.as_mut_ptr());
        // SAFETY: `sums` holds `2C + 1` values, the others `C`.
        self.k.launch(self.grid, || unsafe {
            kernel(sums.as_ptr(), ptrs.0, ptrs.1, running.0, running.1, c as i64, 0.1, 1e-5)
        });
        stats
    }

    /// Evaluation's `[mean, inv_std]` from the running statistics.
    fn running(&self, running: &[f32]) -> Vec<f32> {
        let kernel = self.k.get::<Running>("dp_bn_running");
        let c = self.channels;
        let mut stats = vec![f32::NAN; 2 * c];
        let (mean, inv_std) = stats.split_at_mut(c);
        let ptrs = (mean.as_mut_ptr(), inv_std.as_mut_ptr());
        let (running_mean, running_var) = running.split_at(c);
        // SAFETY: every buffer holds `C` values.
        self.k.launch(self.grid, || unsafe {
            kernel(running_mean.as_ptr(), running_var.as_ptr(), ptrs.0, ptrs.1, c as i64, 1e-5)
        });
        stats
    }

    /// `y` of `x` normalized by `stats` and scaled by `params`.
    fn normalize(&self, x: &[f32], l: Layout, params: &[f32], stats: &[f32]) -> Vec<f32> {
        let (affine_kernel, apply) =
            (self.k.get::<Affine>("dp_bn_affine"), self.k.get::<Apply>("dp_bn_apply"));
        let c = self.channels;
        let ((gamma, beta), (mean, inv_std)) = (params.split_at(c), stats.split_at(c));
        let mut affine = vec![f32::NAN; 2 * c];
        let out = affine.as_mut_ptr();
        // SAFETY: every buffer holds `C` values, `affine` `2C`.
        self.k.launch(self.grid, || unsafe {
            let stats = (mean.as_ptr(), inv_std.as_ptr());
            affine_kernel(gamma.as_ptr(), beta.as_ptr(), stats.0, stats.1, out, c as i64)
        });
        let mut y = vec![f32::NAN; x.len()];
        let [c, count, cs] = [c, l.count, l.cs].map(|v| v as i64);
        let out = y.as_mut_ptr();
        // SAFETY: `x` and `y` hold `C * count` values, `affine` `2C`.
        self.k
            .launch(self.grid, || unsafe { apply(x.as_ptr(), out, affine.as_ptr(), c, count, cs) });
        y
    }

    /// The training forward of one replica alone: `(y, stats, running)`.
    fn train(&self, data: &Data, l: Layout) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let sums = self.moments(&data.x, l);
        let mut running = data.buffers.clone();
        let stats = self.record(&sums, &mut running);
        (self.normalize(&data.x, l, &data.params, &stats), stats, running)
    }

    /// The parameter gradients written into `grads` (`[dgamma, dbeta]`, or added with
    /// `accumulate`), and the sums `[sum dy, sum dy * xhat, count]` for the input gradient.
    fn grad_sums(
        &self,
        x: &[f32],
        dy: &[f32],
        l: Layout,
        stats: &[f32],
        grads: &mut [f32],
        accumulate: i32,
    ) -> Vec<f64> {
        let c = self.channels;
        let (mean, inv_std) = stats.split_at(c);
        let partials = self.partials(x, Some((dy, mean)), l);
        let kernel = self.k.get::<GradSums>("dp_bn_grad_sums");
        let mut sums = vec![f64::NAN; 2 * c + 1];
        let (dgamma, dbeta) = grads.split_at_mut(c);
        let out = (dgamma.as_mut_ptr(), dbeta.as_mut_ptr(), sums.as_mut_ptr());
        let [c, parts] = [c, self.parts].map(|v| v as i64);
        let count = l.count as f64;
        // SAFETY: `partials` as `partials` wrote them, `sums` holds `2C + 1` values, the
        // others `C`.
        self.k.launch(self.grid, || unsafe {
            let p = partials.as_ptr();
            kernel(p, inv_std.as_ptr(), out.0, out.1, out.2, c, parts, count, accumulate)
        });
        sums
    }

    /// `dx` from (reduced) gradient `sums`, written over `dx` or added with `add`.
    #[allow(clippy::too_many_arguments)]
    fn input_grad(
        &self,
        x: &[f32],
        dy: &[f32],
        l: Layout,
        sums: &[f64],
        gamma: &[f32],
        stats: &[f32],
        dx: &mut [f32],
        add: i32,
    ) {
        let (consts_kernel, kernel) = (
            self.k.get::<GradConsts>("dp_bn_grad_consts"),
            self.k.get::<InputGrad>("dp_bn_input_grad"),
        );
        let c = self.channels;
        let (mean, inv_std) = stats.split_at(c);
        let mut consts = vec![f32::NAN; 3 * c];
        let out = consts.as_mut_ptr();
        // SAFETY: `sums` holds `2C + 1` values, `consts` `3C`, the others `C`.
        self.k.launch(self.grid, || unsafe {
            consts_kernel(sums.as_ptr(), gamma.as_ptr(), inv_std.as_ptr(), out, c as i64)
        });
        let [c, count, cs] = [c, l.count, l.cs].map(|v| v as i64);
        let out = dx.as_mut_ptr();
        // SAFETY: `x`, `dy` and `dx` hold `C * count` values, `mean` `C`, `consts` `3C`.
        self.k.launch(self.grid, || unsafe {
            let (x, dy, m, k) = (x.as_ptr(), dy.as_ptr(), mean.as_ptr(), consts.as_ptr());
            kernel(x, dy, out, m, k, c, count, cs, add)
        });
    }
}

/// The whole batch on one replica: training forward, evaluation, and backward with the
/// parameter gradients written and accumulated and the input gradient written and added.
fn single(gpu: &Gpu<'_>, data: &Data, want: &Want, what: &str) {
    let (case, c) = (data.case, data.case.channels);
    let l = case.layout(case.batch);
    let (y, stats, running) = gpu.train(data, l);
    close(&stats, &want.stats, &format!("saved mean and inv_std of {what}"));
    close(&running, &want.buffers, &format!("running mean and var of {what}"));
    let bound = data.y_bound(&want.stats);
    within(&y, &want.y, bound, &format!("y of {what}"));
    let eval_stats = gpu.running(&want.buffers);
    let eval_y = gpu.normalize(&data.x, l, &data.params, &eval_stats);
    let bound = data.y_bound(&eval_stats);
    within(&eval_y, &want.eval_y, bound, &format!("evaluation y of {what}"));
    // Backward from the CPU's saved statistics, so that it alone is checked.
    let (x, dy, gamma) = (&data.x, &data.dy, &data.params[..c]);
    let mut grads = vec![f32::NAN; 2 * c];
    let sums = gpu.grad_sums(x, dy, l, &want.stats, &mut grads, 0);
    near(&grads, &want.grads, 1e-5, &format!("dgamma and dbeta of {what}"));
    let mut added: Vec<f32> = (0..2 * c).map(|i| i as f32 - 1.5).collect();
    let want_added: Vec<f32> = added.iter().zip(&want.grads).map(|(a, g)| a + g).collect();
    gpu.grad_sums(x, dy, l, &want.stats, &mut added, 1);
    near(&added, &want_added, 1e-5, &format!("dgamma and dbeta accumulated of {what}"));
    let mut dx = vec![f32::NAN; x.len()];
    gpu.input_grad(x, dy, l, &sums, gamma, &want.stats, &mut dx, 0);
    near(&dx, &want.dx, 1e-5, &format!("dx of {what}"));
    let mut dx: Vec<f32> = (0..x.len()).map(|i| (i % 7) as f32 - 3.0).collect();
    let want_dx: Vec<f32> = dx.iter().zip(&want.dx).map(|(a, g)| a + g).collect();
    gpu.input_grad(x, dy, l, &sums, gamma, &want.stats, &mut dx, 1);
    near(&dx, &want_dx, 1e-5, &format!("dx added to of {what}"));
}

/// The batch split over two replicas whose sums are added between the passes, as
/// `--sync-bn`'s all-reduce does: each replica's statistics, output and input gradient are the
/// whole batch's, and its parameter gradients add up to the whole batch's.
fn synchronized(gpu: &Gpu<'_>, data: &Data, want: &Want, what: &str) {
    let (case, c) = (data.case, data.case.channels);
    let l = case.layout(case.batch / 2);
    let (xs, dys) = (case.halves(&data.x), case.halves(&data.dy));
    let (want_ys, want_dxs) = (case.halves(&want.y), case.halves(&want.dx));
    let reduce =
        |a: Vec<f64>, b: Vec<f64>| -> Vec<f64> { a.iter().zip(&b).map(|(a, b)| a + b).collect() };
    let sums = reduce(gpu.moments(&xs[0], l), gpu.moments(&xs[1], l));
    let mut grads = [vec![f32::NAN; 2 * c], vec![f32::NAN; 2 * c]];
    let mut grad_sums = Vec::new();
    for r in 0..2 {
        let what = format!("replica {r} of 2 of {what}");
        let mut running = data.buffers.clone();
        let stats = gpu.record(&sums, &mut running);
        close(&stats, &want.stats, &format!("saved mean and inv_std of {what}"));
        close(&running, &want.buffers, &format!("running mean and var of {what}"));
        let y = gpu.normalize(&xs[r], l, &data.params, &stats);
        within(&y, &want_ys[r], data.y_bound(&stats), &format!("y of {what}"));
        grad_sums.push(gpu.grad_sums(&xs[r], &dys[r], l, &want.stats, &mut grads[r], 0));
    }
    let [a, b] = grads;
    let grads: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
    near(
        &grads,
        &want.grads,
        1e-5,
        &format!("dgamma and dbeta summed over the replicas of {what}"),
    );
    let sums = reduce(grad_sums.swap_remove(0), grad_sums.swap_remove(0));
    for r in 0..2 {
        let mut dx = vec![f32::NAN; xs[r].len()];
        let gamma = &data.params[..c];
        gpu.input_grad(&xs[r], &dys[r], l, &sums, gamma, &want.stats, &mut dx, 0);
        near(&dx, &want_dxs[r], 1e-5, &format!("dx of replica {r} of 2 of {what}"));
    }
}
