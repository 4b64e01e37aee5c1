//! Evaluation of a replica's model on its share of the evaluation data, and the best model
//! so far.

use dp_comm::Communicator;
use dp_model::{CheckpointWriter, LossTotals, Targets};

use super::Replica;
use super::check_labels;
use crate::error::{Error, Result};
use crate::input::Input;
use crate::metrics::EvalMetrics;
use crate::record::Event;
use crate::totals::Totals;

impl<C: Communicator> Replica<C> {
    /// One pass over the evaluation data, shared out among the replicas; returns the mean
    /// loss (`None` without evaluation data). A regression also measures its errors in the
    /// label's own units.
    pub(super) fn evaluate(&mut self, step: u64) -> Result<Option<f64>> {
        if self.eval.is_none() {
            return Ok(None);
        }
        self.sync_host()?;
        // Each replica's running statistics follow its own batches; everyone evaluates with
        // replica 0's, as DDP broadcasts them (under synchronized norms they agree already).
        if !self.model.buffers().is_empty() && !self.plan.config.sync_bn {
            self.ctl.broadcast(self.model.buffers_mut(), 0)?;
        }
        let Some((pipeline, labels)) = &mut self.eval else { return Ok(None) };
        let plan = &*self.plan;
        let mut totals = Totals::default();
        for _ in 0..pipeline.batches_per_epoch() {
            let batch = pipeline.next_batch()?;
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
            let loss = if plan.regression {
                // One forward gives both the loss the model trains on (the squared error of
                // standardized values) and the errors in the label's units.
                let (offset, scale) = plan.scalings.target().expect("a regression's");
                let outputs = x.forward_eval(&mut self.model)?;
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
                labels[..rows].iter_mut().zip(y.iter()).for_each(|(dst, &src)| *dst = src);
                check_labels(&labels[..rows], &batch.record_ids()[..n], plan.classes)?;
                // A negative label is a sample the loss ignores.
                let per_sample = plan.rows_per_sample();
                for &row in replaced {
                    labels[row * per_sample..(row + 1) * per_sample].fill(-1);
                }
                x.evaluate(&mut self.model, Targets::Classes(&labels[..rows]))?
            };
            totals.add(&loss);
        }
        totals.all_reduce(&mut self.ctl)?;
        let samples = totals.samples.max(1.0);
        let eval_loss = totals.mean_loss();
        if let Some(events) = &mut self.events {
            let regression = self.plan.regression;
            let eval = EvalMetrics {
                step,
                epoch: step / self.plan.batching.steps_per_epoch,
                eval_loss,
                eval_accuracy: (!regression).then(|| totals.accuracy()),
                eval_rmse: regression.then(|| (totals.squared_error / samples).sqrt()),
                eval_mae: regression.then(|| totals.absolute_error / samples),
                bits_per_token: self.plan.bits_per_token(eval_loss),
                bits_per_byte: self.plan.eval_bits_per_byte(eval_loss),
                skipped_records: totals.skipped as u64,
            };
            events.send(Event::Eval(eval));
        }
        Ok(Some(eval_loss))
    }

    /// Saves the parameters as the best model (replica 0): no optimizer state, as this
    /// checkpoint is for using the model, not for resuming.
    pub(super) fn save_best(&self, step: u64, eval_loss: f64) -> Result<()> {
        let extra = serde_json::json!({ "step": step, "eval_loss": eval_loss }).to_string();
        let path = self.run_dir.join(crate::run_dir::BEST);
        CheckpointWriter::new(&self.model).with_extra(extra).save(&path)?;
        Ok(())
    }
}
