//! Evaluation of a replica's model on its share of the evaluation data: its batches, and
//! one pass over them shared out among the replicas.

use dp_comm::Communicator;
use dp_data::{Pipeline, Transform};
use dp_model::{CheckpointWriter, LossTotals, Model, Targets};

use super::targets::check_labels;
use crate::batches::Batches;
use crate::error::{Error, Result};
use crate::gpu::GpuStep;
use crate::input::Input;
use crate::metrics::EvalMetrics;
use crate::plan::{RunPlan, pipeline_config};
use crate::record::{Event, Events};
use crate::totals::Totals;

pub(super) struct Evaluator {
    batches: Batches,
    /// A batch's labels, with the records that stand in for unreadable ones ignored.
    labels: Vec<i64>,
}

impl Evaluator {
    /// Replica `rank`'s share of the run's evaluation data; `None` without any.
    pub(super) fn new(
        plan: &RunPlan,
        rank: usize,
        world: usize,
        scaling: Vec<Box<dyn Transform>>,
    ) -> Result<Option<Self>> {
        let Some(dir) = &plan.config.eval_data else { return Ok(None) };
        let config = pipeline_config(plan, rank, world, false);
        let batches = match plan.context {
            Some(context) => Batches::tokens(dir, &config, context, false, None)?,
            None => Batches::Records(Pipeline::new(dir, config, scaling)?),
        };
        let labels = vec![0i64; plan.batching.micro * plan.rows_per_sample()];
        Ok(Some(Evaluator { batches, labels }))
    }

    pub(super) fn batches(&self) -> &Batches {
        &self.batches
    }

    /// One pass over the evaluation data, shared out among the replicas of `ctl`, after `step`
    /// steps; returns the mean loss, and sends the metrics to `events`. A regression also
    /// measures its errors in the label's own units.
    /// With `gpu`, a classifier is evaluated there (`model` brought up to it before).
    pub(super) fn evaluate(
        &mut self,
        (model, mut gpu): (&mut Model<f32>, Option<&mut GpuStep>),
        ctl: &mut impl Communicator,
        plan: &RunPlan,
        events: Option<&mut Events>,
        step: u64,
    ) -> Result<f64> {
        // Each replica's running statistics follow its own batches; everyone evaluates with
        // replica 0's, as DDP broadcasts them (under synchronized norms they agree already).
        if !model.buffers().is_empty() && !plan.config.sync_bn {
            ctl.broadcast(model.buffers_mut(), 0)?;
            if let Some(gpu) = gpu.as_deref_mut() {
                gpu.reload(model)?;
            }
        }
        let mut totals = Totals::default();
        for _ in 0..self.batches.batches_per_epoch() {
            let batch = self.batches.next_batch()?;
            // Records repeated to fill the last batch count once only; a rank's last batch
            // may be nothing but repeats.
            let n = batch.len() - batch.padded();
            if n == 0 {
                continue;
            }
            // A record standing in for an unreadable one (`skip_corrupt`) is another record
            // of the set, scored in its own place: it is counted as skipped, not scored twice.
            let replaced = batch.replaced_rows();
            let replaced = &replaced[..replaced.partition_point(|&row| row < n)];
            totals.skipped += replaced.len() as f64;
            let x = Input::of(&batch, plan.input_len)
                .map_err(|what| {
                    Error::run(
                        plan.config.eval_data.as_deref().unwrap_or(&plan.config.train_data),
                        what,
                    )
                })?
                .first(n);
            let loss = if plan.task.is_regression() {
                // One forward gives both the loss the model trains on (the squared error of
                // standardized values) and the errors in the label's units.
                let (offset, scale) = plan.scalings.target().expect("a regression's");
                let outputs = x.forward_eval(model)?;
                let values = batch.targets().expect("a regression's batches have targets");
                let mut loss = LossTotals { samples: n, ..LossTotals::default() };
                for (row, (z, &t)) in outputs.iter().zip(values.iter()).enumerate() {
                    if replaced.binary_search(&row).is_ok() {
                        loss.samples -= 1;
                        continue;
                    }
                    let standardized = f64::from(z - (t - offset) / scale);
                    loss.loss_sum += standardized * standardized;
                    let error = f64::from(z * scale + offset - t);
                    totals.squared_error += error * error;
                    totals.absolute_error += error.abs();
                }
                loss
            } else {
                let (y, rows) = (batch.y(), n * plan.rows_per_sample());
                let labels = &mut self.labels;
                labels[..rows].iter_mut().zip(y.iter()).for_each(|(dst, &src)| *dst = src);
                check_labels(&labels[..rows], &batch.record_ids()[..n], plan.task.outputs())?;
                // A negative label is a sample the loss ignores.
                let per_sample = plan.rows_per_sample();
                for &row in replaced {
                    labels[row * per_sample..(row + 1) * per_sample].fill(-1);
                }
                let targets = Targets::Classes(&labels[..rows]);
                match (gpu.as_deref_mut(), x) {
                    (Some(gpu), Input::Dense(x)) => gpu.evaluate(x, targets)?,
                    (_, x) => x.evaluate(model, targets)?,
                }
            };
            totals.add(&loss);
        }
        totals.all_reduce(ctl)?;
        let eval_loss = totals.mean_loss();
        if let Some(events) = events {
            events.send(Event::Eval(metrics(plan, step, &totals)));
        }
        Ok(eval_loss)
    }
}

/// What an evaluation's `totals` (summed over the replicas) say after `step` steps.
fn metrics(plan: &RunPlan, step: u64, totals: &Totals) -> EvalMetrics {
    let samples = totals.samples.max(1.0);
    let (eval_loss, regression) = (totals.mean_loss(), plan.task.is_regression());
    EvalMetrics {
        step,
        epoch: step / plan.batching.steps_per_epoch,
        eval_loss,
        eval_accuracy: (!regression).then(|| totals.accuracy()),
        eval_rmse: regression.then(|| (totals.squared_error / samples).sqrt()),
        eval_mae: regression.then(|| totals.absolute_error / samples),
        bits_per_token: plan.bits_per_token(eval_loss),
        bits_per_byte: plan.eval_bits_per_byte(eval_loss),
        skipped_records: totals.skipped as u64,
    }
}

/// Saves the parameters as the best model (replica 0): no optimizer state, as this
/// checkpoint is for using the model, not for resuming.
pub(super) fn save_best(
    model: &Model<f32>,
    run_dir: &std::path::Path,
    step: u64,
    eval_loss: f64,
) -> Result<()> {
    let extra = serde_json::json!({ "step": step, "eval_loss": eval_loss }).to_string();
    CheckpointWriter::new(model).with_extra(extra).save(&run_dir.join(crate::run_dir::BEST))?;
    Ok(())
}
