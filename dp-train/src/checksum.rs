//! Whether replicas agree: a checksum of the parameters' bits, compared across replicas.

use dp_comm::Communicator;

use crate::error::{Error, Result};

/// Compares the replicas' parameter checksums at `step`; any difference is
/// [`Error::Diverged`] on every replica, which says they last agreed at step `agreed`. `all`
/// (one slot per replica) receives every replica's checksum.
pub(crate) fn check_in_sync(
    ctl: &mut impl Communicator,
    params: &[f32],
    (step, agreed): (u64, u64),
    all: &mut [u64],
) -> Result<()> {
    let mine = [dp_model::params_checksum(params)];
    ctl.all_gather(&mine, all)?;
    if all.iter().any(|&c| c != all[0]) {
        let differ = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
        return Err(Error::Diverged { step, checksums: all.to_vec(), differ, agreed });
    }
    Ok(())
}
