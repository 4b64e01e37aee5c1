//! One training step (forward, backward, SGD with momentum) on 1,000,000-wide inputs at 0.1%
//! density, batch 256, of a linear model (1M -> 2) and a small MLP (1M -> 16 -> 2): the
//! sparse path (a SparseLinear first layer on a CSR batch) against the same data dense (a
//! Linear first layer on the densified batch, 1 GiB), under criterion; then the ratios of
//! the median step times and of the memory each path holds (model, optimizer and batch, as
//! the pool accounts it, and the process's peak RSS growth), measured in this same run.
//! Targets: the sparse path at least 5x faster and 10x smaller.
//!
//! `cargo bench -p dp-model --bench sparse_step` (or `cargo xtask bench model`); about 2 GiB
//! of memory for the dense MLP.

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use dp_mem::{Pool, Tracker};
use dp_model::{
    LayerSpec, Model, ModelOptions, ModelSpec, Optimizer, Sgd, SparseInput, StepOptions, Targets,
};
use ndarray::Array2;

#[path = "../tests/support/mod.rs"]
mod support;

const WIDTH: usize = 1_000_000;
const BATCH: usize = 256;
/// Non-zeros per row: 0.1% of the width.
const PER_ROW: usize = 1_000;

/// One batch in CSR, and its labels.
struct Batch {
    offsets: Vec<u32>,
    indices: Vec<u32>,
    values: Vec<f32>,
    labels: Vec<i64>,
}

impl Batch {
    fn new() -> Self {
        let mut rng = support::Rng::new(3);
        let (mut offsets, mut indices, mut values) = (vec![0u32], Vec::new(), Vec::new());
        for _ in 0..BATCH {
            let mut row: Vec<u32> =
                (0..PER_ROW).map(|_| (rng.uniform() * WIDTH as f64) as u32).collect();
            row.sort_unstable();
            row.dedup();
            values.extend(row.iter().map(|_| rng.uniform() as f32));
            indices.extend(row);
            offsets.push(indices.len() as u32);
        }
        let labels = (0..BATCH as i64).map(|i| i % 2).collect();
        Batch { offsets, indices, values, labels }
    }

    fn csr(&self) -> SparseInput<'_, f32> {
        SparseInput {
            offsets: &self.offsets,
            indices: &self.indices,
            values: &self.values,
            width: WIDTH,
        }
    }

    /// The batch densified, every page written (as a dense pipeline's batch buffer is).
    fn dense(&self) -> Array2<f32> {
        let mut x = Array2::<f32>::zeros((BATCH, WIDTH));
        x.fill(0.0);
        for r in 0..BATCH {
            for k in self.offsets[r] as usize..self.offsets[r + 1] as usize {
                x[[r, self.indices[k] as usize]] = self.values[k];
            }
        }
        x
    }
}

/// A model (sparse or dense first layer), its optimizer, the memory it holds, and its batch.
struct Path {
    model: Model<f32>,
    sgd: Sgd<f32>,
    tracker: Tracker,
    dense: Option<Array2<f32>>,
    step: u64,
}

impl Path {
    fn new(hidden: Option<usize>, sparse: bool, batch: &Batch) -> Self {
        let first =
            |out| if sparse { LayerSpec::SparseLinear { out } } else { LayerSpec::Linear { out } };
        let layers = match hidden {
            None => vec![first(2)],
            Some(h) => vec![first(h), LayerSpec::Relu, LayerSpec::Linear { out: 2 }],
        };
        let spec = ModelSpec { name: "wide".into(), input: vec![WIDTH], layers };
        let tracker = Tracker::new();
        let pool = Pool::new(&tracker);
        let model = Model::<f32>::new(&spec, &pool, ModelOptions::new(BATCH, 1)).expect("model");
        let sgd = Sgd::new(
            model.params().len(),
            dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
            &pool,
        )
        .expect("optimizer");
        let dense = (!sparse).then(|| batch.dense());
        Path { model, sgd, tracker, dense, step: 0 }
    }

    fn step(&mut self, batch: &Batch) -> f64 {
        let options = StepOptions { step: self.step, ..StepOptions::default() };
        let targets = Targets::Classes(&batch.labels);
        let loss = match &self.dense {
            Some(x) => self.model.forward_backward(x.view(), targets, &options),
            None => self.model.forward_backward_sparse(batch.csr(), targets, &options),
        }
        .expect("step");
        let (params, grads) = self.model.params_and_grads();
        self.sgd.step(params, grads, 1e-3).expect("SGD");
        self.step += 1;
        loss.loss_sum
    }

    /// Bytes of model, optimizer and batch: what the pool holds plus the batch's arrays.
    fn bytes(&self, batch: &Batch) -> u64 {
        let input = match &self.dense {
            Some(x) => x.len() * 4,
            None => (batch.offsets.len() + batch.indices.len() + batch.values.len()) * 4,
        };
        self.tracker.snapshot().peak_held + input as u64
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let mut criterion = Criterion::default().sample_size(10).configure_from_args();
    let batch = Batch::new();
    let mut report = Vec::new();
    for (name, hidden) in [("linear 1M-2", None), ("mlp 1M-16-2", Some(16))] {
        let mut measured = Vec::new();
        for sparse in [true, false] {
            let before = dp_mem::process_memory().map_or(0, |m| m.rss);
            dp_mem::reset_peak_rss();
            let mut path = Path::new(hidden, sparse, &batch);
            path.step(&batch);
            let rss = dp_mem::process_memory().map_or(0, |m| m.peak_rss.saturating_sub(before));
            let kind = if sparse { "sparse" } else { "dense" };
            let mut group = criterion.benchmark_group("sparse_step");
            group.throughput(Throughput::Elements(BATCH as u64));
            group.bench_function(format!("{name}/{kind}"), |b| {
                b.iter(|| black_box(path.step(&batch)))
            });
            group.finish();
            let seconds = median(
                (0..5)
                    .map(|_| {
                        let start = Instant::now();
                        black_box(path.step(&batch));
                        start.elapsed().as_secs_f64()
                    })
                    .collect(),
            );
            measured.push((seconds, path.bytes(&batch), rss));
        }
        let [(sparse_s, sparse_bytes, sparse_rss), (dense_s, dense_bytes, dense_rss)] =
            measured[..]
        else {
            unreachable!("two paths")
        };
        report.push(format!(
            "{name}: step {:.2} ms sparse vs {:.1} ms dense: {:.0}x faster (target 5x); memory {} vs {} MiB: {:.1}x less (target 10x); peak RSS growth {} vs {} MiB: {:.1}x",
            sparse_s * 1e3,
            dense_s * 1e3,
            dense_s / sparse_s,
            sparse_bytes >> 20,
            dense_bytes >> 20,
            dense_bytes as f64 / sparse_bytes as f64,
            sparse_rss >> 20,
            dense_rss >> 20,
            dense_rss as f64 / sparse_rss.max(1) as f64,
        ));
    }
    criterion.final_summary();
    for line in report {
        println!("{line}");
    }
}
