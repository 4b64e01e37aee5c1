//! The crate's example runs as a test, so it cannot rot unnoticed.

#[path = "../examples/all_reduce_threads.rs"]
mod all_reduce_threads;

#[test]
fn all_reduce_threads_runs() {
    all_reduce_threads::main().unwrap();
}
