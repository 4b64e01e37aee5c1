//! The replicas' check that they still hold the same parameters: a checksum of each
//! replica's, gathered and compared every `checksum_every` steps (and once when built).

use dp_comm::Communicator;

use super::cadence::Cadence;
use crate::checksum::check_in_sync;
use crate::error::Result;

pub(super) struct ChecksumCheck {
    cadence: Cadence,
    /// The step the replicas started at, checked then.
    start: u64,
    /// Every replica's checksum, at the latest check.
    checksums: Vec<u64>,
}

impl ChecksumCheck {
    /// Checks the parameters every replica starts with (a collective: once it completes on a
    /// replica, every replica of the run is built), then every `every` steps.
    pub(super) fn start(
        ctl: &mut impl Communicator,
        params: &[f32],
        every: u64,
        start: u64,
    ) -> Result<Self> {
        let mut checksums = vec![0u64; ctl.world_size()];
        check_in_sync(ctl, params, (start, start), &mut checksums)?;
        Ok(ChecksumCheck { cadence: Cadence::every(every), start, checksums })
    }

    pub(super) fn due(&self, done: u64) -> bool {
        self.cadence.due(done)
    }

    /// The check after `done` steps; an error names the replicas that differ and the last
    /// step they agreed at.
    pub(super) fn check(
        &mut self,
        ctl: &mut impl Communicator,
        params: &[f32],
        done: u64,
    ) -> Result<()> {
        // Checked at the start, and at every multiple of the period since.
        let agreed = done.saturating_sub(self.cadence.period()).max(self.start);
        check_in_sync(ctl, params, (done, agreed), &mut self.checksums)
    }
}
