//! The crate's example runs as a test, so it cannot rot unnoticed.

#[path = "../examples/train_on_arrays.rs"]
mod train_on_arrays;

#[test]
fn train_on_arrays_runs() {
    train_on_arrays::main().unwrap();
}
