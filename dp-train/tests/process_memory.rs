//! The memory report matches the process: the peak resident memory the kernel counts is
//! within 1.1x of what the replicas accounted plus the process's resident memory at the
//! start, checkpoints included. Its own test binary, so that no other test's memory falls in
//! the process's peak.

mod common;

use common::{TempDir, config};
use dp_train::{RunOptions, TrainConfig, train};

#[test]
fn the_process_peak_is_within_1_1x_of_what_the_replicas_accounted() {
    let out = TempDir::new("process-memory");
    // 11.6M parameters with Adam on 2 replicas that share them: large enough that the
    // accounted buffers, not the binary, make up the process.
    let adam = common::adam();
    let c = TrainConfig {
        model: "mlp:4096,2048".into(),
        optimizer: Some(adam),
        eval_data: None,
        checkpoint_every: 2,
        ..config(2, 6)
    };
    let summary = train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
    let (Some(peak), Some(start)) = (summary.process_peak_rss, summary.process_baseline_rss) else {
        eprintln!("skipped: this system does not report resident memory");
        return;
    };
    eprintln!(
        "{}",
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("Rss") || l.starts_with("Vm"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let expected = summary.process_accounted + start;
    let ratio = peak as f64 / expected as f64;
    println!("peak RSS {peak} B against {expected} B accounted and at start: {ratio:.3}x");
    assert!(ratio <= 1.1, "peak RSS {peak} B is {ratio:.3}x the {expected} B accounted");
    // And the accounts hold one copy of the parameters and optimizer state, not one per
    // replica: parameters, Adam's two moments and each replica's gradients are 5 times the
    // parameters' bytes (8 times with a copy each), with activations and data besides.
    let params = 4 * 11_623_434u64;
    assert!(summary.process_accounted < 7 * params, "{}", summary.process_accounted);
}
