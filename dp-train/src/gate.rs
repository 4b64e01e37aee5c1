//! The start line: every replica is built (its memory, its data pipelines, the parameters
//! agreed) before the run directory exists, so that a setup error (a budget too small, bad
//! data) leaves nothing behind; replicas start training only when the coordinator, having
//! made the directory, hands it to them.

use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Where the replicas of one process wait for the word to start.
#[derive(Debug)]
pub(crate) struct Gate {
    state: Mutex<State>,
    changed: Condvar,
    replicas: usize,
}

#[derive(Debug, Default)]
struct State {
    ready: usize,
    failed: bool,
    /// The coordinator's word, once given: the run directory to start in, or `None`.
    go: Option<Option<PathBuf>>,
}

impl Gate {
    pub(crate) fn new(replicas: usize) -> Self {
        Gate { state: Mutex::default(), changed: Condvar::new(), replicas }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A replica's place at the gate. Dropped before [`Entry::ready`] (an error or a panic
    /// while building), it marks the start failed.
    pub(crate) fn enter(&self) -> Entry<'_> {
        Entry { gate: self, arrived: false }
    }

    /// The coordinator's hold on the gate: [`Opener::all_ready`], then [`Opener::open`].
    /// Dropped unopened (the coordinator failed), it tells the replicas not to start.
    pub(crate) fn opener(&self) -> Opener<'_> {
        Opener { gate: self, opened: false }
    }

    fn decide(&self, go: Option<PathBuf>) {
        self.lock().go.get_or_insert(go);
        self.changed.notify_all();
    }
}

/// A replica's place at the [`Gate`].
#[derive(Debug)]
pub(crate) struct Entry<'a> {
    gate: &'a Gate,
    arrived: bool,
}

impl Entry<'_> {
    /// This replica is built: waits for the coordinator's word, the run directory to start
    /// in, or `None` to go home.
    pub(crate) fn ready(mut self) -> Option<PathBuf> {
        self.arrived = true;
        let mut state = self.gate.lock();
        state.ready += 1;
        self.gate.changed.notify_all();
        loop {
            if let Some(go) = &state.go {
                return go.clone();
            }
            state = self.gate.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        if !self.arrived {
            self.gate.lock().failed = true;
            self.gate.changed.notify_all();
        }
    }
}

/// The coordinator's hold on the [`Gate`].
#[derive(Debug)]
pub(crate) struct Opener<'a> {
    gate: &'a Gate,
    opened: bool,
}

impl Opener<'_> {
    /// Waits until every replica is built (`true`) or one has failed (`false`).
    pub(crate) fn all_ready(&self) -> bool {
        let mut state = self.gate.lock();
        while !state.failed && state.ready < self.gate.replicas {
            state = self.gate.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        !state.failed
    }

    /// Lets the replicas start in `run_dir`, or, given `None`, sends them home.
    pub(crate) fn open(mut self, run_dir: Option<PathBuf>) {
        self.opened = true;
        self.gate.decide(run_dir);
    }
}

impl Drop for Opener<'_> {
    fn drop(&mut self) {
        if !self.opened {
            self.gate.decide(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_start_only_when_all_are_built_and_the_gate_opens() {
        for (fail, go) in [(false, true), (false, false), (true, false)] {
            let gate = Gate::new(3);
            let opener = gate.opener();
            let started: Vec<Option<Option<PathBuf>>> = std::thread::scope(|s| {
                let replicas: Vec<_> = (0..3)
                    .map(|i| {
                        let entry = gate.enter();
                        s.spawn(move || {
                            if fail && i == 1 {
                                drop(entry);
                                return None;
                            }
                            Some(entry.ready())
                        })
                    })
                    .collect();
                assert_eq!(opener.all_ready(), !fail);
                opener.open((go && !fail).then(|| PathBuf::from("runs/x")));
                replicas.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let want = Some((go && !fail).then(|| PathBuf::from("runs/x")));
            for (i, s) in started.iter().enumerate() {
                if !(fail && i == 1) {
                    assert_eq!(*s, want, "replica {i}");
                }
            }
        }
    }

    #[test]
    fn a_coordinator_that_fails_sends_the_replicas_home() {
        let gate = Gate::new(1);
        std::thread::scope(|s| {
            let entry = gate.enter();
            let replica = s.spawn(move || entry.ready());
            drop(gate.opener());
            assert_eq!(replica.join().unwrap(), None);
        });
    }
}
