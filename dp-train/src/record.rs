//! What replica 0 tells the coordinating thread, and how it learns that the coordinator has
//! written it down. A checkpoint is written only once every record before it is in the metrics
//! file, so a run killed between the two never resumes past a line it lost.

use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use dp_mem::ByTag;

use crate::metrics::EvalMetrics;

/// Replica 0's report of one step, sent to the coordinating thread. Plain numbers, so sending
/// it allocates nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepSample {
    pub(crate) step: u64,
    pub(crate) epoch: u64,
    pub(crate) loss: f64,
    pub(crate) accuracy: Option<f64>,
    pub(crate) lr: f64,
    pub(crate) step_s: f64,
    pub(crate) data_wait_s: f64,
    pub(crate) comm_exposed_s: f64,
    pub(crate) memory: ByTag<u64>,
}

/// One message from replica 0. Plain numbers, so sending one allocates nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Step(StepSample),
    Eval(EvalMetrics),
    Checkpoint { step: u64 },
}

/// How far the coordinator has got through the events, shared with the replica sending them.
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    /// Events handled, and the first record that could not be written.
    state: Mutex<(u64, Option<String>)>,
    changed: Condvar,
}

impl Recorded {
    /// The coordinator has handled one more event; `failure` says why its record could not be
    /// written.
    pub(crate) fn handled(&self, failure: Option<String>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 += 1;
        if state.1.is_none() {
            state.1 = failure;
        }
        self.changed.notify_all();
    }
}

/// Replica 0's end of the event channel.
#[derive(Debug)]
pub(crate) struct Events {
    sender: SyncSender<Event>,
    recorded: Arc<Recorded>,
    sent: u64,
}

impl Events {
    pub(crate) fn new(sender: SyncSender<Event>, recorded: Arc<Recorded>) -> Self {
        Events { sender, recorded, sent: 0 }
    }

    /// Sends `event`; a coordinator that has gone away only loses the progress display.
    pub(crate) fn send(&mut self, event: Event) {
        if self.sender.send(event).is_ok() {
            self.sent += 1;
        }
    }

    /// Waits until the coordinator has handled every event sent so far, for at most
    /// `timeout`. Fails, saying why, if a record could not be written or the wait timed out.
    pub(crate) fn wait_recorded(&self, timeout: Duration) -> Result<(), String> {
        let state = self.recorded.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (state, waited) = self
            .recorded
            .changed
            .wait_timeout_while(state, timeout, |(handled, failure)| {
                *handled < self.sent && failure.is_none()
            })
            .unwrap_or_else(PoisonError::into_inner);
        match &state.1 {
            Some(failure) => Err(failure.clone()),
            None if waited.timed_out() => {
                Err(format!("the metrics were not written within {timeout:?}"))
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_ends_when_every_event_is_handled_or_one_failed() {
        let recorded = Arc::new(Recorded::default());
        let (sender, receiver) = std::sync::mpsc::sync_channel(8);
        let mut events = Events::new(sender, Arc::clone(&recorded));
        assert_eq!(events.wait_recorded(Duration::from_millis(1)), Ok(()));
        events.send(Event::Checkpoint { step: 1 });
        events.send(Event::Checkpoint { step: 2 });
        let short = events.wait_recorded(Duration::from_millis(10));
        assert!(short.unwrap_err().contains("not written within"));
        std::thread::scope(|s| {
            let recorded = &recorded;
            s.spawn(move || {
                for _ in receiver.iter().take(2) {
                    recorded.handled(None);
                }
            });
            assert_eq!(events.wait_recorded(Duration::from_secs(30)), Ok(()));
        });
        recorded.handled(Some("disk full".into()));
        assert_eq!(events.wait_recorded(Duration::from_secs(30)), Err("disk full".into()));
    }
}
