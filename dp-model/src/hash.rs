//! The hash behind spec fingerprints and per-tensor initialization seeds: the same on every
//! run, platform and Rust release, which `std`'s hashers do not promise.

/// FNV-1a of `bytes`.
pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}
