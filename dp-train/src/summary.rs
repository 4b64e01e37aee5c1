//! The end-of-run summary: how fast, how accurate, and where the memory went against the
//! least it could have been.

use std::collections::BTreeMap;
use std::fmt;

use dp_mem::{ByteSize, Tag};
use serde::{Deserialize, Serialize};

/// `summary.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The run directory's name.
    pub name: String,
    /// The model's name and parameter count.
    pub model: String,
    /// Parameters.
    pub params: u64,
    /// Replicas over all processes.
    pub replicas: usize,
    /// Processes, each running `replicas / processes` replica threads.
    pub processes: usize,
    /// How gradients travel: `threads` (shared memory in one process) or `mpi+threads`
    /// (shared memory within a process, MPI between processes).
    pub backend: String,
    /// Samples per optimizer step.
    pub global_batch: usize,
    /// Optimizer steps completed.
    pub steps: u64,
    /// Epochs completed (fractional).
    pub epochs: f64,
    /// Final evaluation accuracy, a fraction in [0, 1] (absent without eval data).
    pub eval_accuracy: Option<f64>,
    /// Final evaluation loss.
    pub eval_loss: Option<f64>,
    /// A regression's final root mean squared error, in the label's units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_rmse: Option<f64>,
    /// A regression's final mean absolute error, in the label's units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_mae: Option<f64>,
    /// A language model's final evaluation loss in bits per token (`eval_loss / ln 2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_bits_per_token: Option<f64>,
    /// A language model's final evaluation loss in bits per byte of the eval data's text
    /// (bits per token over its bytes per token; the same for byte-level data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_bits_per_byte: Option<f64>,
    /// Mean training loss of the last 10% of steps.
    pub train_loss: f64,
    /// A language model's `train_loss` in bits per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_bits_per_token: Option<f64>,
    /// Training samples per second over the steps (excluding evaluation and checkpoints); a
    /// language model's samples are windows of `context` tokens.
    pub samples_per_s: f64,
    /// A language model's tokens per sample (window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<usize>,
    /// A language model's training tokens per second: `samples_per_s x context`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Wall-clock seconds of the run, setup included.
    pub wall_s: f64,
    /// Share of step time replica 0 spent waiting for data.
    pub data_wait_share: f64,
    /// Share of step time replica 0 spent waiting for gradients after backward.
    pub comm_exposed_share: f64,
    /// Peak bytes by tag on replica 0 (`Data` is its pipeline's).
    pub peak_memory: BTreeMap<String, u64>,
    /// Sum of the peaks above.
    pub peak_total: u64,
    /// The least each tag needs on a replica for the run's step: parameters, gradients,
    /// optimizer state (its shard under ZeRO-1), one micro-batch's activations (fewer with
    /// recomputation), the gradient buffers of the chosen reduction, and the
    /// pipelines' working sets (the batches in flight and the blocks they are decoded from).
    pub minimum_memory: BTreeMap<String, u64>,
    /// Their sum.
    pub theoretical_min: u64,
    /// `peak_total / theoretical_min`.
    pub memory_ratio: f64,
    /// Peak device bytes by tag on replica 0, for a run on a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_memory: Option<BTreeMap<String, u64>>,
    /// What this process's replicas accounted at their peaks, all of them together.
    #[serde(default)]
    pub process_accounted: u64,
    /// The process's resident memory when the run started (the binary, its libraries, and
    /// anything the caller held), where the system reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_baseline_rss: Option<u64>,
    /// The most the process ever had resident (`VmHWM`), as the kernel counts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_peak_rss: Option<u64>,
    /// The process's peak resident memory as predicted before the run started (see
    /// `cargo xtask plan`), to hold against `process_peak_rss`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_peak_rss: Option<u64>,
    /// Optimizer state bytes per replica (1/replicas of the whole with ZeRO stage 1).
    pub opt_state_per_replica: u64,
    /// Allocation calls per steady step on a replica's thread (with the counting allocator).
    pub allocs_per_step: Option<f64>,
    /// Of those, the GEMM library's own (its packing buffers, allocated on each call).
    pub gemm_allocs_per_step: f64,
    /// Whether the run was stopped early (Ctrl-C).
    pub interrupted: bool,
    /// The step and evaluation loss of the best model (`best.ckpt`), when the run evaluates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<(u64, f64)>,
    /// Whether the run stopped because its evaluation loss stopped improving (`early_stop`).
    #[serde(default)]
    pub stopped_early: bool,
    /// The step at which the loss or the parameters stopped being finite, when the run
    /// diverged (the other figures then cover the steps before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverged_at: Option<u64>,
    /// Training records replaced because they could not be read (`skip_corrupt`: an
    /// unreadable block, an image that does not decode), over this process's replicas.
    #[serde(default)]
    pub skipped_records: u64,
    /// Evaluation records that could not be read (`skip_corrupt`) in the last evaluation,
    /// over all replicas: left out of its figures, not scored in another record's place.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_eval_records: u64,
    /// The fraction of weights pruned at the end of the run, when it prunes (`prune`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparsity: Option<f64>,
    /// What looked wrong without stopping the run (a loss at the level of guessing after the
    /// first epoch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_run(f)?;
        self.fmt_memory(f)?;
        self.fmt_notes(f)
    }
}

/// A fraction as a percentage, to a tenth.
fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

impl Summary {
    /// The run, its evaluation and its speed.
    fn fmt_run(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "run            {}", self.name)?;
        writeln!(f, "model          {} ({} parameters)", self.model, self.params)?;
        writeln!(
            f,
            "replicas       {} x batch {} (global {})",
            self.replicas,
            self.global_batch / self.replicas.max(1),
            self.global_batch
        )?;
        writeln!(
            f,
            "world          {} process{} x {} replica thread{} ({})",
            self.processes,
            if self.processes == 1 { "" } else { "es" },
            self.replicas / self.processes.max(1),
            if self.replicas / self.processes.max(1) == 1 { "" } else { "s" },
            self.backend
        )?;
        let ending = match (self.diverged_at, self.interrupted, self.stopped_early) {
            (Some(step), ..) => format!(", diverged at step {step}"),
            (None, true, _) => ", interrupted".into(),
            (None, false, true) => ", stopped early: the evaluation loss stopped improving".into(),
            (None, false, false) => String::new(),
        };
        writeln!(f, "steps          {} ({:.2} epochs){ending}", self.steps, self.epochs)?;
        // A language model's loss also in the bits its field is compared in.
        let bits = |per_token: Option<f64>, per_byte: Option<f64>| match (per_token, per_byte) {
            (Some(t), Some(b)) => format!(" ({t:.4} bits/token, {b:.4} bits/byte)"),
            (Some(t), None) => format!(" ({t:.4} bits/token)"),
            _ => String::new(),
        };
        match (self.eval_accuracy, self.eval_rmse, self.eval_mae, self.eval_loss) {
            (Some(acc), _, _, Some(loss)) if self.context.is_some() => writeln!(
                f,
                "eval           next-token accuracy {}  loss {loss:.4}{}",
                pct(acc),
                bits(self.eval_bits_per_token, self.eval_bits_per_byte)
            )?,
            (Some(acc), _, _, Some(loss)) => {
                writeln!(f, "eval           accuracy {}  loss {loss:.4}", pct(acc))?
            }
            (None, Some(rmse), Some(mae), Some(loss)) => {
                writeln!(f, "eval           rmse {rmse:.4}  mae {mae:.4}  loss {loss:.4}")?
            }
            _ => writeln!(f, "eval           (no eval data)")?,
        }
        if let Some((step, loss)) = self.best {
            writeln!(f, "best           step {step}, eval loss {loss:.4} (best.ckpt)")?;
        }
        writeln!(
            f,
            "train loss     {:.4}{} (last 10% of steps)",
            self.train_loss,
            bits(self.train_bits_per_token, None)
        )?;
        match (self.tokens_per_s, self.context) {
            (Some(tokens), Some(context)) => writeln!(
                f,
                "throughput     {tokens:.0} tokens/s ({:.1} windows/s of {context})  wall {:.1} s",
                self.samples_per_s, self.wall_s
            )?,
            _ => writeln!(
                f,
                "throughput     {:.0} samples/s  wall {:.1} s",
                self.samples_per_s, self.wall_s
            )?,
        }
        writeln!(
            f,
            "step time      data wait {}  exposed comm {}",
            pct(self.data_wait_share),
            pct(self.comm_exposed_share)
        )?;
        Ok(())
    }

    /// Memory by tag against the least the step needs, on the device, and the process's.
    fn fmt_memory(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "memory (replica 0)         peak      minimum  peak/minimum")?;
        let line = |f: &mut fmt::Formatter<'_>, name: &str, peak: u64, minimum: u64| {
            let ratio = match (peak, minimum) {
                (0, 0) => "-".to_string(),
                (_, 0) => "inf".to_string(),
                _ => format!("{:.2}x", peak as f64 / minimum as f64),
            };
            let (peak, minimum) = (ByteSize(peak).to_string(), ByteSize(minimum).to_string());
            writeln!(f, "  {name:<12} {peak:>12} {minimum:>12} {ratio:>13}")
        };
        for tag in Tag::ALL {
            if let Some(&peak) = self.peak_memory.get(tag.name()) {
                let minimum = self.minimum_memory.get(tag.name()).copied().unwrap_or(0);
                line(f, tag.name(), peak, minimum)?;
            }
        }
        line(f, "total", self.peak_total, self.theoretical_min)?;
        if let Some(device) = &self.device_memory {
            let tags: Vec<String> = (Tag::ALL.iter())
                .filter_map(|tag| Some((tag, *device.get(tag.name())?)))
                .filter(|&(_, bytes)| bytes > 0)
                .map(|(tag, bytes)| format!("{} {}", tag.name(), ByteSize(bytes)))
                .collect();
            let total = ByteSize(device.values().sum());
            writeln!(f, "device memory  {total} at peak: {}", tags.join(", "))?;
        }
        if let (Some(baseline), Some(peak)) = (self.process_baseline_rss, self.process_peak_rss) {
            let expected = self.process_accounted + baseline;
            writeln!(
                f,
                "process        peak RSS {} against {} accounted + {} at start ({:.2}x)",
                ByteSize(peak),
                ByteSize(self.process_accounted),
                ByteSize(baseline),
                peak as f64 / expected.max(1) as f64
            )?;
            if let Some(predicted) = self.predicted_peak_rss {
                writeln!(
                    f,
                    "               predicted before the run: {} ({:.2}x measured)",
                    ByteSize(predicted),
                    predicted as f64 / peak.max(1) as f64
                )?;
            }
        }
        Ok(())
    }

    /// What was skipped, pruned or looked wrong, and the allocations per step.
    fn fmt_notes(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.skipped_records > 0 {
            writeln!(
                f,
                "skipped        {} unreadable training records, each replaced by the next readable one",
                self.skipped_records
            )?;
        }
        if self.skipped_eval_records > 0 {
            writeln!(
                f,
                "skipped        {} unreadable evaluation records, left out of the evaluation",
                self.skipped_eval_records
            )?;
        }
        if let Some(sparsity) = self.sparsity {
            writeln!(f, "pruned         {} of the weights", pct(sparsity))?;
        }
        for warning in &self.warnings {
            writeln!(f, "warning        {warning}")?;
        }
        if let Some(allocs) = self.allocs_per_step {
            writeln!(
                f,
                "allocations    {allocs:.1} per step ({:.1} GEMM packing buffers, {:.1} from the workspace)",
                self.gemm_allocs_per_step,
                allocs - self.gemm_allocs_per_step
            )?;
        }
        Ok(())
    }
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_language_models_summary_counts_tokens_and_bits() {
        let records = Summary {
            eval_accuracy: Some(0.5),
            eval_loss: Some(1.0),
            samples_per_s: 100.0,
            ..Summary::default()
        };
        let text = records.to_string();
        assert!(text.contains("eval           accuracy 50.0%  loss 1.0000\n"), "{text}");
        assert!(text.contains("100 samples/s") && !text.contains("bits"), "{text}");
        let lm = Summary {
            context: Some(256),
            tokens_per_s: Some(25_600.0),
            eval_bits_per_token: Some(1.5),
            eval_bits_per_byte: Some(0.5),
            train_loss: 2.0,
            train_bits_per_token: Some(2.5),
            ..records
        };
        let text = lm.to_string();
        assert!(
            text.contains(
                "next-token accuracy 50.0%  loss 1.0000 (1.5000 bits/token, 0.5000 bits/byte)"
            ),
            "{text}"
        );
        assert!(text.contains("train loss     2.0000 (2.5000 bits/token)"), "{text}");
        assert!(text.contains("25600 tokens/s (100.0 windows/s of 256)"), "{text}");
    }
}
