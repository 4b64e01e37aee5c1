//! Training across processes. Each test, run by `cargo test`, starts itself under `mpirun`
//! with 2 processes; the processes train, process 0 writes the run directory, and the parent
//! checks what they wrote against runs of threads in one process. Without the `mpi` feature or
//! without `mpirun` the tests print why they are skipped and pass (`.ci/run` runs them).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::{TempDir, final_params, final_params_of, max_relative_difference, train_losses};
use dp_comm::MpiWorld;
use dp_model::{CheckpointReader, ModelSpec};
use dp_train::{Fault, FaultKind, OptimizerConfig, RunOptions, TrainConfig, train};

/// Set in the processes' environment: what to run, and where.
const SCENARIO: &str = "DP_TRAIN_MPI_SCENARIO";
const DIR: &str = "DP_TRAIN_MPI_DIR";

fn config(dir: &Path, name: &str, replicas: usize, steps: u64) -> TrainConfig {
    TrainConfig {
        name: Some(name.into()),
        train_data: dir.join("data/train"),
        model: "mlp:32".into(),
        replicas,
        global_batch: 64,
        steps: Some(steps),
        shuffle_window: 2,
        timeout_s: 30.0,
        // About ten buckets for this model, so reductions overlap with backward.
        bucket_size: dp_mem::ByteSize(10 << 10),
        ..TrainConfig::default()
    }
}

const SGD: OptimizerConfig = OptimizerConfig::Sgd(dp_train::SgdConfig {
    momentum: 0.9,
    nesterov: false,
    weight_decay: 1e-4,
});
const ADAM: OptimizerConfig = OptimizerConfig::Adam(dp_train::AdamConfig {
    betas: (0.9, 0.999),
    eps: 1e-8,
    weight_decay: 0.0,
    decoupled: false,
});

/// The equivalence cases: (name, optimizer, ZeRO stage).
fn cases() -> [(&'static str, OptimizerConfig, u8); 4] {
    [("sgd", SGD, 0), ("adam", ADAM, 0), ("sgd-zero1", SGD, 1), ("adam-zero1", ADAM, 1)]
}

/// The test data, in `dir/data`.
fn make_data(dir: &Path) {
    let spec = dp_data::SyntheticDigits { records: 2048, eval_records: 256, seed: 3 };
    dp_data::generate_digits(&dir.join("data"), &spec, dp_data::WriterOptions::default()).unwrap();
}

/// Says why an MPI test cannot run here, or fails it where it must run (`DP_REQUIRE_MPI`, which
/// CI sets once it has installed Open MPI), so that a broken setup never passes as a skip.
fn skip(why: &str) {
    assert!(std::env::var_os("DP_REQUIRE_MPI").is_none(), "{why}, and DP_REQUIRE_MPI is set");
    eprintln!("skipping {why}");
}

/// Runs `test` under `mpirun` with `processes` processes that run `scenario` in `dir`, or
/// returns `None` after printing why it cannot run here.
fn launch(test: &str, processes: usize, scenario: &str, dir: &Path) -> Option<(Output, Duration)> {
    if !cfg!(feature = "mpi") {
        skip(&format!("MPI test {test}: dp-train was built without the `mpi` feature"));
        return None;
    }
    let mut command = match dp_comm::mpirun(processes) {
        Ok(command) => command,
        Err(error) => {
            skip(&format!("MPI test {test}: {error}"));
            return None;
        }
    };
    command
        .arg(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(SCENARIO, scenario)
        .env(DIR, dir);
    let started = Instant::now();
    let output = command.output().expect("start mpirun");
    Some((output, started.elapsed()))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// In a process started by `launch`: its scenario and directory.
fn scenario() -> Option<(String, PathBuf)> {
    let scenario = std::env::var(SCENARIO).ok()?;
    Some((scenario, PathBuf::from(std::env::var_os(DIR)?)))
}

/// Trains `config` as one process of the MPI job.
fn train_in_job(
    world: &MpiWorld,
    config: TrainConfig,
    options: RunOptions,
) -> dp_train::Result<()> {
    let options = RunOptions { mpi: Some(world.clone()), ..options };
    train(config, &options, &mut ()).map(|_| ())
}

#[test]
fn two_processes_match_one_with_the_same_global_batch() {
    if let Some((_, dir)) = scenario() {
        let world = MpiWorld::init().unwrap();
        for (name, optimizer, zero) in cases() {
            for threads in [1, 2] {
                let name = format!("{name}-{threads}");
                // ZeRO-1 runs save in the background every other step: the shards of both
                // processes, then the checkpoint naming them, while the next steps run.
                let c = TrainConfig {
                    optimizer: Some(optimizer.clone()),
                    zero_stage: zero,
                    checkpoint_async: zero == 1,
                    checkpoint_every: if zero == 1 { 2 } else { 0 },
                    ..config(&dir, &name, threads, 6)
                };
                train_in_job(&world, c, RunOptions::new(dir.join("procs"))).unwrap();
            }
        }
        world.finalize().unwrap();
        return;
    }
    let dir = TempDir::new("mpi-equivalence");
    make_data(&dir.0);
    let Some((output, _)) =
        launch("two_processes_match_one_with_the_same_global_batch", 2, "equivalence", &dir.0)
    else {
        return;
    };
    assert!(output.status.success(), "{}", text(&output));
    for (name, optimizer, zero) in cases() {
        let mut threads_only = BTreeMap::new();
        for replicas in [1, 2, 4] {
            let c = TrainConfig {
                optimizer: Some(optimizer.clone()),
                zero_stage: zero,
                ..config(&dir.0, name, replicas, 6)
            };
            let out = dir.0.join(format!("threads-{replicas}"));
            let summary = train(c, &RunOptions::new(&out), &mut ()).unwrap();
            assert_eq!((summary.replicas, summary.processes), (replicas, 1));
            threads_only.insert(replicas, final_params(&out.join(name)));
        }
        for threads in [1, 2] {
            let run = dir.0.join("procs").join(format!("{name}-{threads}"));
            let summary: serde_json::Value =
                serde_json::from_slice(&std::fs::read(run.join(dp_train::SUMMARY)).unwrap())
                    .unwrap();
            assert_eq!(summary["processes"], 2, "{summary}");
            assert_eq!(summary["replicas"], 2 * threads, "{summary}");
            assert_eq!(summary["backend"], "mpi+threads", "{summary}");
            let processes = final_params(&run);
            for replicas in [1, 2 * threads] {
                let diff = max_relative_difference(&processes, &threads_only[&replicas]);
                println!(
                    "{name}: 2 processes x {threads} vs 1 x {replicas}: max relative difference {diff:e}"
                );
                assert!(diff <= 1e-5, "{name}: 2 x {threads} differs from 1 x {replicas}: {diff}");
            }
        }
    }
}

/// ResNet-8 with synchronized batch norms, on the digits as 1x28x28 images.
fn resnet(dir: &Path, name: &str, replicas: usize) -> TrainConfig {
    TrainConfig {
        model: "resnet8".into(),
        sync_bn: true,
        global_batch: 32,
        optimizer: Some(SGD),
        lr: Some(0.05),
        ..config(dir, name, replicas, 4)
    }
}

#[test]
fn synchronized_batch_norms_across_processes_match_one_replica() {
    if let Some((_, dir)) = scenario() {
        let world = MpiWorld::init().unwrap();
        train_in_job(&world, resnet(&dir, "resnet", 2), RunOptions::new(dir.join("procs")))
            .unwrap();
        world.finalize().unwrap();
        return;
    }
    let dir = TempDir::new("mpi-sync-bn");
    make_data(&dir.0);
    let test = "synchronized_batch_norms_across_processes_match_one_replica";
    let Some((output, _)) = launch(test, 2, "sync-bn", &dir.0) else { return };
    assert!(output.status.success(), "{}", text(&output));
    let spec = ModelSpec::resnet_cifar(8, [1, 28, 28], 10).unwrap();
    let out = dir.0.join("one");
    train(resnet(&dir.0, "resnet", 1), &RunOptions::new(&out), &mut ()).unwrap();
    let one = final_params_of(&out.join("resnet"), &spec);
    let processes = final_params_of(&dir.0.join("procs/resnet"), &spec);
    let diff = max_relative_difference(&processes, &one);
    println!("resnet8, sync-bn: 2 processes x 2 threads vs 1 replica: {diff:e}");
    assert!(diff <= 1e-5, "2 processes x 2 threads differ from 1 replica: {diff}");
}

/// A 2-block GPT on a byte-level token dataset of a small generated text in `dir/text`,
/// with ZeRO-1 across the replicas.
fn gpt(dir: &Path, name: &str, replicas: usize) -> TrainConfig {
    TrainConfig {
        train_data: dir.join("text/train"),
        model: "gpt:2,2,32".into(),
        context: Some(16),
        global_batch: 8,
        zero_stage: 1,
        ..config(dir, name, replicas, 4)
    }
}

/// The text of [`gpt`]: sentences of a few words.
fn make_text(dir: &Path) {
    let words = ["data", "parallel", "replicas", "agree", "on", "every", "step", "bit"];
    let mut text = String::new();
    for k in 0..2_000u64 {
        let sentence: Vec<&str> = (0..4).map(|i| words[((k * 7 + i * k) % 8) as usize]).collect();
        text.push_str(&sentence.join(" "));
        text.push_str(". ");
    }
    let file = dir.join("corpus.txt");
    std::fs::write(&file, text).unwrap();
    let options = dp_data::TextOptions::default();
    dp_data::import_text(&[file.as_path()], &dir.join("text"), &options, Default::default())
        .unwrap();
}

#[test]
fn a_language_model_in_two_processes_matches_one_replica() {
    if let Some((_, dir)) = scenario() {
        let world = MpiWorld::init().unwrap();
        train_in_job(&world, gpt(&dir, "gpt", 1), RunOptions::new(dir.join("procs"))).unwrap();
        world.finalize().unwrap();
        return;
    }
    let dir = TempDir::new("mpi-gpt");
    make_text(&dir.0);
    let test = "a_language_model_in_two_processes_matches_one_replica";
    let Some((output, _)) = launch(test, 2, "gpt", &dir.0) else { return };
    assert!(output.status.success(), "{}", text(&output));
    let spec = ModelSpec::builtin("gpt:2,2,32", &[16], 256).unwrap();
    let out = dir.0.join("one");
    train(gpt(&dir.0, "gpt", 1), &RunOptions::new(&out), &mut ()).unwrap();
    let one = final_params_of(&out.join("gpt"), &spec);
    let processes = final_params_of(&dir.0.join("procs/gpt"), &spec);
    let diff = max_relative_difference(&processes, &one);
    println!("gpt:2,2,32, ZeRO-1: 2 processes vs 1 replica: {diff:e}");
    assert!(diff <= 1e-5, "2 processes differ from 1 replica: {diff}");
}

#[test]
fn a_killed_process_ends_the_run_which_resumes_on_any_number_of_processes() {
    let test = "a_killed_process_ends_the_run_which_resumes_on_any_number_of_processes";
    if let Some((scenario, dir)) = scenario() {
        let world = MpiWorld::init().unwrap();
        let c = TrainConfig { checkpoint_every: 4, ..config(&dir, "run", 1, 16) };
        let result = match scenario.as_str() {
            "whole" => train_in_job(&world, c, RunOptions::new(dir.join("whole"))),
            "killed" => {
                let fault = Fault { rank: 1, step: 10, kind: FaultKind::Kill };
                train_in_job(
                    &world,
                    c,
                    RunOptions { fault: Some(fault), ..RunOptions::new(dir.join("killed")) },
                )
            }
            "resume" => {
                let resume = Some(dir.join("killed/run"));
                train_in_job(
                    &world,
                    TrainConfig::default(),
                    RunOptions { resume, ..RunOptions::new(&dir) },
                )
            }
            other => panic!("unknown scenario {other}"),
        };
        result.unwrap();
        world.finalize().unwrap();
        return;
    }
    let dir = TempDir::new("mpi-killed");
    make_data(&dir.0);
    let Some((output, _)) = launch(test, 2, "whole", &dir.0) else { return };
    assert!(output.status.success(), "{}", text(&output));
    let bits = |run: &Path| {
        train_losses(run).into_iter().map(|(s, l)| (s, l.to_bits())).collect::<Vec<_>>()
    };
    let whole = bits(&dir.0.join("whole/run"));
    assert_eq!(whole.len(), 16);

    let (output, took) = launch(test, 2, "killed", &dir.0).unwrap();
    let said = text(&output);
    assert!(!output.status.success(), "{said}");
    // The launcher names the lost rank, and process 0 ends with the job, well within the
    // 30 s timeout.
    assert!(said.contains("rank 1") && said.contains("signal 9"), "{said}");
    assert!(took < Duration::from_secs(20), "took {took:?}: {said}");
    // The last good checkpoint is step 8's (checkpoints every 4 steps; killed at step 10).
    let killed = dir.0.join("killed/run");
    let checkpoint = CheckpointReader::open(&killed.join(dp_train::CHECKPOINT)).unwrap();
    assert!(checkpoint.header().extra().contains("\"step\":8"), "{}", checkpoint.header().extra());
    let copy = dir.0.join("copy");
    common::copy_dir(&killed, &copy);

    // The same number of processes continues exactly.
    let (output, _) = launch(test, 2, "resume", &dir.0).unwrap();
    assert!(output.status.success(), "{}", text(&output));
    // Every step once, with the uninterrupted run's losses: the steps the killed run logged
    // after its checkpoint were dropped before the resumed run logged them again.
    assert_eq!(bits(&killed), whole);
    assert_eq!(final_params(&killed), final_params(&dir.0.join("whole/run")));

    // One process with one replica continues too, from the same checkpoint.
    let options = RunOptions { resume: Some(copy.clone()), ..RunOptions::new(&dir.0) };
    let summary = train(TrainConfig::default(), &options, &mut ()).unwrap();
    assert_eq!((summary.steps, summary.processes, summary.replicas), (16, 1, 1));
    let diff =
        max_relative_difference(&final_params(&copy), &final_params(&dir.0.join("whole/run")));
    assert!(diff <= 1e-5, "resumed on one process: {diff}");
}

#[test]
fn gpus_in_two_processes_without_a_gpu_fail_on_both_with_the_reason() {
    let test = "gpus_in_two_processes_without_a_gpu_fail_on_both_with_the_reason";
    if let Some((_, dir)) = scenario() {
        let world = MpiWorld::init().unwrap();
        let c = TrainConfig { device: dp_train::Device::Cuda, ..config(&dir, "gpu", 1, 4) };
        let error = train_in_job(&world, c, RunOptions::new(dir.join("runs"))).unwrap_err();
        std::fs::write(dir.join(format!("error-{}", world.rank())), error.to_string()).unwrap();
        world.finalize().unwrap();
        return;
    }
    if dp_comm::nccl_available().is_ok() {
        skip(&format!("MPI test {test}: NCCL and a GPU driver are here, so the run could start"));
        return;
    }
    let dir = TempDir::new("mpi-gpu");
    make_data(&dir.0);
    let Some((output, took)) = launch(test, 2, "gpu", &dir.0) else { return };
    assert!(output.status.success(), "{}", text(&output));
    let error = |rank: usize| std::fs::read_to_string(dir.0.join(format!("error-{rank}"))).unwrap();
    // Process 0 says what is missing (the feature, or the libraries); process 1 does not wait
    // for an NCCL id that never comes, and names process 0.
    let first = error(0);
    println!("process 0: {first}\nprocess 1: {}", error(1));
    assert!(first.contains("cuda") || first.contains("NCCL"), "{first}");
    assert!(error(1).contains("rank 0"), "{}", error(1));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(!dir.0.join("runs/gpu").exists(), "no run directory for a run that never started");
}
