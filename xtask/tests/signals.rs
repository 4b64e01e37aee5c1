//! `dp train` stopped by a scheduler's SIGTERM and by Ctrl-C's SIGINT: each finishes
//! its step, saves a checkpoint at that step, and exits with a status that says why; the run
//! then resumes from it without repeating a step.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{checkpoint, dp, losses, small_digits};

/// The training steps recorded in a run's metrics.
fn steps(run: &Path) -> Vec<u64> {
    losses(run).into_iter().map(|(step, _)| step).collect()
}

/// Waits until the run has recorded `more` steps beyond `from`, then sends `signal`, and
/// returns the exit code and the output.
fn signal_after(
    mut child: Child,
    run: &Path,
    from: usize,
    more: usize,
    signal: i32,
) -> (i32, String) {
    let started = Instant::now();
    while steps(run).len() < from + more {
        assert!(started.elapsed() < Duration::from_secs(120), "the run made no progress");
        assert!(child.try_wait().unwrap().is_none(), "the run ended before the signal");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on a child this test started has no memory effects here.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    let output = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), text)
}

fn checkpoint_step(run: &Path) -> u64 {
    checkpoint(run).expect("a checkpoint").0
}

#[test]
fn sigterm_and_ctrl_c_stop_after_the_step_with_a_checkpoint_and_resume() {
    let scratch = common::scratch("signals");
    let dir = scratch.path();
    let data = dir.join("data");
    small_digits(&data);

    let run = dir.join("runs/run");
    let child = dp()
        .args(["train", "--model", "mlp:32", "--global-batch", "64", "--steps", "1000000"])
        .args(["--replicas", "2", "--no-plot", "--name", "run", "--data"])
        .arg(data.join("train"))
        .arg("--out")
        .arg(dir.join("runs"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, text) = signal_after(child, &run, 0, 5, libc::SIGTERM);
    assert_eq!(code, 75, "preempted runs exit 75:\n{text}");
    let at = checkpoint_step(&run);
    // The command to continue with is the one this binary is run as.
    let resume =
        format!("preempted at step {at}; continue with: dp train --resume {}", run.display());
    assert!(text.contains(&resume), "{text}");
    assert_eq!(steps(&run), (1..=at).collect::<Vec<_>>());

    let child = dp()
        .args(["train", "--no-plot", "--resume"])
        .arg(&run)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, text) = signal_after(child, &run, at as usize, 5, libc::SIGINT);
    assert_eq!(code, 130, "interrupted runs exit 130:\n{text}");
    let end = checkpoint_step(&run);
    assert!(end >= at + 5 && text.contains(&format!("interrupted at step {end}")), "{text}");
    assert_eq!(steps(&run), (1..=end).collect::<Vec<_>>(), "every step once, in order");
}
