//! Whether a classifier is learning: after its first epoch, a loss still at the level of
//! guessing (`ln classes`, the cross-entropy of a uniform prediction) is worth a warning,
//! not an epoch after epoch of training in silence.

/// The warning for a first epoch whose last quarter's mean loss is within 5% of guessing
/// among `classes`, if it is.
pub(crate) fn first_epoch_warning(losses: &[f64], classes: usize) -> Option<String> {
    let quarter = &losses[losses.len() - losses.len().div_ceil(4)..];
    let mean = quarter.iter().sum::<f64>() / quarter.len().max(1) as f64;
    let chance = (classes as f64).ln();
    (classes >= 2 && !quarter.is_empty() && mean >= 0.95 * chance).then(|| {
        format!(
            "after the first epoch the loss is {mean:.3}, the level of guessing among {classes} classes ({chance:.3}): the model is not learning; check the inputs' scale (normalize), the learning rate (lr) and the labels"
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
}
