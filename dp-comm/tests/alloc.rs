//! After warm-up, collectives and bucketed steps make no heap allocation on any thread: proven
//! with the counting allocator over the whole process (this file holds one test, so no other
//! test runs beside it).

use dp_comm::{BucketConfig, BucketReducer, Communicator, LocalGroup, ReduceOp};
use dp_mem::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

#[test]
fn steady_collectives_and_steps_allocate_nothing() {
    assert!(CountingAlloc::is_installed());
    let n = 3;
    let mut comms = LocalGroup::new(n).unwrap();
    let mut reducer_comms = LocalGroup::new(n).unwrap();
    let mut config = BucketConfig::default();
    config.bucket_bytes = 4096;
    let calls = std::sync::Mutex::new(Vec::new());
    let start = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        for _ in 0..n {
            let (mut comm, rc) = (comms.remove(0), reducer_comms.remove(0));
            let (calls, start) = (&calls, &start);
            s.spawn(move || {
                let mut buf = vec![1.0f32; 10_000];
                let mut out = vec![0.0f32; 10_000 * n];
                let mut reducer = BucketReducer::new(vec![0.0f32; 20_000], rc, config).unwrap();
                let mut round = |comm: &mut dp_comm::LocalComm| {
                    comm.all_reduce(&mut buf, ReduceOp::Avg).unwrap();
                    comm.broadcast(&mut buf, 1).unwrap();
                    comm.all_gather(&buf, &mut out).unwrap();
                    comm.reduce_scatter(&out, &mut buf, ReduceOp::Sum).unwrap();
                    comm.barrier().unwrap();
                    let mut step = reducer.begin().unwrap();
                    for b in (0..5).rev() {
                        step.bucket_mut(b).unwrap().fill(b as f32);
                        step.mark_ready(b).unwrap();
                    }
                    step.wait().unwrap();
                };
                round(&mut comm);
                start.wait();
                let before = CountingAlloc::process_stats().counts;
                for _ in 0..20 {
                    round(&mut comm);
                }
                comm.barrier().unwrap();
                let after = CountingAlloc::process_stats().counts;
                start.wait();
                calls.lock().unwrap().push(after.calls() - before.calls());
            });
        }
    });
    assert_eq!(*calls.lock().unwrap(), vec![0; n], "allocation calls in the steady state");
}
