//! All-reduce on CPU threads under criterion (2 ranks; 4 KiB, 1 MiB and 64 MiB), then, with
//! `--bench`, a report of the ratio against memory-copy bandwidth measured in this same run,
//! and NCCL's host-staged all-reduce when a GPU is there.
//! `cargo bench -p dp-comm` (or `cargo xtask bench dp-comm`; `cargo xtask bench comm` for the
//! full table).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use dp_comm::measure::{BenchConfig, measure_all_reduce};
use dp_comm::{Communicator, LocalGroup, NcclConfig, NcclGroup, ReduceOp};

/// Times `iters` all-reduces of `bytes` on 2 fresh rank threads; the time of rank 0.
fn all_reduce_2(bytes: usize, iters: u64) -> Duration {
    let comms = LocalGroup::new(2).expect("group");
    let times: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    let mut buf = vec![1.0f32; bytes / 4];
                    comm.all_reduce(&mut buf, ReduceOp::Avg).expect("warm-up");
                    comm.barrier().expect("barrier");
                    let start = Instant::now();
                    for _ in 0..iters {
                        comm.all_reduce(black_box(&mut buf), ReduceOp::Avg).expect("all_reduce");
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    times[0]
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    {
        let mut group = criterion.benchmark_group("all_reduce_2_ranks");
        group.sample_size(10).measurement_time(Duration::from_secs(2));
        for bytes in [4 << 10, 1 << 20, 64 << 20] {
            group.throughput(Throughput::Bytes(bytes as u64));
            group.bench_function(format!("{} KiB", bytes >> 10), |b| {
                b.iter_custom(|iters| all_reduce_2(bytes, iters))
            });
        }
        group.finish();
    }
    criterion.final_summary();

    if std::env::args().any(|a| a == "--bench") {
        let mut config = BenchConfig::default();
        config.ranks = vec![2];
        config.sizes = vec![4 << 10, 1 << 20, 64 << 20];
        match measure_all_reduce(&config) {
            Ok(report) => println!("\n{report}"),
            Err(error) => println!("\nmeasurement failed: {error}"),
        }
        nccl_report();
    }
}

/// Host-staged NCCL all-reduce on one GPU (world size 1 is what one GPU allows): the time of
/// the staging copies and the NCCL call, against nothing to compare on this machine but itself.
fn nccl_report() {
    let result = NcclGroup::run(1, NcclConfig::default(), |comm| {
        let mut lines = Vec::new();
        for bytes in [4 << 10, 1 << 20, 64 << 20] {
            let mut buf = vec![1.0f32; bytes / 4];
            comm.all_reduce(&mut buf, ReduceOp::Sum).expect("warm-up");
            let iters = if bytes >= 1 << 20 { 10 } else { 200 };
            let start = Instant::now();
            for _ in 0..iters {
                comm.all_reduce(&mut buf, ReduceOp::Sum).expect("all_reduce");
            }
            let t = start.elapsed().as_secs_f64() / iters as f64;
            lines.push(format!(
                "nccl host-staged all_reduce {:>6} KiB, 1 rank: {:>9.1} us  {:>6.2} GB/s",
                bytes >> 10,
                t * 1e6,
                bytes as f64 / t / 1e9
            ));
        }
        lines
    });
    match result {
        Ok(lines) => lines.into_iter().flatten().for_each(|l| println!("{l}")),
        Err(reason) => println!("NCCL not measured: {reason}"),
    }
}
