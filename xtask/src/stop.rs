//! How a run is asked to stop: Ctrl-C (SIGINT), a scheduler's preemption (SIGTERM, what SLURM,
//! Kubernetes and mpirun send before they kill), or mpirun forwarding either to its ranks
//! (SIGUSR1). The run finishes its step, saves a checkpoint and exits; a second SIGINT or
//! SIGTERM ends it at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

/// The exit status of a run stopped by SIGTERM, with a checkpoint to resume from
/// (`EX_TEMPFAIL`: a temporary failure, worth trying again).
pub(crate) const PREEMPTED: u8 = 75;

/// The exit status of a run stopped by Ctrl-C, with a checkpoint to resume from.
pub(crate) const INTERRUPTED: u8 = 130;

/// The stop requests this process has received.
#[derive(Debug, Clone)]
pub(crate) struct Stop {
    requested: Arc<AtomicBool>,
    preempted: Arc<AtomicBool>,
    /// Print the first signal's message (see [`Stop::for_run`]).
    announce: Arc<AtomicBool>,
}

impl Stop {
    /// Listens for the stop signals on a thread of its own, which sets the flags and then
    /// calls `act(stop, signal, first)`: `first` for the first SIGINT or SIGTERM (or any
    /// SIGUSR1).
    pub(crate) fn listen(act: impl Fn(&Stop, i32, bool) + Send + 'static) -> Result<Stop> {
        let stop = Stop {
            requested: Arc::new(AtomicBool::new(false)),
            preempted: Arc::new(AtomicBool::new(false)),
            announce: Arc::new(AtomicBool::new(false)),
        };
        let mut signals =
            Signals::new([SIGINT, SIGTERM, SIGUSR1]).context("install the signal handlers")?;
        let flags = stop.clone();
        let seen = AtomicUsize::new(0);
        std::thread::Builder::new()
            .name("stop-signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    flags.requested.store(true, Ordering::Relaxed);
                    if signal == SIGTERM {
                        flags.preempted.store(true, Ordering::Relaxed);
                    }
                    let first = signal == SIGUSR1 || seen.fetch_add(1, Ordering::Relaxed) == 0;
                    act(&flags, signal, first);
                }
            })
            .with_context(|| format!("start the signal thread: {}", dp_mem::THREAD_REFUSED))?;
        Ok(stop)
    }

    /// Stops a run in this process: the first signal says what happens, a second SIGINT or
    /// SIGTERM exits now. Its message is printed once [`Stop::announce`] says so.
    pub(crate) fn for_run() -> Result<Stop> {
        Self::listen(move |stop, signal, first| match (first, signal) {
            (true, SIGUSR1) => {}
            (true, _) if !stop.announce.load(Ordering::Relaxed) => {}
            (true, SIGTERM) => eprintln!(
                "\npreempted (SIGTERM): stopping after this step with a checkpoint (SIGTERM again to quit now)"
            ),
            (true, _) => eprintln!(
                "\nstopping after this step (a checkpoint will be saved; Ctrl-C again to quit now)"
            ),
            (false, signal) => std::process::exit(128 + signal),
        })
    }

    /// Whether this process prints why it stops (the one whose output the user reads).
    pub(crate) fn announce(&self, yes: bool) {
        self.announce.store(yes, Ordering::Relaxed);
    }

    /// The flag a run polls (`RunOptions::stop`).
    pub(crate) fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.requested)
    }

    /// Whether a stop was asked for.
    pub(crate) fn requested(&self) -> bool {
        self.requested.load(Ordering::Relaxed)
    }

    /// Whether it was a preemption (SIGTERM).
    pub(crate) fn preempted(&self) -> bool {
        self.preempted.load(Ordering::Relaxed)
    }

    /// The exit status of a run that stopped as asked.
    pub(crate) fn status(&self) -> u8 {
        if self.preempted() { PREEMPTED } else { INTERRUPTED }
    }
}
