//! Which settings a run turns on to fit a memory budget: every combination of the settings
//! that change memory is predicted, and the one expected to run fastest among those that fit
//! is taken.
//!
//! The settings, from the cheapest in speed to the dearest, and why:
//!
//! 1. **Shared parameters** (threads of a process read one parameter buffer and hold one
//!    optimizer state): free; each replica then updates only its shard of the parameters.
//! 2. **ZeRO-1** (each replica keeps and updates a shard of the optimizer state): one
//!    broadcast of the parameters per step, small next to the step's all-reduce.
//! 3. **No prefetch** in the input pipeline: batches made on the replica's thread when asked
//!    for, a few percent where decoding is cheap.
//! 4. **Smaller micro-batches**, accumulated to the same global batch: the products run on
//!    fewer rows, less efficiently, and each micro-batch pays its fixed costs again.
//! 5. **8-bit optimizer state**: the update dequantizes and requantizes each state value;
//!    1.00-1.08x the step time measured on the digits MLP and LeNet (`cargo xtask bench train
//!    --filter optim8`), and the state is no longer exact.
//! 6. **bf16 saved activations**: each kept value rounded in forward and widened in
//!    backward, and the step run in chunks of the batch where it can be; 1.01-1.12x the step
//!    time, and backward sees rounded activations (accuracy within 0.01 points on the digits
//!    MLP and LeNet, `cargo xtask bench train --filter bf16act`).
//! 7. **Recomputation**, selective first: backward runs the norms, activations and dropout
//!    between the products again (a few percent), or, full, each block's products too
//!    (1.17x gpt-mini's step measured, 1.23x ResNet-20's).
//! 8. **Fewer replicas** per process: each one given up is a core not computing.
//!
//! The estimates below follow this order; they rank plans, and are not a measurement. On the
//! GPU (`device = cuda`) the budget is the device's, and what changes the device's memory is
//! offered: recomputation, 8-bit optimizer state, bf16 saved activations, smaller
//! micro-batches, and over several GPUs ZeRO-1. Prefetch changes only host memory; shared
//! parameters and fewer replicas have no place with one replica per process.

use dp_model::SavedPrecision;

use crate::config::{Device, RecomputePolicy, TrainConfig};
use crate::plan::RunPlan;

/// Estimated step-time factors of each setting (see the module docs).
const ZERO1: f64 = 1.02;
const NO_PREFETCH: f64 = 1.03;
const EIGHT_BIT_STATE: f64 = 1.15;
const BF16_ACTIVATIONS: f64 = 1.1;
const PER_ACCUMULATION_DOUBLING: f64 = 1.06;
const SELECTIVE_RECOMPUTE: f64 = 1.04;
const FULL_RECOMPUTE: f64 = 1.25;

/// The estimated step-time factor of recomputing at `policy`.
fn recompute_cost(policy: RecomputePolicy) -> f64 {
    match policy {
        RecomputePolicy::Off => 1.0,
        RecomputePolicy::Selective => SELECTIVE_RECOMPUTE,
        RecomputePolicy::Full => FULL_RECOMPUTE,
    }
}

/// The settings that change a run's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) replicas: usize,
    pub(crate) grad_accum: usize,
    pub(crate) share_params: bool,
    pub(crate) zero_stage: u8,
    pub(crate) data_prefetch: usize,
    pub(crate) optimizer_bits: u8,
    pub(crate) activations: SavedPrecision,
    pub(crate) recompute: RecomputePolicy,
    /// Where the replicas compute (what the savers above can be turned on on).
    pub(crate) device: Device,
}

impl Settings {
    pub(crate) fn of(config: &TrainConfig) -> Self {
        Self {
            replicas: config.replicas,
            grad_accum: config.grad_accum,
            share_params: config.share_params,
            zero_stage: config.zero_stage,
            data_prefetch: config.data_prefetch,
            optimizer_bits: config.optimizer_bits,
            activations: config.activations,
            recompute: config.recompute,
            device: config.device,
        }
    }

    /// `plan` with these settings: its config, and its batching for the same global batch.
    pub(crate) fn apply(&self, plan: &RunPlan) -> RunPlan {
        let mut config = plan.config.clone();
        config.replicas = self.replicas;
        config.grad_accum = self.grad_accum;
        config.per_replica_batch = None;
        config.share_params = self.share_params;
        config.zero_stage = self.zero_stage;
        config.data_prefetch = self.data_prefetch;
        config.optimizer_bits = self.optimizer_bits;
        config.activations = self.activations;
        config.recompute = self.recompute;
        let mut batching = plan.batching;
        batching.replicas = self.replicas;
        batching.micro =
            config.global_batch / (self.replicas * batching.processes * self.grad_accum);
        RunPlan { config, batching, ..plan.clone() }
    }

    /// Every combination that only turns memory savers on from `self` (never off what the
    /// config turned on), for `global_batch` over `processes`; with `keep_replicas`, only
    /// those with `self`'s replicas.
    pub(crate) fn candidates(
        &self,
        global_batch: usize,
        processes: usize,
        keep_replicas: bool,
    ) -> Vec<Settings> {
        let fewest = if keep_replicas { self.replicas } else { 1 };
        // Bits of the savers this device has (the GPU: 8-bit state, bf16 saved activations,
        // and over several GPUs ZeRO-1); recomputation aside, whose levels every device has.
        let savers: u8 = match self.device {
            Device::Cuda if processes > 1 => 0b11_0010,
            Device::Cuda => 0b11_0000,
            Device::Cpu => 0b11_0111,
        };
        let levels = [RecomputePolicy::Off, RecomputePolicy::Selective, RecomputePolicy::Full];
        let recomputes = levels.into_iter().filter(|&level| level >= self.recompute);
        let mut all = Vec::new();
        for replicas in (fewest..=self.replicas).rev() {
            let mut accum = self.grad_accum;
            while global_batch.is_multiple_of(replicas * processes * accum) {
                let all_bits = (0..64u8).filter(|bits| bits & !savers == 0);
                let both = all_bits.flat_map(|b| recomputes.clone().map(move |r| (b, r)));
                for (bits, recompute) in both {
                    let on = |i: u8| bits & (1 << i) != 0;
                    let settings = Settings {
                        replicas,
                        grad_accum: accum,
                        share_params: self.share_params || on(0),
                        zero_stage: self.zero_stage.max(u8::from(on(1))),
                        data_prefetch: if on(2) { 0 } else { self.data_prefetch },
                        recompute,
                        optimizer_bits: if on(4) { 8 } else { self.optimizer_bits },
                        activations: if on(5) { SavedPrecision::Bf16 } else { self.activations },
                        device: self.device,
                    };
                    if !all.contains(&settings) {
                        all.push(settings);
                    }
                }
                accum *= 2;
            }
        }
        all
    }

    /// The estimated step time of these settings against `base`'s.
    pub(crate) fn slowdown(&self, base: &Settings) -> f64 {
        let turned = |on: bool, was: bool, factor: f64| if on && !was { factor } else { 1.0 };
        let bf16 = |s: &Settings| s.activations == SavedPrecision::Bf16;
        let doublings = (self.grad_accum as f64 / base.grad_accum as f64).log2();
        base.replicas as f64 / self.replicas as f64
            * PER_ACCUMULATION_DOUBLING.powf(doublings)
            * turned(self.zero_stage == 1, base.zero_stage == 1, ZERO1)
            * turned(self.data_prefetch == 0, base.data_prefetch == 0, NO_PREFETCH)
            * recompute_cost(self.recompute)
            / recompute_cost(base.recompute)
            * turned(self.optimizer_bits == 8, base.optimizer_bits == 8, EIGHT_BIT_STATE)
            * turned(bf16(self), bf16(base), BF16_ACTIVATIONS)
    }

    /// What these settings turn on against `base`, in words.
    pub(crate) fn changes(
        &self,
        base: &Settings,
        global_batch: usize,
        processes: usize,
    ) -> Vec<String> {
        let mut changes = Vec::new();
        if self.share_params && !base.share_params {
            changes.push("shared parameters (share_params)".to_string());
        }
        if self.zero_stage == 1 && base.zero_stage != 1 {
            changes.push("ZeRO-1 optimizer state shards (zero_stage = 1)".to_string());
        }
        if self.data_prefetch == 0 && base.data_prefetch != 0 {
            changes.push("no input prefetch (data_prefetch = 0)".to_string());
        }
        if self.optimizer_bits == 8 && base.optimizer_bits != 8 {
            changes.push("8-bit optimizer state (optimizer_bits = 8)".to_string());
        }
        if self.grad_accum != base.grad_accum {
            let micro = global_batch / (self.replicas * processes * self.grad_accum);
            changes.push(format!(
                "micro-batches of {micro} accumulated {} times (grad_accum = {})",
                self.grad_accum, self.grad_accum
            ));
        }
        if self.activations == SavedPrecision::Bf16 && base.activations != SavedPrecision::Bf16 {
            changes.push("bf16 saved activations (activations = \"bf16\")".to_string());
        }
        if self.recompute != base.recompute {
            let name = self.recompute.name();
            changes.push(format!("{name} activation recomputation (recompute = \"{name}\")"));
        }
        if self.replicas != base.replicas {
            changes.push(format!(
                "{} replicas per process instead of {}",
                self.replicas, base.replicas
            ));
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_is_offered_only_the_savers_it_has() {
        let cpu = Settings {
            replicas: 1,
            grad_accum: 1,
            share_params: false,
            zero_stage: 0,
            data_prefetch: 2,
            optimizer_bits: 32,
            activations: SavedPrecision::F32,
            recompute: RecomputePolicy::Off,
            device: Device::Cpu,
        };
        let gpu = Settings { device: Device::Cuda, ..cpu };
        let offered = |base: &Settings| base.candidates(64, 1, true);
        // Each on-off saver, each level of recomputation, and accumulation up to
        // micro-batches of one sample.
        assert_eq!(offered(&cpu).len(), 32 * 3 * 7);
        let on_gpu = offered(&gpu);
        assert_eq!(on_gpu.len(), 4 * 3 * 7);
        // Full recomputation is offered from selective, selective never from full.
        let selective = Settings { recompute: RecomputePolicy::Selective, ..cpu };
        assert_eq!(offered(&selective).len(), 32 * 2 * 7);
        let full = Settings { recompute: RecomputePolicy::Full, ..cpu };
        assert!(offered(&full).iter().all(|s| s.recompute == RecomputePolicy::Full));
        let slower = |s: RecomputePolicy| Settings { recompute: s, ..cpu }.slowdown(&cpu);
        assert!(1.0 < slower(RecomputePolicy::Selective));
        assert!(slower(RecomputePolicy::Selective) < slower(RecomputePolicy::Full));
        // The device's savers only: the prefetch, sharing and ZeRO stay as given.
        for s in on_gpu {
            let device_savers = Settings {
                recompute: RecomputePolicy::Off,
                optimizer_bits: 32,
                activations: SavedPrecision::F32,
                grad_accum: 1,
                ..s
            };
            assert_eq!(device_savers, gpu);
        }
    }
}
