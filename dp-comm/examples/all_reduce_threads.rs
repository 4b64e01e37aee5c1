//! dp-comm alone: four threads average their gradients with an all-reduce, the way
//! data-parallel replicas of one process do, and a barrier.
//!
//! `cargo run -p dp-comm --example all_reduce_threads`

use dp_comm::{Communicator, LocalGroup, ReduceOp};

/// Runs the example (a test runs it too).
pub(crate) fn main() -> Result<(), dp_comm::Error> {
    let comms = LocalGroup::new(4)?;
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                scope.spawn(move || -> Result<Vec<f32>, dp_comm::Error> {
                    // Each rank's "gradient": its rank in every element.
                    let mut grads = vec![comm.rank() as f32; 1 << 20];
                    comm.all_reduce(&mut grads, ReduceOp::Sum)?;
                    let world = comm.world_size() as f32;
                    grads.iter_mut().for_each(|g| *g /= world);
                    comm.barrier()?;
                    Ok(grads)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect::<Vec<_>>()
    });
    for (rank, grads) in results.into_iter().enumerate() {
        let grads = grads?;
        // The mean of 0, 1, 2, 3 everywhere, on every rank.
        assert!(grads.iter().all(|&g| g == 1.5));
        println!("rank {rank}: {} averaged gradients, all 1.5", grads.len());
    }
    Ok(())
}
