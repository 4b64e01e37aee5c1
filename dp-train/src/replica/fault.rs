//! Failures injected into a replica, to test that a run stops cleanly and resumes exactly:
//! with the `testing` feature only, so that no run of the default build can be given one.

use std::path::Path;

use dp_model::Model;

use super::params::Params;
#[cfg(feature = "testing")]
use crate::error::Error;
use crate::error::Result;

/// A failure to inject into one replica, to test that the run stops cleanly.
#[cfg(feature = "testing")]
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
#[cfg(feature = "testing")]
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

/// Without the `testing` feature there is no fault to give: this type has no values.
#[cfg(not(feature = "testing"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {}

/// Fails as `fault` says when it is for replica `rank` at the start of `step`.
#[cfg(feature = "testing")]
pub(super) fn strike(
    fault: Option<Fault>,
    rank: usize,
    step: u64,
    run_dir: &Path,
    params: Params,
    model: &mut Model<f32>,
) -> Result<()> {
    let Some(fault) = fault.filter(|f| f.rank == rank && f.step == step) else { return Ok(()) };
    match fault.kind {
        FaultKind::Error => {
            return Err(Error::run(run_dir, format!("injected fault at step {step}")));
        }
        FaultKind::Panic => panic!("injected fault at step {step}"),
        // SAFETY: sending a signal to this process has no memory effects here.
        FaultKind::Kill => unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        },
        // Shared parameters cannot drift apart: only a replica's own can be flipped.
        FaultKind::Desync if params == Params::Shared => {}
        FaultKind::Desync => {
            if let Some(p) = model.params_mut().first_mut() {
                *p = f32::from_bits(p.to_bits() ^ 1);
            }
        }
    }
    Ok(())
}

#[cfg(not(feature = "testing"))]
pub(super) fn strike(
    fault: Option<Fault>,
    _rank: usize,
    _step: u64,
    _run_dir: &Path,
    _params: Params,
    _model: &mut Model<f32>,
) -> Result<()> {
    match fault {
        Some(never) => match never {},
        None => Ok(()),
    }
}
