//! Synchronized batch norm statistics: the collective a caller provides, and the guard that
//! lets a step fail cleanly when it does.

use crate::ops::batch_norm::SumAcross;

/// Sums a batch norm needs across replicas when statistics are synchronized (as PyTorch's
/// `SyncBatchNorm`): called with the same lengths, in the same order, on every replica.
pub trait NormSync: Send {
    /// Replaces `values` with their sum over all replicas, or says why it could not (a
    /// peer that died or timed out).
    fn all_reduce_sum(&mut self, values: &mut [f64]) -> Result<(), String>;
}

/// A [`NormSync`] that remembers its first failure: the norms of the rest of the step then
/// use their own replica's sums (no more collectives, which the failed group could not
/// finish), and the step reports the failure instead of its results.
pub(crate) struct NormSyncGuard {
    sync: Box<dyn NormSync>,
    pub(crate) failure: Option<String>,
}

impl NormSyncGuard {
    pub(crate) fn new(sync: Box<dyn NormSync>) -> Self {
        Self { sync, failure: None }
    }
}

impl SumAcross for NormSyncGuard {
    fn sum_across(&mut self, values: &mut [f64]) {
        if self.failure.is_none()
            && let Err(what) = self.sync.all_reduce_sum(values)
        {
            self.failure = Some(what);
        }
    }
}
