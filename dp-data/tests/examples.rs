//! The crate's example runs as a test, so it cannot rot unnoticed.

#[path = "../examples/import_and_batch.rs"]
mod import_and_batch;

#[test]
fn import_and_batch_runs() {
    import_and_batch::main().unwrap();
}
