//! The shared cases on the CPU backend with 1 to 5 ranks, and what only the CPU backend
//! promises: a fixed reduction order, so bitwise identical results.

mod cases;

use dp_comm::{Communicator, LocalComm, LocalGroup, ReduceOp};

/// Runs `body` on each rank of a fresh group of `n` threads and returns their results.
fn run<R: Send>(n: usize, body: impl Fn(&mut LocalComm) -> R + Sync) -> Vec<R> {
    let comms = LocalGroup::new(n).unwrap();
    let body = &body;
    std::thread::scope(|s| {
        let handles: Vec<_> =
            comms.into_iter().map(|mut c| s.spawn(move || body(&mut c))).collect::<Vec<_>>();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn shared_cases_on_1_to_5_ranks() {
    for n in 1..=5 {
        run(n, cases::all);
    }
}

/// A float input whose sums round differently in different orders.
fn noisy(rank: usize, i: usize) -> f32 {
    let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(rank as u32 * 40_503);
    (x as f32 / u32::MAX as f32 - 0.5) * 10f32.powi((x % 9) as i32 - 4)
}

#[test]
fn float_sums_are_bitwise_the_rank_order_sum_on_every_rank_and_run() {
    let len = 300_007;
    for n in [2, 3, 4] {
        let want: Vec<u32> = (0..len)
            .map(|i| (1..n).fold(noisy(0, i), |acc, r| acc + noisy(r, i)).to_bits())
            .collect();
        for _run in 0..3 {
            let results = run(n, |c| {
                let mut buf: Vec<f32> = (0..len).map(|i| noisy(c.rank(), i)).collect();
                c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                buf.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
            });
            for (rank, got) in results.iter().enumerate() {
                assert!(*got == want, "n {n} rank {rank} differs from the rank-order sum");
            }
        }
    }
}

#[test]
fn large_buffers_take_the_streaming_path_and_stay_exact() {
    // 6 MiB: above the size where peers' chunks are written with non-temporal stores.
    let len = 6 << 18;
    let sums = run(3, |c| {
        let mut buf: Vec<f64> = (0..len).map(|i| (i % 1000) as f64 + c.rank() as f64).collect();
        c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        let mut b = vec![c.rank() as u32; len];
        c.broadcast(&mut b, 2).unwrap();
        let mut g = vec![0u8; 3 * len];
        c.all_gather(&vec![c.rank() as u8; len], &mut g).unwrap();
        (0..len).all(|i| buf[i] == 3.0 * (i % 1000) as f64 + 3.0)
            && b.iter().all(|&x| x == 2)
            && g.chunks(len).enumerate().all(|(r, part)| part.iter().all(|&x| x as usize == r))
    });
    assert_eq!(sums, vec![true; 3]);
}

#[test]
fn many_small_collectives_in_a_row_stay_in_step() {
    let n = 4;
    let results = run(n, |c| {
        let mut total = 0u64;
        for step in 0..2000u64 {
            let mut x = [step + c.rank() as u64];
            c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            total += x[0];
            if step.is_multiple_of(100) {
                c.barrier().unwrap();
            }
        }
        total
    });
    let want: u64 = (0..2000u64).map(|s| 4 * s + 6).sum();
    assert_eq!(results, vec![want; n]);
}

#[test]
fn communicators_are_send_and_debug() {
    fn send<T: Send>() {}
    send::<LocalComm>();
    let comms = LocalGroup::new(2).unwrap();
    assert!(format!("{:?}", comms[0]).contains("world_size: 2"));
    assert!(LocalGroup::new(0).is_err());
}
