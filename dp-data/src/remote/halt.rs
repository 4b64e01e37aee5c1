//! Halting a dataset's reads: a pipeline being dropped halts those of its dataset, so that its
//! workers, blocked on a server that is gone, end at once instead of after the retry window.
//! Requests fetching ahead are not halted: they serve every dataset of the process, and end
//! within their window anyway.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::{Either, select};

/// The halt of one dataset's reads.
#[derive(Debug, Default)]
pub(crate) struct Halt {
    halted: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Halt {
    /// Halts the reads under way and every later one.
    pub(crate) fn halt(&self) {
        self.halted.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_halted(&self) -> bool {
        self.halted.load(Ordering::SeqCst)
    }

    /// `future`'s output, or `None` once the reads are halted (then it is dropped).
    pub(crate) async fn unless_halted<T>(&self, future: impl Future<Output = T>) -> Option<T> {
        // Made before the flag is read, so that a halt in between still wakes it.
        let halted = std::pin::pin!(self.notify.notified());
        if self.is_halted() {
            return None;
        }
        match select(std::pin::pin!(future), halted).await {
            Either::Left((value, _)) => Some(value),
            Either::Right(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_halt_ends_a_read_under_way_and_refuses_later_ones() {
        let halt = std::sync::Arc::new(Halt::default());
        let runtime = crate::remote::runtime::runtime().unwrap();
        let halter = std::sync::Arc::clone(&halt);
        let started = std::time::Instant::now();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            halter.halt();
        });
        // A read that would take an hour.
        let read = async { tokio::time::sleep(std::time::Duration::from_secs(3600)).await };
        assert_eq!(runtime.block_on(halt.unless_halted(read)), None);
        assert!(started.elapsed().as_secs() < 60);
        assert_eq!(runtime.block_on(halt.unless_halted(async { 1 })), None);
    }
}
