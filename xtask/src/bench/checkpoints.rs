//! `cargo xtask bench train --filter checkpoints`: what checkpoints every 50 steps cost a run,
//! written synchronously and in the background (`checkpoint_async`), against the same run
//! saving only at its end, in alternating rounds. Target: the background saves' run at most
//! 1.03x the time of the run without them. Measured with a replica on every core, where
//! compressing a checkpoint can only take their time, and with a core to spare, as a GPU run
//! leaves them.

use std::path::Path;

use super::support::{median, verdict, with_scratch};
use anyhow::Result;
use dp_mem::ByteSize;
use dp_train::{RunOptions, Summary, TrainConfig, train};

const ROUNDS: usize = 5;
const STEPS: u64 = 230;
const EVERY: u64 = 50;
const TIME_RATIO: f64 = 1.03;

/// Runs the section and prints its figures against the target, with `cores` replicas and
/// with one fewer.
pub(crate) fn run(root: &Path, cores: usize) -> Result<()> {
    xtask::ensure_digits(&root.join("data/digits"))?;
    for replicas in [cores, cores - 1].into_iter().filter(|&r| r > 0) {
        with_scratch("checkpoints", |out| measure(root, out, replicas))?;
    }
    Ok(())
}

fn measure(root: &Path, out: &Path, replicas: usize) -> Result<()> {
    // 5.8M parameters with Adam: a save holds 70 MB of parameters and moments.
    // Fewer steps than an epoch, so that the run without checkpoints saves only at its end.
    let base = TrainConfig {
        train_data: root.join("data/digits/train"),
        eval_data: None,
        model: "mlp:2048,2048".into(),
        optimizer: Some(dp_train::OptimizerConfig::preset("adam")?),
        replicas,
        global_batch: 256,
        steps: Some(STEPS),
        ..TrainConfig::default()
    };
    let settings: [(&str, u64, bool); 3] = [
        ("at the end only", 0, false),
        ("every 50, synchronous", EVERY, false),
        ("every 50, background", EVERY, true),
    ];
    let mut runs: [Vec<Summary>; 3] = Default::default();
    for round in 0..ROUNDS {
        for (i, (_, every, background)) in settings.into_iter().enumerate() {
            let config = TrainConfig {
                checkpoint_every: every,
                checkpoint_async: background,
                name: Some(format!("checkpoints-{i}-{round}")),
                ..base.clone()
            };
            runs[i].push(train(config, &RunOptions::new(out), &mut ())?);
        }
    }
    let checkpoint = out.join("checkpoints-1-0").join(dp_train::CHECKPOINT);
    let bytes = std::fs::metadata(&checkpoint).map_or(0, |m| m.len());
    println!(
        "\nCheckpoints: MLP 784-2048-2048-10 with Adam ({} parameters), {replicas} replicas on {} cores, {STEPS} steps, a checkpoint of {} every {EVERY} steps; whole-run seconds, and their ratio to the same round's run without checkpoints, medians of {ROUNDS} alternating rounds",
        runs[0][0].params,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        ByteSize(bytes),
    );
    // Each round's runs against its own run without checkpoints, then the median: the
    // machine's drift over a section moves all three alike.
    let ratio = |i: usize| median((0..ROUNDS).map(|r| runs[i][r].wall_s / runs[0][r].wall_s));
    let staged = |runs: &[Summary]| runs[0].peak_memory.get("Temp").copied().unwrap_or(0);
    for (i, ((name, _, _), runs)) in settings.iter().zip(&runs).enumerate() {
        let wall = median(runs.iter().map(|s| s.wall_s));
        println!(
            "  {name:<24} {wall:>8.2} s {:>7.3}x   peak Temp {}",
            ratio(i),
            ByteSize(staged(runs)),
        );
    }
    let (sync, background) = (ratio(1), ratio(2));
    println!(
        "  background saves: {background:.3}x the run without checkpoints  <= {TIME_RATIO} {} (synchronous: {sync:.3}x)",
        verdict(background <= TIME_RATIO),
    );
    Ok(())
}
