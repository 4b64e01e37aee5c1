//! A `memory_budget` is a promise about the process: a run whose measured peak resident
//! memory goes past it ends in an error naming the budget and the peak, with its checkpoint
//! and summary written, never as a success.
//!
//! The kernel's peak is the whole process's, so this binary holds this one test alone.

mod common;

use common::{TempDir, config, run_dir};
use dp_train::{
    ByteSize, Error, Observer, RunOptions, SavedRun, StepMetrics, TrainConfig, plan_memory, train,
};

/// Touches `bytes` of fresh memory once, at the first step, and lets it go: resident memory
/// the plan could not know of, as a leak or a library's buffer would be.
struct Spike {
    bytes: usize,
    done: bool,
}

impl Observer for Spike {
    fn step(&mut self, _: &StepMetrics) {
        if !self.done {
            self.done = true;
            let touched = vec![1u8; self.bytes];
            std::hint::black_box(&touched);
        }
    }
}

#[test]
fn a_run_past_its_memory_budget_ends_in_an_error_naming_budget_and_peak() {
    if dp_mem::process_memory().is_none() {
        eprintln!("skipped: this system does not report resident memory");
        return;
    }
    let base = TrainConfig { replicas: 1, eval_data: None, ..config(1, 4) };
    // Room for the plan, and far less than the spike.
    let predicted = plan_memory(&base, 1).unwrap().predicted_peak;
    // A plan keeps 8 MiB under its budget for what no prediction sees (mapped shard pages,
    // the allocator's arenas): 4 MiB over the config's prediction is not room enough as given.
    let tight =
        TrainConfig { memory_budget: Some(ByteSize(predicted + (4 << 20))), ..base.clone() };
    match plan_memory(&tight, 1) {
        Ok(plan) => {
            assert!(!plan.turned_on.is_empty(), "{plan}");
            assert!(plan.predicted_peak + (8 << 20) <= predicted + (4 << 20), "{plan}");
        }
        Err(error) => assert!(error.to_string().contains("memory_budget"), "{error}"),
    }
    let budget = predicted + (32 << 20);
    let limited = TrainConfig { memory_budget: Some(ByteSize(budget)), ..base };

    // Kept: the run's own peak, measured from its start, is within the budget.
    let out = TempDir::new("budget-kept");
    let summary = train(limited.clone(), &RunOptions::new(&out.0), &mut ()).unwrap();
    assert!(summary.process_peak_rss.unwrap() <= budget, "{summary}");

    // Broken: the same run with 128 MiB touched at its first step.
    let out = TempDir::new("budget-broken");
    let mut spike = Spike { bytes: 128 << 20, done: false };
    let error = train(limited, &RunOptions::new(&out.0), &mut spike).unwrap_err();
    let Error::OverBudget { budget: said, peak, .. } = &error else {
        panic!("not the budget's error: {error}");
    };
    assert_eq!(*said, budget);
    assert!(*peak >= budget + (64 << 20), "{error}");
    let text = error.to_string();
    assert!(text.contains("exceeded its memory_budget of"), "{text}");
    assert!(text.contains(&dp_mem::ByteSize(budget).to_string()), "{text}");
    // The run itself finished: its summary says the peak, and its checkpoint is usable.
    let dir = run_dir(&out.0);
    let summary = std::fs::read_to_string(dir.join(dp_train::SUMMARY)).unwrap();
    assert!(summary.contains(&format!("\"process_peak_rss\": {peak}")), "{summary}");
    let run = SavedRun::open(&dir).unwrap();
    let evaluation = run.evaluate(&common::digits().join("eval"), false).unwrap();
    assert!(evaluation.records > 0);
}
