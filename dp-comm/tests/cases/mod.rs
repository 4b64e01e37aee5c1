//! Test cases every backend runs: each function is one rank's side of a case, checks its own
//! results, and is run on every rank of a group by the backend's test file.

#![allow(dead_code, unreachable_pub)]

use dp_comm::{Communicator, Element, Error, ReduceOp};

/// Buffer lengths that cover empty, tiny, unaligned, block-crossing and multi-chunk cases.
pub const LENGTHS: [usize; 6] = [0, 1, 7, 1000, 4099, 100_003];

/// An input value, exactly representable in every element type and distinct per rank and
/// index, so that sums are exact and a misplaced element shows.
fn value(rank: usize, i: usize) -> u64 {
    ((i * 7 + rank * 13) % 61) as u64
}

pub trait FromSmall: Element {
    fn from_small(v: u64) -> Self;
}
macro_rules! from_small {
    ($($t:ty),*) => {$(impl FromSmall for $t { fn from_small(v: u64) -> Self { v as $t } })*};
}
from_small!(f32, f64, i32, i64, u32, u64, u8);

fn expected<T: FromSmall>(n: usize, i: usize, op: ReduceOp) -> T {
    let values = (0..n).map(|r| value(r, i));
    let v = match op {
        ReduceOp::Sum => values.sum(),
        ReduceOp::Avg => values.sum::<u64>() / n as u64,
        ReduceOp::Max => values.max().unwrap(),
        ReduceOp::Min => values.min().unwrap(),
    };
    T::from_small(v)
}

fn all_reduce_typed<T: FromSmall, C: Communicator>(comm: &mut C) {
    let (rank, n) = (comm.rank(), comm.world_size());
    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
        for len in LENGTHS {
            let mut buf: Vec<T> = (0..len).map(|i| T::from_small(value(rank, i))).collect();
            comm.all_reduce(&mut buf, op).unwrap();
            for (i, got) in buf.iter().enumerate() {
                let want = expected::<T>(n, i, op);
                // Float averages are sums divided by n: compare them against that.
                let want = if op == ReduceOp::Avg && T::DTYPE.to_string().starts_with('f') {
                    T::div_count(expected::<T>(n, i, ReduceOp::Sum), n)
                } else {
                    want
                };
                assert_eq!(*got, want, "{} {op:?} len {len} index {i} rank {rank}", T::DTYPE);
            }
        }
    }
}

/// All-reduce with every operation, element type and length.
pub fn all_reduce<C: Communicator>(comm: &mut C) {
    all_reduce_typed::<f32, C>(comm);
    all_reduce_typed::<f64, C>(comm);
    all_reduce_typed::<i32, C>(comm);
    all_reduce_typed::<u64, C>(comm);
}

/// Broadcast from every root.
pub fn broadcast<C: Communicator>(comm: &mut C) {
    let (rank, n) = (comm.rank(), comm.world_size());
    for root in 0..n {
        for len in LENGTHS {
            let mut buf: Vec<f32> = (0..len).map(|i| value(rank, i) as f32).collect();
            comm.broadcast(&mut buf, root).unwrap();
            let want: Vec<f32> = (0..len).map(|i| value(root, i) as f32).collect();
            assert_eq!(buf, want, "root {root} len {len} rank {rank}");
        }
    }
}

/// All-gather in rank order.
pub fn all_gather<C: Communicator>(comm: &mut C) {
    let (rank, n) = (comm.rank(), comm.world_size());
    for len in LENGTHS {
        let input: Vec<i64> = (0..len).map(|i| value(rank, i) as i64).collect();
        let mut output = vec![-1i64; n * len];
        comm.all_gather(&input, &mut output).unwrap();
        for r in 0..n {
            for i in 0..len {
                assert_eq!(output[r * len + i], value(r, i) as i64, "len {len} part {r} index {i}");
            }
        }
    }
}

/// Reduce-scatter: each rank gets its part of the reduction.
pub fn reduce_scatter<C: Communicator>(comm: &mut C) {
    let (rank, n) = (comm.rank(), comm.world_size());
    for op in [ReduceOp::Sum, ReduceOp::Max] {
        for len in LENGTHS {
            let input: Vec<f32> = (0..n * len).map(|i| value(rank, i) as f32).collect();
            let mut output = vec![-1.0f32; len];
            comm.reduce_scatter(&input, &mut output, op).unwrap();
            for (i, got) in output.iter().enumerate() {
                let want = expected::<f32>(n, rank * len + i, op);
                assert_eq!(*got, want, "{op:?} len {len} index {i}");
            }
        }
    }
}

/// Barriers interleaved with collectives.
pub fn barrier<C: Communicator>(comm: &mut C) {
    for _ in 0..10 {
        comm.barrier().unwrap();
    }
    let mut x = [comm.rank() as u32];
    comm.all_reduce(&mut x, ReduceOp::Max).unwrap();
    comm.barrier().unwrap();
    assert_eq!(x[0] as usize, comm.world_size() - 1);
}

/// Local size mistakes are errors before any work, and leave the group usable.
pub fn size_errors<C: Communicator>(comm: &mut C) {
    let n = comm.world_size();
    let input = vec![1.0f32; 10 * n];
    let mut wrong = vec![0.0f32; 10 * n + 1];
    assert_eq!(
        comm.all_gather(&input[..10], &mut wrong),
        Err(Error::SizeMismatch { op: "all_gather", expected: 10 * n, got: 10 * n + 1 })
    );
    let mut out = vec![0.0f32; 3];
    assert_eq!(
        comm.reduce_scatter(&input[..3 * n - 1], &mut out, ReduceOp::Sum),
        Err(Error::SizeMismatch { op: "reduce_scatter", expected: 3 * n, got: 3 * n - 1 })
    );
    let mut buf = [0.0f32; 4];
    assert!(matches!(
        comm.broadcast(&mut buf, n),
        Err(Error::InvalidRank { op: "broadcast", rank, world_size }) if rank == n && world_size == n
    ));
    // Still usable.
    let mut x = [1.0f32; 5];
    comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    assert_eq!(x, [n as f32; 5]);
}

/// Every case, in one sequence on one group.
pub fn all<C: Communicator>(comm: &mut C) {
    all_reduce(comm);
    broadcast(comm);
    all_gather(comm);
    reduce_scatter(comm);
    barrier(comm);
    size_errors(comm);
}
