//! The crate's example runs as a test, so it cannot rot unnoticed.

#[path = "../examples/pool_budget.rs"]
mod pool_budget;

#[test]
fn pool_budget_runs() {
    pool_budget::main().unwrap();
}
