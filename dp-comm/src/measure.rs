//! All-reduce throughput of the CPU backend measured against its reference in the same run:
//! the memory-copy bandwidth of the same number of threads. Used by the criterion benchmark and
//! by `cargo xtask bench comm`.
//!
//! An in-place all-reduce must read every rank's buffer once and write every rank's buffer
//! once, which is the traffic of `n` threads each copying `S` bytes; so the ideal time is
//! `t_ideal = n * S / copy_bandwidth(n threads)` and the efficiency is `t_ideal / t`.

use std::fmt;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::communicator::Communicator;
use crate::element::ReduceOp;
use crate::error::Result;
use crate::local::{LocalConfig, LocalGroup};

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BenchConfig {
    /// Buffer sizes in bytes (of `f32`s), per rank.
    pub sizes: Vec<usize>,
    /// World sizes.
    pub ranks: Vec<usize>,
    /// Bytes each thread copies in the memory-copy reference; larger than the last-level cache.
    pub copy_bytes: usize,
    /// Roughly how long to time each size (more repetitions for small sizes).
    pub time_per_size: Duration,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            sizes: (0..9).map(|i| 4096 << (2 * i)).collect(),
            ranks: vec![2, 4],
            copy_bytes: 128 << 20,
            time_per_size: Duration::from_millis(400),
        }
    }
}

/// One row of the table: one world size and buffer size.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BenchRow {
    /// World size.
    pub ranks: usize,
    /// Bytes per rank.
    pub bytes: usize,
    /// Median time of one all-reduce.
    pub time: Duration,
    /// Algorithm bandwidth `S / t`, bytes per second.
    pub algbw: f64,
    /// Bus bandwidth `algbw * 2 (n - 1) / n`, bytes per second (nccl-tests' definition).
    pub busbw: f64,
    /// `t_ideal / t` with `t_ideal = n * S / copy_bandwidth(n threads)`.
    pub efficiency: f64,
}

/// What [`measure_all_reduce`] found.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BenchReport {
    /// Memory-copy bandwidth (bytes copied per second, all threads together) per thread count.
    pub copy_bandwidth: Vec<(usize, f64)>,
    /// One row per world size and buffer size.
    pub rows: Vec<BenchRow>,
    /// Median latency of a 4 KiB all-reduce on 2 ranks.
    pub latency_4k: Duration,
    /// 99th percentile of the same.
    pub latency_4k_p99: Duration,
    /// Whether every rank's result was bitwise the same, and the same on a repeated run.
    pub bitwise_identical: bool,
}

impl BenchReport {
    /// The row for `ranks` and `bytes`, if measured.
    pub fn row(&self, ranks: usize, bytes: usize) -> Option<&BenchRow> {
        self.rows.iter().find(|r| r.ranks == ranks && r.bytes == bytes)
    }
}

impl BenchRow {
    /// The column titles of the rows' `Display`.
    pub const HEADER: &str = "ranks      size   time (us)  algbw GB/s  busbw GB/s efficiency";

    /// The row for an all-reduce of `bytes` on `ranks` ranks that took `time`, against a copy
    /// bandwidth of `copy_bandwidth` bytes per second over `ranks` threads.
    pub fn new(ranks: usize, bytes: usize, time: Duration, copy_bandwidth: f64) -> Self {
        let t = time.as_secs_f64();
        let algbw = bytes as f64 / t;
        BenchRow {
            ranks,
            bytes,
            time,
            algbw,
            busbw: algbw * 2.0 * (ranks - 1) as f64 / ranks as f64,
            efficiency: (ranks * bytes) as f64 / copy_bandwidth / t,
        }
    }
}

fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b => format!("{} KiB", b >> 10),
    }
}

impl fmt::Display for BenchRow {
    /// One line of the table, under [`BenchRow::HEADER`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>5} {:>9} {:>11.1} {:>11.2} {:>11.2} {:>10.2}",
            self.ranks,
            size(self.bytes),
            self.time.as_secs_f64() * 1e6,
            self.algbw / 1e9,
            self.busbw / 1e9,
            self.efficiency
        )
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "all_reduce, f32, in place, ReduceOp::Avg, CPU threads (LocalGroup)")?;
        for (threads, bw) in &self.copy_bandwidth {
            writeln!(f, "memcpy bandwidth, {threads} threads: {:>7.2} GB/s", bw / 1e9)?;
        }
        writeln!(f, "{}", BenchRow::HEADER)?;
        for r in &self.rows {
            writeln!(f, "{r}")?;
        }
        writeln!(
            f,
            "4 KiB latency, 2 ranks: median {:.2} us, p99 {:.2} us",
            self.latency_4k.as_secs_f64() * 1e6,
            self.latency_4k_p99.as_secs_f64() * 1e6
        )?;
        write!(
            f,
            "results bitwise identical across ranks and runs: {}",
            if self.bitwise_identical { "yes" } else { "NO" }
        )
    }
}

/// Measures memory-copy bandwidth of `threads` threads, each copying its own `bytes`-long
/// buffer (pre-faulted) `reps` times; returns the median of total bytes copied per second.
pub fn copy_bandwidth(threads: usize, bytes: usize, reps: usize) -> f64 {
    let threads = threads.max(1);
    let start = Barrier::new(threads);
    let times: Vec<Vec<Duration>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let src = vec![1u8; bytes];
                    let mut dst = vec![2u8; bytes];
                    let mut times = Vec::with_capacity(reps + 1);
                    for _ in 0..=reps {
                        start.wait();
                        let t = Instant::now();
                        dst.copy_from_slice(black_box(&src));
                        black_box(&mut dst);
                        start.wait();
                        times.push(t.elapsed());
                    }
                    times
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("copy thread")).collect()
    });
    // Each repetition ends when its slowest thread does; the first is a warm-up.
    let mut per_rep: Vec<f64> = (1..=reps)
        .map(|i| times.iter().map(|t| t[i]).max().unwrap_or_default().as_secs_f64())
        .collect();
    per_rep.sort_by(f64::total_cmp);
    (threads * bytes) as f64 / per_rep[per_rep.len() / 2]
}

/// A float input whose sums depend on the order of addition, so that a reduction in another
/// order shows in the bits.
fn noisy(rank: usize, i: usize) -> f32 {
    let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(rank as u32 * 40_503);
    (x as f32 / u32::MAX as f32 - 0.5) * 10f32.powi((x % 9) as i32 - 4)
}

fn fingerprint(buf: &[f32]) -> u64 {
    buf.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(x.to_bits())).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Times all-reduces of `bytes` on `ranks` threads: the median time of one all-reduce, and,
/// when `per_op`, every single operation's time on rank 0 (for latency percentiles).
fn time_all_reduce(
    ranks: usize,
    bytes: usize,
    budget: Duration,
    per_op: bool,
) -> Result<(Duration, Vec<Duration>)> {
    let comms = LocalGroup::with_config(ranks, LocalConfig::with_timeout(Duration::from_secs(60)))?;
    let results: Vec<Result<(Duration, Vec<Duration>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| s.spawn(move || time_all_reduce_on(&mut comm, bytes, budget, per_op)))
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let mut first = None;
    for r in results {
        let r = r?;
        first.get_or_insert(r);
    }
    Ok(first.unwrap_or_default())
}

/// One rank's side of timing in-place `f32` all-reduces (`Avg`) of `bytes` for about
/// `budget`, on any backend: the median time of one all-reduce over 9 batches, and, when
/// `per_op`, every single operation's time (for latency percentiles). Every rank of `comm`
/// calls it with the same arguments.
pub fn time_all_reduce_on<C: Communicator>(
    comm: &mut C,
    bytes: usize,
    budget: Duration,
    per_op: bool,
) -> Result<(Duration, Vec<Duration>)> {
    let len = bytes / 4;
    let mut buf: Vec<f32> = (0..len).map(|i| noisy(comm.rank(), i)).collect();
    // Warm up, and agree on a repetition count from rank 0's estimate.
    let t = Instant::now();
    comm.all_reduce(&mut buf, ReduceOp::Avg)?;
    comm.all_reduce(&mut buf, ReduceOp::Avg)?;
    let once = t.elapsed().as_secs_f64() / 2.0;
    let mut iters = [((budget.as_secs_f64() / once.max(1e-7)) as u64).clamp(5, 100_000)];
    comm.broadcast(&mut iters, 0)?;
    let mut ops = Vec::with_capacity(if per_op { iters[0] as usize } else { 0 });
    let mut samples = Vec::with_capacity(16);
    let batch = (iters[0] / 9).max(1);
    comm.barrier()?;
    let mut done = 0;
    while done < iters[0] {
        let t = Instant::now();
        for _ in 0..batch {
            let op = Instant::now();
            comm.all_reduce(&mut buf, ReduceOp::Avg)?;
            if per_op {
                ops.push(op.elapsed());
            }
        }
        samples.push(t.elapsed() / batch as u32);
        done += batch;
    }
    samples.sort();
    Ok((samples[samples.len() / 2], ops))
}

/// Whether an all-reduce of `len` noisy floats gives every rank the same bits, twice.
fn bitwise_identical(ranks: usize, len: usize) -> Result<bool> {
    let mut prints = Vec::new();
    for _run in 0..2 {
        let comms = LocalGroup::new(ranks)?;
        let run: Vec<Result<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|mut comm| {
                    s.spawn(move || {
                        let mut buf: Vec<f32> = (0..len).map(|i| noisy(comm.rank(), i)).collect();
                        comm.all_reduce(&mut buf, ReduceOp::Sum)?;
                        Ok(fingerprint(&buf))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
        });
        for p in run {
            prints.push(p?);
        }
    }
    Ok(prints.windows(2).all(|w| w[0] == w[1]))
}

/// Measures the table of [`BenchReport`]: memory-copy bandwidth per thread count, all-reduce
/// time per world size and buffer size, the 4 KiB latency on 2 ranks, and bitwise equality.
pub fn measure_all_reduce(config: &BenchConfig) -> Result<BenchReport> {
    let mut copy = Vec::new();
    for &n in &config.ranks {
        copy.push((n, copy_bandwidth(n, config.copy_bytes, 5)));
    }
    let mut rows = Vec::new();
    let mut identical = true;
    for &(n, bw) in &copy {
        for &bytes in &config.sizes {
            let (time, _) = time_all_reduce(n, bytes, config.time_per_size, false)?;
            rows.push(BenchRow::new(n, bytes, time, bw));
        }
        identical &= bitwise_identical(n, 3 << 20)?;
    }
    let (_, mut ops) = time_all_reduce(2, 4096, config.time_per_size, true)?;
    ops.sort();
    let pick = |q: f64| ops.get(((ops.len() as f64 * q) as usize).min(ops.len().saturating_sub(1)));
    Ok(BenchReport {
        copy_bandwidth: copy,
        rows,
        latency_4k: pick(0.5).copied().unwrap_or_default(),
        latency_4k_p99: pick(0.99).copied().unwrap_or_default(),
        bitwise_identical: identical,
    })
}
