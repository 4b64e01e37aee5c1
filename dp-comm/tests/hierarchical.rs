//! The shared cases on replicas that are threads of several "processes", with a local group
//! standing in for the communicator among processes, so the composition is tested on every
//! machine; `tests/mpi.rs` runs the same cases with MPI between real processes.

mod cases;

use dp_comm::{Communicator, Error, Hierarchical, LocalComm, LocalGroup, ReduceOp};

/// Runs `body` on every rank of `processes x threads` and returns the results in rank order.
fn run<R: Send>(
    processes: usize,
    threads: usize,
    body: impl Fn(&mut Hierarchical<LocalComm>) -> R + Sync,
) -> Vec<R> {
    let mut leaders = LocalGroup::new(processes).unwrap().into_iter();
    let mut comms = Vec::new();
    for _ in 0..processes {
        let global = if processes > 1 { leaders.next() } else { None };
        comms.extend(Hierarchical::group(LocalGroup::new(threads).unwrap(), global));
    }
    let body = &body;
    let mut results: Vec<(usize, R)> = std::thread::scope(|s| {
        let handles: Vec<_> =
            comms.into_iter().map(|mut c| s.spawn(move || (c.rank(), body(&mut c)))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    results.sort_by_key(|(rank, _)| *rank);
    results.into_iter().map(|(_, r)| r).collect()
}

#[test]
fn shared_cases_on_processes_of_threads() {
    for (processes, threads) in [(1, 1), (1, 3), (2, 1), (2, 2), (3, 2), (2, 3)] {
        let ranks = run(processes, threads, |c| {
            cases::all(c);
            (c.rank(), c.world_size(), c.process(), c.local_rank())
        });
        let want: Vec<_> = (0..processes * threads)
            .map(|r| (r, processes * threads, r / threads, r % threads))
            .collect();
        assert_eq!(ranks, want, "{processes} x {threads}");
    }
}

#[test]
fn float_results_are_bitwise_the_same_on_every_rank() {
    let results = run(3, 2, |c| {
        let mut buf: Vec<f32> =
            (0..10_007).map(|i| ((i * 31 + c.rank() * 17) % 1000) as f32 * 1e-3 + 0.1).collect();
        c.all_reduce(&mut buf, ReduceOp::Avg).unwrap();
        buf.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
    });
    assert!(results.iter().all(|r| *r == results[0]));
}

#[test]
fn a_lost_process_is_an_error_on_every_rank() {
    // Process 1's thread 0 leaves: its thread 1 and process 0's threads must all fail.
    let results = run(2, 2, |c| {
        if c.rank() == 2 {
            return None;
        }
        let mut x = [1.0f32; 8];
        Some(c.all_reduce(&mut x, ReduceOp::Sum))
    });
    for (rank, result) in results.into_iter().enumerate() {
        if rank != 2 {
            let error = result.unwrap().unwrap_err();
            assert!(matches!(error, Error::PeerLost { .. }), "rank {rank}: {error}");
        }
    }
}
