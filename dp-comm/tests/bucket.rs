//! The bucketed asynchronous all-reduce: results, the order of marks, misuse, an abandoned
//! step, and the error of compressed reduction.

use std::time::Duration;

use dp_comm::{
    BucketConfig, BucketOrder, BucketReducer, Compression, Error, LocalConfig, LocalGroup, ReduceOp,
};

/// Runs `body(rank, reducer)` on `n` ranks, each with a reducer over `len` zeros.
fn run<R: Send>(
    n: usize,
    len: usize,
    config: BucketConfig,
    body: impl Fn(usize, &mut BucketReducer<Vec<f32>>) -> R + Sync,
) -> Vec<R> {
    let comms =
        LocalGroup::with_config(n, LocalConfig::with_timeout(Duration::from_secs(5))).unwrap();
    let body = &body;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let rank = dp_comm::Communicator::rank(&comm);
                    let mut reducer = BucketReducer::new(vec![0.0f32; len], comm, config).unwrap();
                    body(rank, &mut reducer)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn grad(rank: usize, step: usize, i: usize) -> f32 {
    ((i * 3 + rank * 5 + step * 7) % 17) as f32
}

fn config(bucket_bytes: usize) -> BucketConfig {
    let mut c = BucketConfig::default();
    c.bucket_bytes = bucket_bytes;
    c
}

#[test]
fn buckets_marked_as_backward_goes_are_averaged() {
    let (n, len) = (3, 1003);
    let results = run(n, len, config(400), |rank, reducer| {
        assert_eq!(reducer.buckets(), 11);
        assert_eq!(reducer.bucket_range(10), Some(1000..1003));
        for step in 0..4 {
            let mut s = reducer.begin().unwrap();
            // Backward: the last layers first, marking each bucket as soon as it is written.
            for b in (0..11).rev() {
                let range = 100 * b..(100 * b + 100).min(len);
                let start = range.start;
                for (j, g) in s.slice_mut(range).unwrap().iter_mut().enumerate() {
                    *g = grad(rank, step, start + j);
                }
                s.mark_ready(b).unwrap();
            }
            s.wait().unwrap();
            for (i, g) in reducer.buffer().iter().enumerate() {
                let want = (0..n).map(|r| grad(r, step, i)).sum::<f32>() / n as f32;
                assert_eq!(*g, want, "step {step} index {i}");
            }
        }
        reducer.buffer().to_vec()
    });
    assert!(results.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn marks_in_any_order_reduce_in_the_fixed_order() {
    for order in [BucketOrder::LastFirst, BucketOrder::FirstFirst] {
        let mut c = config(64);
        c.order = order;
        c.op = ReduceOp::Sum;
        run(2, 160, c, |rank, reducer| {
            let mut s = reducer.begin().unwrap();
            // Each rank marks in its own order; the reduction order is the same on both.
            let marks: Vec<usize> =
                if rank == 0 { (0..10).collect() } else { vec![3, 9, 0, 5, 1, 8, 2, 7, 4, 6] };
            for b in marks {
                s.bucket_mut(b).unwrap().fill((b + rank) as f32);
                s.mark_ready(b).unwrap();
            }
            // The communication thread reduces without being waited for.
            while s.reduced() < 10 {
                std::thread::yield_now();
            }
            s.wait().unwrap();
            for (i, g) in reducer.buffer().iter().enumerate() {
                assert_eq!(*g, (2 * (i / 16) + 1) as f32);
            }
        });
    }
}

#[test]
fn misuse_is_an_error_not_a_race() {
    run(2, 100, config(100), |_, reducer| {
        let mut s = reducer.begin().unwrap();
        s.mark_ready(1).unwrap();
        assert_eq!(
            s.mark_ready(1),
            Err(Error::Bucket { bucket: 1, what: "was marked ready twice" })
        );
        assert!(matches!(s.bucket_mut(1), Err(Error::Bucket { bucket: 1, .. })));
        assert!(matches!(s.slice_mut(20..30), Err(Error::Bucket { bucket: 1, .. })));
        assert!(matches!(s.mark_ready(4), Err(Error::Bucket { bucket: 4, .. })));
        assert!(matches!(s.slice_mut(90..101), Err(Error::SizeMismatch { .. })));
        s.slice_mut(0..25).unwrap().fill(1.0);
        s.wait().unwrap();
        assert!(reducer.buffer()[..25].iter().all(|&x| x == 1.0));
    });
    let mut c = config(100);
    c.op = ReduceOp::Max;
    c.compression = Compression::Bf16 { error_feedback: false };
    let comm = LocalGroup::new(1).unwrap().pop().unwrap();
    assert!(matches!(BucketReducer::new(vec![0.0f32; 10], comm, c), Err(Error::Config { .. })));
}

#[test]
fn an_abandoned_step_makes_the_peers_fail_instead_of_applying_half_a_step() {
    let errors = run(3, 300, config(400), |rank, reducer| {
        let mut s = reducer.begin().unwrap();
        s.mark_ready(2).unwrap();
        if rank == 1 {
            drop(s); // backward failed on this rank
            return reducer.begin().map(|_| ()).unwrap_err();
        }
        s.wait().unwrap_err()
    });
    assert_eq!(errors[0], Error::PeerLost { rank: 1 });
    assert_eq!(errors[2], Error::PeerLost { rank: 1 });
    assert!(matches!(errors[1], Error::Bucket { .. }));
}

/// Runs `steps` steps of the same per-rank gradient through a compressed reducer and returns,
/// per rank, the sum of the reduced results over the steps and the exact per-step mean.
fn compressed(compression: Compression, steps: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    let (n, len) = (3, 4000);
    let input = |rank: usize, i: usize| {
        let x = (i as u32).wrapping_mul(2_654_435_761) ^ (rank as u32).wrapping_mul(0x9e37_79b9);
        (x as f32 / u32::MAX as f32 - 0.4) * if i.is_multiple_of(100) { 10.0 } else { 1.0 }
    };
    let mut c = config(4000);
    c.compression = compression;
    run(n, len, c, |rank, reducer| {
        let mut total = vec![0.0f32; len];
        for _ in 0..steps {
            let mut s = reducer.begin().unwrap();
            for (i, g) in s.slice_mut(0..len).unwrap().iter_mut().enumerate() {
                *g = input(rank, i);
            }
            s.wait().unwrap();
            total.iter_mut().zip(reducer.buffer()).for_each(|(t, g)| *t += g);
        }
        let mean = (0..len).map(|i| (0..n).map(|r| input(r, i)).sum::<f32>() / n as f32).collect();
        (total, mean)
    })
}

#[test]
fn bf16_compression_error_is_within_bf16_rounding() {
    let results = compressed(Compression::Bf16 { error_feedback: false }, 1);
    assert!(results.windows(2).all(|w| w[0].0 == w[1].0), "ranks differ");
    let (got, want) = &results[0];
    for (g, w) in got.iter().zip(want) {
        // Each input is rounded with relative error at most 2^-9; inputs are at most 10.
        assert!((g - w).abs() <= 10.0 / 512.0, "{g} vs {w}");
    }
    let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max);
    assert!(worst > 0.0, "bf16 compression changed nothing: is it on?");
}

#[test]
fn int8_compression_error_is_within_half_a_step_and_feedback_stops_it_accumulating() {
    // One step: every rank's values are off by at most half its step, max|x| / 127 / 2.
    let results = compressed(Compression::Int8 { error_feedback: false }, 1);
    let (got, want) = &results[0];
    let bound = 10.0 / 127.0 / 2.0 + 1e-6;
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= bound, "{g} vs {w}");
    }
    // Twenty steps of the same gradient: without feedback the rounding error adds up step after
    // step; with it, what one step drops the next adds back, so the total stays within about
    // one step's error.
    let steps = 20;
    let total_error = |results: &[(Vec<f32>, Vec<f32>)]| {
        let (got, want) = &results[0];
        got.iter().zip(want).map(|(g, w)| (g - steps as f32 * w).abs()).fold(0.0, f32::max)
    };
    let plain = total_error(&compressed(Compression::Int8 { error_feedback: false }, steps));
    let feedback = total_error(&compressed(Compression::Int8 { error_feedback: true }, steps));
    assert!(feedback <= 2.0 * bound, "with feedback the total is off by {feedback}");
    assert!(plain > 5.0 * feedback, "without feedback {plain}, with {feedback}");
}

#[test]
fn scratch_bytes_reports_the_compression_buffers() {
    let comms = LocalGroup::new(2).unwrap();
    let mut reducers = Vec::new();
    for (compression, comm) in
        [Compression::None, Compression::Int8 { error_feedback: true }].into_iter().zip(comms)
    {
        let mut c = BucketConfig::default();
        c.bucket_bytes = 400; // 100 values per bucket
        c.compression = compression;
        reducers.push(BucketReducer::new(vec![0.0f32; 250], comm, c).unwrap());
    }
    assert_eq!(reducers[0].scratch_bytes(), 0);
    // Residual of 250 f32, then one int8 payload (scale + 100 values) out and one per rank in.
    assert_eq!(reducers[1].scratch_bytes(), 4 * 250 + (4 + 100) * 3);
}

/// A one-rank communicator whose all-reduce panics, to check the reducer does not hang.
struct PanickingComm;

impl dp_comm::Communicator for PanickingComm {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce<T: dp_comm::Element>(&mut self, _: &mut [T], _: ReduceOp) -> dp_comm::Result<()> {
        panic!("all-reduce exploded");
    }
    fn broadcast<T: dp_comm::Element>(&mut self, _: &mut [T], _: usize) -> dp_comm::Result<()> {
        Ok(())
    }
    fn all_gather<T: dp_comm::Element>(&mut self, _: &[T], _: &mut [T]) -> dp_comm::Result<()> {
        Ok(())
    }
    fn reduce_scatter<T: dp_comm::Element>(
        &mut self,
        _: &[T],
        _: &mut [T],
        _: ReduceOp,
    ) -> dp_comm::Result<()> {
        Ok(())
    }
    fn barrier(&mut self) -> dp_comm::Result<()> {
        Ok(())
    }
}

/// Runs `f` on a thread and fails the test if it has not finished within 10 s.
fn within_10s<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(Duration::from_secs(10)).expect("hung")
}

#[test]
fn a_panicking_communication_thread_is_an_error_not_a_hang() {
    let made = within_10s(|| {
        BucketReducer::spawn(
            vec![0f32; 8],
            BucketConfig::default(),
            || -> dp_comm::Result<PanickingComm> { panic!("no communicator today") },
        )
        .map(|_| ())
    });
    assert!(made.is_err());

    let waited = within_10s(|| {
        let mut reducer =
            BucketReducer::new(vec![0f32; 8], PanickingComm, BucketConfig::default()).unwrap();
        let step = reducer.begin().unwrap();
        step.wait()
    });
    let error = waited.unwrap_err();
    assert!(error.to_string().contains("panicked"), "{error}");
}

/// A buffer whose length can change under the reducer.
struct Shrinking(Vec<f32>, std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl AsRef<[f32]> for Shrinking {
    fn as_ref(&self) -> &[f32] {
        &self.0[..self.1.load(std::sync::atomic::Ordering::Relaxed)]
    }
}

impl AsMut<[f32]> for Shrinking {
    fn as_mut(&mut self) -> &mut [f32] {
        let len = self.1.load(std::sync::atomic::Ordering::Relaxed);
        &mut self.0[..len]
    }
}

#[test]
fn a_buffer_that_changes_length_is_refused() {
    let comm = LocalGroup::new(1).unwrap().pop().unwrap();
    let len = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(100));
    let buffer = Shrinking(vec![0.0; 100], std::sync::Arc::clone(&len));
    let mut reducer = BucketReducer::new(buffer, comm, BucketConfig::default()).unwrap();
    reducer.begin().unwrap().wait().unwrap();
    len.store(10, std::sync::atomic::Ordering::Relaxed);
    assert!(matches!(reducer.begin(), Err(Error::Config { field: "buffer", .. })));
}

#[test]
fn a_reduced_bucket_can_be_read_while_later_ones_are_reduced() {
    let mut c = config(400); // 100 values per bucket, 3 buckets
    c.order = BucketOrder::FirstFirst;
    let results = run(2, 300, c, |rank, reducer| {
        let mut s = reducer.begin().unwrap();
        s.bucket_mut(0).unwrap().fill(rank as f32 + 1.0);
        s.mark_ready(0).unwrap();
        // Bucket 1 is not marked yet: it would never be reduced.
        let unmarked = s.reduced_bucket(1).map(|_| ());
        let first: Vec<f32> = s.reduced_bucket(0).unwrap().to_vec();
        for b in 1..3 {
            s.bucket_mut(b).unwrap().fill(10.0 * (rank as f32 + 1.0));
            s.mark_ready(b).unwrap();
        }
        let last = s.reduced_bucket(2).unwrap()[0];
        s.wait().unwrap();
        (unmarked, first, last)
    });
    for (unmarked, first, last) in results {
        assert!(matches!(unmarked, Err(Error::Bucket { bucket: 1, .. })));
        assert!(first.iter().all(|&v| v == 1.5), "average of 1 and 2");
        assert_eq!(last, 15.0);
    }
}
