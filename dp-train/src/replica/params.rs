//! Whose parameters a replica updates.

/// Whose parameters a replica updates, and how the others learn of the update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Params {
    /// Its own copy, all of it, with the whole optimizer state.
    Own,
    /// Its own copy, updating one shard of it with that shard's optimizer state (ZeRO stage
    /// 1); each replica then broadcasts its shard to the others.
    ZeroShard,
    /// The process's [`dp_model::SharedParams`], of which it updates one shard between the
    /// step's last collective and a barrier.
    Shared,
}
