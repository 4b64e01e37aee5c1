//! Synchronized batch norm on GPUs: how a GPU model's batch norms sum their statistics over the
//! replicas, on the devices.

/// Sums a batch norm's statistics over the replicas where they lie, on the device (NCCL, for
/// `--sync-bn` on GPUs), between the model's kernels. A GPU model calls it twice per batch norm
/// and step (its moments in forward, its gradient sums in backward), in the same order on every
/// replica, then [`DeviceNormSync::finish`] once before it reads the step's results.
pub trait DeviceNormSync {
    /// Queues, after the model's work so far and before its later work, the replacement of the
    /// `len` `f64` values at device address `values` by their sum over the replicas.
    fn sum(&mut self, values: u64, len: usize) -> Result<(), String>;

    /// Waits for every sum queued; a peer that died or stalled is an error here, not a hang.
    fn finish(&mut self) -> Result<(), String>;
}
