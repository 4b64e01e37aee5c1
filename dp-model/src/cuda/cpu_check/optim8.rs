//! The 8-bit state updates of Adam and SGD: the parameters, codes and scales after a few steps
//! against the CPU optimizers with 8-bit state, which compute the same operations (the codes
//! and scales must be the CPU's exactly).

use dp_mem::{Pool, Tracker};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::{Grid, Kernels, close, random};
use crate::cuda::device_memory::int8_work_len;
use crate::optim::codebook::StateCodebook;
use crate::optim::{
    Adam, AdamConfig, AdamUpdate, Optimizer, STATE_BLOCK, Sgd, SgdConfig, StatePrecision,
};

/// The kernels [`check`] covers.
pub(super) const KERNELS: &[&str] =
    &["dp_adam8_maxima", "dp_adam8_step", "dp_sgd8_maxima", "dp_sgd8_step"];

/// Every kernel of [`KERNELS`] on `grid`, over no values, one, a whole block and a partial
/// last block, decaying everything or the ranges of a mask.
pub(super) fn check(k: &Kernels, grid: Grid, rng: &mut Xoshiro256PlusPlus) {
    for n in [0, 1, STATE_BLOCK, 2 * STATE_BLOCK + 904] {
        let (p0, grads) = (random(n, rng), random(n, rng));
        // Decay left off a few ranges, as for biases and norms.
        let ranges = vec![n / 8..n / 3, n / 2..n];
        for mask in [None, Some(ranges)] {
            adam(k, grid, &p0, &grads, mask.clone());
            sgd(k, grid, &p0, &grads, mask);
        }
    }
}

/// One state buffer as the device holds it: codes, scales and the work area.
struct State {
    codes: Vec<u8>,
    scales: Vec<f32>,
    work: Vec<f32>,
}

impl State {
    fn zeros(n: usize, book: StateCodebook) -> Self {
        let blocks = n.div_ceil(STATE_BLOCK);
        let mut work = book.codebook().device_table();
        work.resize(int8_work_len(blocks), f32::NAN);
        State { codes: vec![0; n], scales: vec![0.0; blocks], work }
    }

    /// Its codes and scales against the CPU's.
    fn check(&self, cpu: crate::optim::QuantizedState<'_>, what: &str) {
        assert_eq!(self.scales, cpu.scales, "{what}: scales");
        if let Some(i) = (0..self.codes.len()).find(|&i| self.codes[i] != cpu.codes[i]) {
            panic!("{what}: code {i} is {}, the CPU's {}", self.codes[i], cpu.codes[i]);
        }
    }
}

/// The mask as the kernels take it: its pairs and their count, or null and -1.
fn flat(mask: &Option<Vec<std::ops::Range<usize>>>) -> (Vec<i64>, i64) {
    match mask {
        Some(ranges) => (
            ranges.iter().flat_map(|r| [r.start as i64, r.end as i64]).collect(),
            ranges.len() as i64,
        ),
        None => (vec![], -1),
    }
}

type AdamMaxima = unsafe extern "C" fn(
    *const f32,
    *const f32,
    i64,
    *const u8,
    *const f32,
    *mut f32,
    *const u8,
    *const f32,
    *mut f32,
    f32,
    f32,
    f32,
    *const i64,
    i64,
);
type AdamStep = unsafe extern "C" fn(
    *mut f32,
    *const f32,
    i64,
    *mut u8,
    *mut f32,
    *mut f32,
    *mut u8,
    *mut f32,
    *mut f32,
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

fn adam(
    k: &Kernels,
    grid: Grid,
    p0: &[f32],
    grads: &[f32],
    mask: Option<Vec<std::ops::Range<usize>>>,
) {
    let (maxima, step) =
        (k.get::<AdamMaxima>("dp_adam8_maxima"), k.get::<AdamStep>("dp_adam8_step"));
    let pool = Pool::new(&Tracker::new());
    let (n, lr) = (p0.len(), 0.01);
    let (pairs, count) = flat(&mask);
    for decoupled in [false, true] {
        let config = AdamConfig { weight_decay: 0.1, decoupled, ..AdamConfig::default() };
        let mut cpu =
            Adam::<f32>::with_precision(n, config, StatePrecision::Int8, &pool).expect("adam");
        if let Some(ranges) = &mask {
            cpu.decay_only(ranges.clone());
        }
        let (mut want, mut p) = (p0.to_vec(), p0.to_vec());
        let mut m = State::zeros(n, StateCodebook::Signed);
        let mut v = State::zeros(n, StateCodebook::Unsigned);
        for steps in 1..=3 {
            cpu.step(&mut want, grads, lr).expect("adam step");
            let s = AdamUpdate::new(&config, steps, lr);
            let [size, c2, b1, b2, eps, wd, shrink] =
                [s.step_size, s.sqrt_c2, s.beta1, s.beta2, s.eps, s.coupled_wd, s.shrink]
                    .map(|a| a as f32);
            // Each launch over the whole grid before the next, as the stream orders them.
            k.launch(grid, || {
                // SAFETY: every buffer holds what the kernel reads for `n` values.
                unsafe {
                    maxima(
                        p.as_ptr(),
                        grads.as_ptr(),
                        n as i64,
                        m.codes.as_ptr(),
                        m.scales.as_ptr(),
                        m.work.as_mut_ptr(),
                        v.codes.as_ptr(),
                        v.scales.as_ptr(),
                        v.work.as_mut_ptr(),
                        b1,
                        b2,
                        wd,
                        pairs.as_ptr(),
                        count,
                    )
                }
            });
            k.launch(grid, || {
                // SAFETY: as above.
                unsafe {
                    step(
                        p.as_mut_ptr(),
                        grads.as_ptr(),
                        n as i64,
                        m.codes.as_mut_ptr(),
                        m.scales.as_mut_ptr(),
                        m.work.as_mut_ptr(),
                        v.codes.as_mut_ptr(),
                        v.scales.as_mut_ptr(),
                        v.work.as_mut_ptr(),
                        size,
                        c2,
                        b1,
                        b2,
                        eps,
                        wd,
                        shrink,
                        pairs.as_ptr(),
                        count,
                    )
                }
            });
        }
        let what = format!("8-bit Adam decoupled {decoupled}, {n} values, mask {mask:?}");
        close(&p, &want, &what);
        let state = cpu.state();
        m.check(state.quantized[0], &format!("first moment of {what}"));
        v.check(state.quantized[1], &format!("second moment of {what}"));
    }
}

type SgdMaxima = unsafe extern "C" fn(
    *const f32,
    *const f32,
    i64,
    *const u8,
    *const f32,
    *mut f32,
    f32,
    f32,
    *const i64,
    i64,
);
type SgdStep = unsafe extern "C" fn(
    *mut f32,
    *const f32,
    i64,
    *mut u8,
    *mut f32,
    *mut f32,
    f32,
    f32,
    f32,
    i32,
    *const i64,
    i64,
);

fn sgd(
    k: &Kernels,
    grid: Grid,
    p0: &[f32],
    grads: &[f32],
    mask: Option<Vec<std::ops::Range<usize>>>,
) {
    let (maxima, step) = (k.get::<SgdMaxima>("dp_sgd8_maxima"), k.get::<SgdStep>("dp_sgd8_step"));
    let pool = Pool::new(&Tracker::new());
    let (n, lr) = (p0.len(), 0.05f32);
    let (pairs, count) = flat(&mask);
    for nesterov in [false, true] {
        let config = SgdConfig { momentum: 0.9, nesterov, weight_decay: 0.01 };
        let mut cpu =
            Sgd::<f32>::with_precision(n, config, StatePrecision::Int8, &pool).expect("sgd");
        if let Some(ranges) = &mask {
            cpu.decay_only(ranges.clone());
        }
        let (mut want, mut p) = (p0.to_vec(), p0.to_vec());
        let mut velocity = State::zeros(n, StateCodebook::Signed);
        for _ in 0..3 {
            cpu.step(&mut want, grads, f64::from(lr)).expect("sgd step");
            let (wd, mu) = (0.01, 0.9);
            k.launch(grid, || {
                // SAFETY: every buffer holds what the kernel reads for `n` values.
                unsafe {
                    maxima(
                        p.as_ptr(),
                        grads.as_ptr(),
                        n as i64,
                        velocity.codes.as_ptr(),
                        velocity.scales.as_ptr(),
                        velocity.work.as_mut_ptr(),
                        wd,
                        mu,
                        pairs.as_ptr(),
                        count,
                    )
                }
            });
            k.launch(grid, || {
                // SAFETY: as above.
                unsafe {
                    step(
                        p.as_mut_ptr(),
                        grads.as_ptr(),
                        n as i64,
                        velocity.codes.as_mut_ptr(),
                        velocity.scales.as_mut_ptr(),
                        velocity.work.as_mut_ptr(),
                        lr,
                        wd,
                        mu,
                        i32::from(nesterov),
                        pairs.as_ptr(),
                        count,
                    )
                }
            });
        }
        let what = format!("8-bit SGD nesterov {nesterov}, {n} values, mask {mask:?}");
        close(&p, &want, &what);
        velocity.check(cpu.state().quantized[0], &format!("velocity of {what}"));
    }
}
