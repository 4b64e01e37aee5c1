//! Failures injected into a replica, to test that a run stops cleanly and resumes exactly.

/// A failure to inject into one replica, to test that the run stops cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The replica that fails (its rank over all processes).
    pub rank: usize,
    /// The step (counted from 0) at whose start it fails.
    pub step: u64,
    /// How it fails.
    pub kind: FaultKind,
}

/// How an injected [`Fault`] fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The replica returns an error.
    Error,
    /// The replica's thread panics.
    Panic,
    /// The replica's whole process is killed (`SIGKILL`), as a crashed or preempted host is.
    Kill,
    /// The lowest bit of the replica's first parameter flips, as a memory fault or a
    /// non-deterministic kernel would change it, and the replica goes on.
    Desync,
}
