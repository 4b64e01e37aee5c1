//! Whether a classifier is learning: after its first epoch, a loss still at the level of
//! guessing (`ln classes`, the cross-entropy of a uniform prediction) is worth a warning,
//! not an epoch after epoch of training in silence.

/// The step whose loss so far [`first_epoch_warning`] judges: the first epoch's last, or, where
/// an epoch is only a few large batches, the step by which the default schedule's warmup (2%
/// of the steps) is twice over: a loss that rises while the rate does is not yet a verdict.
pub(crate) fn judged_at(steps_per_epoch: u64, total_steps: u64) -> u64 {
    steps_per_epoch.max(total_steps / 25).min(total_steps)
}

/// The warning for a start of training whose last quarter's mean loss is within 5% of
/// guessing among `classes`, if it is.
pub(crate) fn first_epoch_warning(losses: &[f64], classes: usize) -> Option<String> {
    let quarter = &losses[losses.len() - losses.len().div_ceil(4)..];
    let mean = quarter.iter().sum::<f64>() / quarter.len().max(1) as f64;
    let chance = (classes as f64).ln();
    (classes >= 2 && !quarter.is_empty() && mean >= 0.95 * chance).then(|| {
        format!(
            "after {} steps the loss is {mean:.3}, the level of guessing among {classes} classes ({chance:.3}): the model is not learning; check the inputs' scale (normalize), the learning rate (lr) and the labels",
            losses.len()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_only_near_the_loss_of_guessing() {
        let guessing = vec![10f64.ln(); 40];
        assert!(first_epoch_warning(&guessing, 10).unwrap().contains("not learning"));
        let learning: Vec<f64> = (0..40).map(|i| 2.3 - 0.05 * f64::from(i)).collect();
        assert_eq!(first_epoch_warning(&learning, 10), None);
        assert_eq!(first_epoch_warning(&[], 10), None);
    }

    #[test]
    fn a_short_epoch_is_judged_after_the_warmup() {
        // The digits at batch 256 (234 steps an epoch, about 800 steps), and at 16384 (3).
        assert_eq!(judged_at(234, 936), 234);
        assert_eq!(judged_at(3, 600), 24);
        assert_eq!(judged_at(3, 10), 3);
        assert_eq!(judged_at(50, 20), 20);
    }
}
