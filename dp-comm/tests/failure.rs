//! A rank that panics, drops its communicator, stalls or calls the wrong collective makes every
//! other rank's pending and later calls fail, in time, and nothing hangs.

use std::time::{Duration, Instant};

use dp_comm::{Communicator, Error, LocalComm, LocalConfig, LocalGroup, ReduceOp};

/// The timeout of the tests that must not meet it: far above anything a loaded machine adds,
/// so that a failure they check is found by the event, not by the clock.
const LONG: Duration = Duration::from_secs(10);

/// The timeout the stall test waits out, and the slack it allows past it: a loaded 2-core
/// machine may wake a waiting thread late by tens of milliseconds, rarely by hundreds.
const TIMEOUT: Duration = Duration::from_secs(1);
const SLACK: Duration = Duration::from_millis(600);

fn group(n: usize, timeout: Duration) -> Vec<LocalComm> {
    LocalGroup::with_config(n, LocalConfig::with_timeout(timeout)).unwrap()
}

/// What a healthy rank saw: the error of the first failing call, how long that call took, and
/// the error of the call after it.
#[derive(Debug)]
struct Seen {
    first: Error,
    took: Duration,
    next: Error,
}

/// Runs all-reduces until one fails.
fn reduce_until_error(comm: &mut LocalComm) -> Seen {
    let mut buf = vec![1.0f32; 1 << 16];
    loop {
        let start = Instant::now();
        if let Err(first) = comm.all_reduce(&mut buf, ReduceOp::Sum) {
            let took = start.elapsed();
            let next = comm.barrier().unwrap_err();
            return Seen { first, took, next };
        }
    }
}

/// Runs `n` ranks with `timeout`; rank `bad` runs `misbehave`, the others
/// `reduce_until_error`.
fn with_bad_rank(
    n: usize,
    bad: usize,
    timeout: Duration,
    misbehave: impl FnOnce(LocalComm) + Send,
) -> Vec<Seen> {
    let mut comms = group(n, timeout);
    let bad_comm = comms.remove(bad);
    std::thread::scope(|s| {
        let bad = s.spawn(move || misbehave(bad_comm));
        let good: Vec<_> =
            comms.into_iter().map(|mut c| s.spawn(move || reduce_until_error(&mut c))).collect();
        let seen = good.into_iter().map(|h| h.join().unwrap()).collect();
        let _ = bad.join();
        seen
    })
}

#[test]
fn a_rank_that_panics_is_reported_as_lost() {
    let seen = with_bad_rank(4, 2, LONG, |mut comm| {
        let mut buf = vec![1.0f32; 1 << 16];
        for _ in 0..5 {
            comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        panic!("rank 2 fails in the middle of training (this panic is part of the test)");
    });
    for s in seen {
        assert_eq!(s.first, Error::PeerLost { rank: 2 });
        assert_eq!(s.next, Error::PeerLost { rank: 2 });
        // Found when the rank is lost, not when the timeout runs out.
        assert!(s.took < LONG / 2, "took {:?}", s.took);
    }
}

#[test]
fn a_rank_that_drops_its_communicator_is_reported_as_lost() {
    let seen = with_bad_rank(3, 0, LONG, |mut comm| {
        comm.all_reduce(&mut vec![1.0f32; 1 << 16], ReduceOp::Sum).unwrap();
        drop(comm);
    });
    for s in seen {
        assert_eq!(s.first, Error::PeerLost { rank: 0 });
        assert_eq!(s.next, Error::PeerLost { rank: 0 });
    }
}

#[test]
fn a_rank_that_stalls_makes_the_others_time_out_on_time() {
    for n in [2, 4] {
        let late = n - 1;
        let seen = with_bad_rank(n, late, TIMEOUT, |mut comm| {
            let mut buf = vec![1.0f32; 1 << 16];
            comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
            // Stalls in "user code" while the others wait inside the next collective.
            std::thread::sleep(TIMEOUT * 2);
            // When it comes back, the group has failed and says why.
            let error = comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
            assert!(matches!(error, Error::Timeout { op: "all_reduce", .. }), "{error}");
        });
        for s in seen {
            match s.first {
                Error::Timeout { op: "all_reduce", waited, missing } => {
                    assert!(waited >= TIMEOUT);
                    assert_eq!(missing, Some(late));
                }
                other => panic!("expected a timeout, got {other}"),
            }
            assert!(s.took < TIMEOUT + SLACK, "n {n}: took {:?}", s.took);
            assert!(matches!(s.next, Error::Timeout { .. }));
        }
    }
}

#[test]
fn ranks_that_call_different_collectives_all_get_the_same_error() {
    let comms = group(3, LONG);
    let errors: Vec<Error> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    let mut buf = vec![0.0f32; if c.rank() == 1 { 11 } else { 10 }];
                    let error = c.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
                    assert!(c.is_poisoned());
                    assert!(c.barrier().is_err());
                    error
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errors {
        assert_eq!(
            *e,
            Error::Inconsistent {
                op: "all_reduce",
                rank: 1,
                detail: "it passed 11 elements instead of 10".into()
            }
        );
    }
    let comms = group(2, LONG);
    let errors: Vec<Error> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    let mut buf = [1.0f32; 4];
                    if c.rank() == 0 { c.broadcast(&mut buf, 0) } else { c.barrier() }.unwrap_err()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(errors.iter().all(|e| e.to_string().contains("it called barrier")), "{errors:?}");
}

#[test]
fn a_slow_but_arriving_rank_is_not_an_error() {
    let comms = group(2, TIMEOUT);
    std::thread::scope(|s| {
        for mut c in comms {
            s.spawn(move || {
                for step in 0..3 {
                    if c.rank() == 1 {
                        std::thread::sleep(TIMEOUT / 4);
                    }
                    let mut x = [step as f32];
                    c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                    assert_eq!(x[0], 2.0 * step as f32);
                }
            });
        }
    });
}
