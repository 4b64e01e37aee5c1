//! Whether replicas agree: a checksum of the parameters' bits, compared across replicas.

use dp_comm::Communicator;

use crate::error::{Error, Result};

/// A 64-bit checksum of the parameters' bits (FNV-1a over 32-bit words): replicas that agree
/// bit for bit have equal checksums.
pub(crate) fn checksum(params: &[f32]) -> u64 {
    params.iter().fold(0xcbf2_9ce4_8422_2325, |h, p| {
        (h ^ u64::from(p.to_bits())).wrapping_mul(0x100_0000_01b3)
    })
}

/// Compares the replicas' parameter checksums at `step`; any difference is
/// [`Error::Diverged`] on every replica, which says they last agreed at step `agreed`. `all`
/// (one slot per replica) receives every replica's checksum.
pub(crate) fn check_in_sync(
    ctl: &mut impl Communicator,
    params: &[f32],
    (step, agreed): (u64, u64),
    all: &mut [u64],
) -> Result<()> {
    let mine = [checksum(params)];
    ctl.all_gather(&mine, all)?;
    if all.iter().any(|&c| c != all[0]) {
        let differ = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
        return Err(Error::Diverged { step, checksums: all.to_vec(), differ, agreed });
    }
    Ok(())
}
