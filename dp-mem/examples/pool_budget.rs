//! dp-mem alone: a pool under a memory budget. Buffers are counted by role, reused from the
//! pool's cache, and a request past the budget is an error that says what is in use and
//! which knob to turn, not an abort.
//!
//! `cargo run -p dp-mem --example pool_budget`

use dp_mem::{ByteSize, Pool, Tag, Tracker};

/// Runs the example (a test runs it too).
pub(crate) fn main() -> Result<(), dp_mem::Error> {
    let tracker = Tracker::new();
    tracker.set_budget(Some(64 << 20));
    let pool = Pool::new(&tracker);

    let params = pool.alloc_zeroed::<f32>(4 << 20, Tag::Param)?; // 16 MiB
    let grads = pool.alloc_zeroed::<f32>(4 << 20, Tag::Grad)?; // 16 MiB
    drop(grads);
    // Served from the cache: no new memory from the system.
    let grads = pool.alloc::<f32>(4 << 20, Tag::Grad)?;
    println!("hits {}, misses {}", pool.stats().hits, pool.stats().misses);

    let snapshot = tracker.snapshot();
    for tag in [Tag::Param, Tag::Grad] {
        println!("{tag:<6} {}", ByteSize(snapshot.tag(tag).current));
    }

    // 48 MiB more would pass the 64 MiB budget: a clean error.
    match pool.alloc::<f32>(12 << 20, Tag::Activation) {
        Ok(_) => unreachable!("the budget holds"),
        Err(error) => println!("refused: {error}"),
    }
    drop((params, grads));
    Ok(())
}
