//! A benchmark's training replica: a model, its optimizer and one fixed batch, stepped alone,
//! as one of two replicas on two threads that sum their gradients (as data-parallel training
//! does), or in the memory measurement's child process.

use std::hint::black_box;
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use dp_mem::{Pool, Tracker};
use dp_model::{
    Model, ModelOptions, ModelSpec, Optimizer, Precision, Recompute, StepOptions, Targets,
};
use ndarray::Array2;

use crate::report_parts::median;

/// A model, its optimizer and one fixed batch.
pub(crate) struct Bench<O> {
    pub(crate) model: Model<f32>,
    optimizer: O,
    lr: f64,
    x: Array2<f32>,
    y: Vec<i64>,
    step: u64,
    /// Replicas divide by the global batch so that summed gradients are its mean.
    pub(crate) denominator: Option<usize>,
    tracker: Tracker,
}

impl<O: Optimizer<f32>> Bench<O> {
    /// The model on batch `(x, y)` with `recompute` and its products in `precision`, with
    /// the optimizer `optimizer` makes for its parameter count, stepping at `lr`; the seed is
    /// the same everywhere, so replicas start identical.
    pub(crate) fn new(
        spec: &ModelSpec,
        (recompute, precision): (Recompute, Precision),
        (x, y): (Array2<f32>, Vec<i64>),
        optimizer: impl FnOnce(usize, &Pool) -> O,
        lr: f64,
    ) -> Self {
        let tracker = Tracker::new();
        let pool = Pool::new(&tracker);
        let options = ModelOptions::new(x.nrows(), 1).recompute(recompute).precision(precision);
        let model = Model::<f32>::new(spec, &pool, options).expect("build the model");
        let optimizer = optimizer(model.params().len(), &pool);
        Self { model, optimizer, lr, x, y, step: 0, denominator: None, tracker }
    }

    pub(crate) fn forward_backward(&mut self) -> f64 {
        let opts =
            StepOptions { step: self.step, denominator: self.denominator, ..Default::default() };
        let loss = self.model.forward_backward(self.x.view(), Targets::Classes(&self.y), &opts);
        loss.expect("step").loss_sum
    }

    pub(crate) fn update(&mut self) {
        let (params, grads) = self.model.params_and_grads();
        self.optimizer.step(params, grads, self.lr).expect("optimizer step");
        self.step += 1;
    }

    pub(crate) fn step(&mut self) -> f64 {
        let loss = self.forward_backward();
        self.update();
        loss
    }
}

/// Two replicas, each with its own model and optimizer (`replica(r)` builds replica `r` on
/// its share of the batch), stepping together: both run forward and backward, each puts its
/// gradients in its slot, then each adds the other's to its own (the same sum on both, so
/// both optimizer steps are identical). Returns the median seconds per global step (replica
/// 0's clock) and whether the params ended identical.
pub(crate) fn two_replicas<O: Optimizer<f32>>(
    replica: impl Fn(usize) -> Bench<O> + Sync,
    warmup: usize,
    rounds: usize,
) -> (f64, bool) {
    let barrier = Barrier::new(2);
    let slots = [Mutex::new(Vec::new()), Mutex::new(Vec::new())];
    let run = |r: usize| {
        let mut bench = replica(r);
        let mut times = Vec::new();
        for i in 0..warmup + rounds {
            // Also keeps a slot from being overwritten before the other replica has read it.
            barrier.wait();
            let t = Instant::now();
            black_box(bench.forward_backward());
            let mut slot = slots[r].lock().unwrap();
            slot.clear();
            slot.extend_from_slice(bench.model.grads());
            drop(slot);
            barrier.wait();
            let other = slots[1 - r].lock().unwrap();
            bench.model.grads_mut().iter_mut().zip(other.iter()).for_each(|(g, o)| *g += o);
            drop(other);
            bench.update();
            if i >= warmup {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        (median(&mut times), bench.model.params().to_vec())
    };
    let [(seconds, a), (_, b)] = std::thread::scope(|scope| {
        let handles = [scope.spawn(|| run(0)), scope.spawn(|| run(1))];
        handles.map(|h| h.join().expect("replica thread"))
    });
    (seconds, a == b)
}

/// The memory measurement's child: resident set before `build` makes the model and
/// optimizer, the kernel's high-water mark reset there, then four steps; prints `step_peak
/// peak_held saved_activations seconds` (the median of the last three steps' times).
pub(crate) fn memory_child<O: Optimizer<f32>>(build: impl FnOnce() -> Bench<O>) {
    let before = dp_mem::process_memory().expect("this system reports resident memory");
    assert!(
        dp_mem::reset_peak_rss(),
        "the kernel refused to reset the peak (/proc/self/clear_refs)"
    );
    let mut bench = build();
    black_box(bench.step());
    let mut times: Vec<f64> = (0..3)
        .map(|_| {
            let t = Instant::now();
            black_box(bench.step());
            t.elapsed().as_secs_f64()
        })
        .collect();
    let step_seconds = median(&mut times);
    let after = dp_mem::process_memory().expect("resident memory");
    println!(
        "{} {} {} {step_seconds}",
        after.peak_rss.saturating_sub(before.rss),
        bench.tracker.snapshot().peak_held,
        bench.model.memory().saved_activations
    );
}
