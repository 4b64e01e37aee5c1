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
/// guessing among `classes` and has not fallen below the first quarter's by 5% of guessing
/// either, if it is. A loss near guessing that is falling is a slow start, not a failure:
/// small pictures of ten classes with random colours spend an epoch there on their way to 98%.
pub(crate) fn first_epoch_warning(losses: &[f64], classes: usize) -> Option<String> {
    let quarter = losses.len().div_ceil(4);
    let mean = |part: &[f64]| part.iter().sum::<f64>() / part.len().max(1) as f64;
    let (first, last) = (mean(&losses[..quarter]), mean(&losses[losses.len() - quarter..]));
    let chance = (classes as f64).ln();
    let falling = last < first - 0.05 * chance;
    (classes >= 2 && quarter > 0 && last >= 0.95 * chance && !falling).then(|| {
        let mean = last;
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
        // Still near guessing, but on its way down from above it: a slow start.
        let starting: Vec<f64> = (0..40).map(|i| 2.45 - 0.007 * f64::from(i)).collect();
        assert_eq!(first_epoch_warning(&starting, 10), None);
        // Flat, or rising from guessing (a rate too high): a warning.
        let rising: Vec<f64> = (0..40).map(|i| 2.2 + 0.005 * f64::from(i)).collect();
        assert!(first_epoch_warning(&rising, 10).is_some());
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
