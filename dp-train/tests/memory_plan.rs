//! The memory planner: its predicted peak holds against the process's measured peak, a
//! budget is met by the settings that cost the least speed, one that cannot be met fails
//! before the run starts, and the largest model found for a budget is the largest that fits.
//!
//! The peak resident memory the kernel reports is the whole process's, so each measured run
//! is a process of its own: this test binary run again on `one_planned_run`.

mod common;

use std::path::Path;
use std::process::Command;

use common::{TempDir, config};
use dp_train::{
    ByteSize, RecomputePolicy, RunOptions, TrainConfig, largest_model, plan_memory, train,
};

/// Set in a child process: the case it runs, its data and where its run goes.
const CASE: &str = "DP_MEMORY_PLAN_CASE";

/// 7.9M parameters with Adam on 2 replicas, each holding its own copies: large enough that
/// the planned buffers, not the binary, make up the process.
fn base(data: &Path) -> TrainConfig {
    TrainConfig {
        train_data: data.join("train"),
        eval_data: None,
        model: "mlp:2048,2048".into(),
        optimizer: Some(common::adam()),
        share_params: false,
        global_batch: 128,
        bucket_size: ByteSize(25 << 20),
        ..config(2, 3)
    }
}

/// The child's side: trains `base` under the budget it was given and prints what the plan
/// predicted and what the process measured. Does nothing unless started by the test below.
#[test]
fn one_planned_run() {
    let Ok(case) = std::env::var(CASE) else { return };
    let mut parts = case.split(';');
    let (data, out) = (parts.next().unwrap(), parts.next().unwrap());
    let (share, background) = (parts.next().filter(|s| !s.is_empty()), parts.next().is_some());
    // With background saves after every step, their staging copies are held at the peak.
    let base = TrainConfig {
        checkpoint_async: background,
        checkpoint_every: if background { 1 } else { 0 },
        ..base(Path::new(data))
    };
    // A share of this process's own prediction as given, whose baseline is this process's.
    let given = plan_memory(&base, 1).unwrap().predicted_peak;
    let budget = share.map(|s| (given as f64 * s.parse::<f64>().unwrap()) as u64);
    let config = TrainConfig { memory_budget: budget.map(ByteSize), ..base };
    let summary = train(config, &RunOptions::new(out), &mut ()).unwrap();
    let saved = std::fs::read_to_string(common::run_dir(Path::new(out)).join(dp_train::CONFIG));
    let saved: TrainConfig = toml::from_str(&saved.unwrap()).unwrap();
    println!(
        "RESULT {} {} {} {} {} {} {}",
        budget.unwrap_or(u64::MAX),
        summary.predicted_peak_rss.unwrap(),
        summary.process_peak_rss.unwrap_or(0),
        saved.replicas,
        saved.share_params,
        saved.recompute != RecomputePolicy::Off || saved.grad_accum > 1,
        saved.optimizer_bits,
    );
}

#[test]
fn the_predicted_peak_holds_within_1_1x_of_the_measured_on_four_plans() {
    if dp_mem::process_memory().is_none() {
        eprintln!("skipped: this system does not report resident memory");
        return;
    }
    let dir = TempDir::new("memory-plan");
    let data = common::digits();
    // As given; then a budget that sharing the parameters meets (it drops a copy of the
    // parameters and of Adam's moments, 30% of the process); then one that needs more; and
    // as given with checkpoints saved in the background.
    let mut plans = Vec::new();
    let cases = [(None, false), (Some(0.8), false), (Some(0.55), false), (None, true)];
    for (i, (budget, background)) in cases.into_iter().enumerate() {
        let out = dir.0.join(format!("case-{i}"));
        let case = format!(
            "{};{};{}{}",
            data.display(),
            out.display(),
            budget.map_or(String::new(), |b| b.to_string()),
            if background { ";async" } else { "" }
        );
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "one_planned_run", "--nocapture", "--test-threads", "1"])
            .env(CASE, case)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&child.stdout);
        assert!(
            child.status.success(),
            "case {i}: {stdout}\n{}",
            String::from_utf8_lossy(&child.stderr)
        );
        let line = stdout.lines().find_map(|l| l.split_once("RESULT ").map(|(_, r)| r));
        let line = line.unwrap_or_else(|| panic!("case {i} printed no result: {stdout}"));
        let fields: Vec<&str> = line.split(' ').collect();
        let [budget, predicted, measured]: [u64; 3] =
            std::array::from_fn(|k| fields[k].parse().unwrap());
        let ratio = measured as f64 / predicted as f64;
        println!(
            "case {i}: budget {budget}, predicted {predicted}, measured {measured} ({ratio:.3}x), plan {:?}",
            &fields[3..]
        );
        assert!(
            (1.0 / 1.1..=1.1).contains(&ratio),
            "case {i}: measured {measured} B against predicted {predicted} B"
        );
        assert!(measured <= budget, "case {i}: measured {measured} B over the {budget} B budget");
        plans.push(fields[3..].join(" "));
    }
    assert_eq!(plans[0], "2 false false 32", "the config as given runs as given");
    assert_eq!(plans[1], "2 true false 32", "sharing the parameters is free, and enough");
    assert!(plans[2] != plans[1], "the tightest budget turns more on: {}", plans[2]);
    assert_eq!(plans[3], plans[0], "background saves change nothing else");
}

#[test]
fn a_budget_is_met_with_the_cheapest_settings_and_one_too_small_fails_before_the_run() {
    let data = common::digits();
    let given = plan_memory(&base(data), 1).unwrap();
    assert!(given.turned_on.is_empty() && given.budget.is_none());
    // With room to spare: other tests in this process move its baseline.
    let roomy = given.predicted_peak * 5 / 4;
    let config = TrainConfig { memory_budget: Some(ByteSize(roomy)), ..base(data) };
    let fits = plan_memory(&config, 1).unwrap();
    assert!(fits.turned_on.is_empty(), "the config fits as given: {:?}", fits.turned_on);
    // A plan keeps 8 MiB of headroom under its budget for what the prediction cannot see.
    let budget = given.predicted_peak * 8 / 10 + (8 << 20);
    let config = TrainConfig { memory_budget: Some(ByteSize(budget)), ..base(data) };
    let shared = plan_memory(&config, 1).unwrap();
    assert!(shared.predicted_peak <= budget);
    assert_eq!(shared.turned_on, ["shared parameters (share_params)"]);
    assert!(shared.config.share_params && shared.config.recompute == RecomputePolicy::Off);
    assert_eq!((shared.config.replicas, shared.config.grad_accum), (2, 1));

    let out = TempDir::new("memory-plan-too-small");
    let tiny = TrainConfig { memory_budget: Some(ByteSize(16 << 20)), ..base(data) };
    let error = train(tiny, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
    assert!(
        error.contains("memory_budget") && error.contains("the least it can take is"),
        "{error}"
    );
    assert!(error.contains("with ") && error.contains("1 replicas per process"), "{error}");
    assert_eq!(std::fs::read_dir(&out.0).unwrap().count(), 0, "no run directory");
}

#[test]
fn activations_are_rounded_to_bf16_before_they_are_recomputed() {
    let data = common::digits();
    // Every cheaper saver already on, and micro-batches of 511 samples that cannot be
    // halved: what is left to turn on is bf16 storage, recomputation or fewer replicas.
    let config = TrainConfig {
        model: "mlp:8192".into(),
        global_batch: 2 * 511,
        share_params: true,
        zero_stage: 1,
        data_prefetch: 0,
        optimizer_bits: 8,
        ..base(data)
    };
    let given = plan_memory(&config, 1).unwrap();
    let bf16 = TrainConfig { activations: dp_model::SavedPrecision::Bf16, ..config.clone() };
    let rounded = plan_memory(&bf16, 1).unwrap();
    // Half of each replica's 8192-wide activations, less the chunks' buffers: tens of MiB.
    assert!(rounded.predicted_peak + (24 << 20) < given.predicted_peak, "{rounded}\n{given}");
    // With room for this process's baseline to move between the plans, and the 8 MiB of
    // headroom a plan keeps under its budget.
    let budget = rounded.predicted_peak + (16 << 20);
    let planned = plan_memory(&TrainConfig { memory_budget: Some(ByteSize(budget)), ..config }, 1);
    let planned = planned.unwrap();
    assert_eq!(planned.turned_on, ["bf16 saved activations (activations = \"bf16\")"]);
    assert!(
        planned.config.recompute == RecomputePolicy::Off && planned.config.replicas == 2,
        "{planned}"
    );
}

#[test]
fn the_largest_model_for_a_budget_fits_and_the_next_size_does_not() {
    let data = common::digits();
    let config = TrainConfig { memory_budget: Some(ByteSize(400 << 20)), ..base(data) };
    let largest = largest_model("mlp", &config, 1).unwrap();
    assert!(largest.predicted_peak <= 400 << 20);
    let width: usize = largest.config.model.rsplit(',').next().unwrap().parse().unwrap();
    assert_eq!(largest.config.model, format!("mlp:{},{width}", 2 * width));
    assert!(width >= 1024, "{}", largest.config.model);
    let next =
        TrainConfig { model: format!("mlp:{},{}", 2 * (width + 8), width + 8), ..config.clone() };
    // The search keeps the given replicas; a plan for the next size may only fit with fewer.
    match plan_memory(&next, 1) {
        Err(error) => assert!(error.to_string().contains("memory_budget"), "{error}"),
        Ok(plan) => assert!(plan.config.replicas < largest.config.replicas, "{plan:?}"),
    }
    let unknown = largest_model("transformer", &config, 1).unwrap_err().to_string();
    assert!(unknown.contains("mlp, gpt or resnet"), "{unknown}");
    // Under device = cuda the budget is the GPU's: the search fits each size to the GPU's
    // memory (one replica per process there), and the host's headroom plays no part.
    let gpu = TrainConfig { device: dp_train::Device::Cuda, replicas: 1, ..config.clone() };
    let on_gpu = largest_model("mlp", &gpu, 1).unwrap();
    let device = on_gpu.gpu.expect("the GPU's memory");
    assert!(device.blocks <= 400 << 20 && on_gpu.budgeted_bytes() == device.blocks, "{on_gpu}");
    // A model whose parameters, gradients and Adam's moments alone pass the budget: the
    // plan names the least GPU memory it takes, and without a budget it plans as usual.
    let gpu = TrainConfig { model: "mlp:8192,8192".into(), ..gpu };
    let refused = plan_memory(&gpu, 1).unwrap_err().to_string();
    assert!(refused.contains("memory_budget") && refused.contains("of GPU memory"), "{refused}");
    let planned = plan_memory(&TrainConfig { memory_budget: None, ..gpu }, 1).unwrap();
    assert!(planned.turned_on.is_empty() && planned.gpu.is_some(), "{planned}");
}
