//! The batch makers: worker threads that claim batch numbers, make them and hand them in, and
//! the steps each maker (a worker, the consumer helping, or the consumer alone) runs.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::batch::Batch;
use super::producer::{Producer, Shared};
use super::queue::Queue;
use crate::error::{Error, Result};

/// Makes batch `sequence`, turning a panic (a transform's, say) into an error with its message.
pub(super) fn make(producer: &mut Producer, sequence: u64) -> Result<Batch> {
    catch_unwind(AssertUnwindSafe(|| producer.make(sequence))).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic".into());
        Err(Error::Stopped(format!("making batch {sequence} panicked: {message}")))
    })
}

/// Makes batch `sequence` and hands it in, then drops the blocks that no batch still to be
/// made needs, and decodes a share of the next window.
pub(super) fn make_and_hand_in(producer: &mut Producer, queue: &Queue, sequence: u64) {
    let oldest = queue.hand_in(sequence, make(producer, sequence));
    producer.release_before_batch(oldest);
    read_ahead_share(producer);
}

/// Decodes the next window's share of blocks after a batch of this one. The next window is
/// decoded a share per batch while this one is batched, not all at once when it is needed:
/// where every core is busy (training), a worker gets only short turns, and a burst of
/// decoding at a window's start would hold up its rank while the other ranks wait for it.
pub(super) fn read_ahead_share(producer: &mut Producer) {
    for _ in 0..producer.ahead_share() {
        // A block whose decoding panics is left missing, for the batch that needs it to meet
        // the panic and report it.
        if !catch_unwind(AssertUnwindSafe(|| producer.read_ahead())).unwrap_or(false) {
            break;
        }
    }
}

/// Starts the worker threads: each claims batch numbers from the queue, makes them and hands
/// them in, until the queue closes.
pub(super) fn spawn(shared: &Arc<Shared>, queue: &Arc<Queue>) -> Result<Vec<JoinHandle<()>>> {
    let mut workers = Vec::with_capacity(shared.config.workers);
    for id in 0..shared.config.workers {
        let started = Producer::new(Arc::clone(shared)).and_then(|mut producer| {
            let queue = Arc::clone(queue);
            let work = move || {
                /// Tells the queue when the thread ends, however it ends.
                struct Leave(Arc<Queue>);
                impl Drop for Leave {
                    fn drop(&mut self) {
                        self.0.leave();
                    }
                }
                let leave = Leave(queue);
                while let Some((sequence, waited)) = leave.0.claim(id) {
                    producer.waited(waited);
                    make_and_hand_in(&mut producer, &leave.0, sequence);
                }
            };
            std::thread::Builder::new().name(format!("dp-data-worker-{id}")).spawn(work).map_err(
                |e| Error::Config {
                    field: "workers",
                    what: format!(
                        "cannot start a worker thread ({e}): {}; lower workers",
                        dp_mem::THREAD_REFUSED
                    ),
                },
            )
        });
        match started {
            Ok(worker) => workers.push(worker),
            Err(err) => {
                // The queue counts on every worker: those not started have left already.
                for _ in id..shared.config.workers {
                    queue.leave();
                }
                queue.close();
                workers.into_iter().for_each(|w| drop(w.join()));
                return Err(err);
            }
        }
    }
    Ok(workers)
}
