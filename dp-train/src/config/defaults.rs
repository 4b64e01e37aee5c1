//! What a run chooses where its config is silent and the data decides: the global batch and
//! epochs for the size of the data, and the sparse linear model's optimizer.

use super::OptimizerConfig;

/// The global batch chosen for `records` training records when none is set: 256, as for the
/// built-in digits; for a smaller dataset, the largest power of two that still makes 50 steps
/// an epoch, at least 16 (Keras' default batch is 32, scikit-learn's MLP takes 200 or the whole
/// set); always a multiple of `multiple` (replicas x grad_accum).
pub fn auto_global_batch(records: u64, multiple: usize) -> usize {
    let per_step = (records / 50).clamp(16, 256) as usize;
    let power = 1usize << per_step.ilog2();
    power.next_multiple_of(multiple.max(1))
}

/// The epochs chosen when none are set, for `steps_per_epoch`: enough for about 800 steps,
/// at least 4 (the built-in digits' 4 x 234 steps) and at most 200 (scikit-learn's MLP's
/// `max_iter`), so that a table of a few hundred rows trains as long as an image set does.
pub fn auto_epochs(steps_per_epoch: u64) -> u64 {
    800u64.div_ceil(steps_per_epoch.max(1)).clamp(4, 200)
}

/// The inverse regularization strength of a sparse input's default: scikit-learn's
/// `LogisticRegression` default, `C = 1`.
pub const SPARSE_C: f64 = 1.0;

/// The peak learning rate of a sparse input's default optimizer (Adam): ten times Adam's dense
/// default, since a rare word's weight gets a gradient from only a few batches an epoch.
pub const SPARSE_LR: f64 = 0.01;

/// The optimizer chosen for a sparse input with the default model, no optimizer given and no
/// learning rate or schedule set: Adam with the L2 penalty of scikit-learn's
/// `LogisticRegression(C = SPARSE_C)` on `records` training records and `classes` classes.
///
/// scikit-learn minimizes `C * sum(log_loss) + |w|^2 / 2`; divided by `C * records`, that is the
/// mean loss the trainer takes plus `|w|^2 / (2 C records)`, a coupled weight decay of
/// `1 / (C records)` for a softmax over 3 or more classes (scikit-learn's multinomial form).
/// Two classes have one weight vector there and two here, the logits' difference shared
/// between them: twice that decay puts the same penalty on the difference. (The bias is
/// decayed too, which scikit-learn's intercept is not: a 1/records nudge.)
pub fn sparse_optimizer(records: u64, classes: usize) -> OptimizerConfig {
    let per_vector = if classes == 2 { 2.0 } else { 1.0 };
    let OptimizerConfig::Adam(dp_model::AdamConfig { betas: (beta1, beta2), eps, .. }) =
        OptimizerConfig::preset("adam").expect("adam is a preset")
    else {
        unreachable!("the adam preset is Adam")
    };
    OptimizerConfig::Adam(dp_model::AdamConfig {
        betas: (beta1, beta2),
        eps,
        weight_decay: per_vector / (SPARSE_C * records.max(1) as f64),
        decoupled: false,
    })
}

/// The epochs chosen for a sparse input's default optimizer ([`sparse_optimizer`]), for
/// `steps_per_epoch`: enough for about 4,000 steps, at least 20 and at most 200, by when the
/// regularized loss is at its optimum as scikit-learn's lbfgs finds it (on the 10,000
/// documents of `scripts/sparse-vs-sklearn.py`, 52 epochs of 78 steps end at a test loss of
/// 0.626 and 70.00% accuracy where scikit-learn's optimum has 0.623 and 69.90%; 20 epochs are
/// still at 0.615).
pub fn sparse_auto_epochs(steps_per_epoch: u64) -> u64 {
    4_000u64.div_ceil(steps_per_epoch.max(1)).clamp(20, 200)
}

/// Replicas per available core beyond which a run is refused: replicas past the cores only
/// take turns on them, each with a whole model's memory. The same bound holds for the
/// processes a launcher starts on one host.
pub const MAX_REPLICAS_PER_CORE: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_and_epochs_adapt_to_the_size_of_the_data() {
        // The built-in digits: 60,000 records, 234 steps an epoch.
        assert_eq!((auto_global_batch(60_000, 2), auto_epochs(60_000 / 256)), (256, 4));
        // A table of 2,000 rows: 32 a step, 62 steps an epoch, 13 epochs.
        assert_eq!((auto_global_batch(2_000, 2), auto_epochs(2_000 / 32)), (32, 13));
        // 133 rows (a wine table's training split): 16 a step, 100 epochs of 8 steps.
        assert_eq!((auto_global_batch(133, 1), auto_epochs(133 / 16)), (16, 100));
        // Always a multiple of the replicas (and accumulation), never past 200 epochs.
        assert_eq!(auto_global_batch(1_000, 24), 24);
        assert_eq!(auto_epochs(1), 200);
    }
}
