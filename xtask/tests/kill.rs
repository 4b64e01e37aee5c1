//! `dp train` killed with SIGKILL again and again, at steps drawn from a fixed seed
//! and with a checkpoint written after every step (so a kill may land inside a write; the
//! test counts those it sees), and resumed each time: the checkpoint is never torn, and the
//! finished run's losses and parameters are bitwise the uninterrupted run's, every step
//! recorded once, no temporary file left. Checkpoints written synchronously, and in the
//! background (where a kill may also land between a shard and the checkpoint naming it).

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{checkpoint, dp, losses, small_digits};

/// Temporary files in a run directory.
fn temporaries(run: &Path) -> usize {
    std::fs::read_dir(run)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".tmp"))
        .count()
}

fn spawn(args: &[&str], extra: &[&Path]) -> Child {
    dp().args(args).args(extra).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

#[test]
fn runs_killed_at_random_steps_resume_to_the_uninterrupted_run() {
    killed_and_resumed("kill", "");
}

#[test]
fn runs_killed_during_background_saves_resume_to_the_uninterrupted_run() {
    killed_and_resumed("kill-async", "checkpoint_async = true\n");
}

/// The test, with `settings` added to the run's config.
fn killed_and_resumed(name: &str, settings: &str) {
    let scratch = common::scratch(name);
    let dir = scratch.path();
    let data = dir.join("data");
    small_digits(&data);
    let config = dir.join("run.toml");
    let train_data = data.join("train");
    std::fs::write(
        &config,
        format!(
            "train_data = {:?}\nmodel = \"mlp:32\"\nreplicas = 2\nglobal_batch = 64\nsteps = 240\ncheckpoint_every = 1\nshuffle_window = 2\n{settings}",
            train_data.to_str().unwrap()
        ),
    )
    .unwrap();
    let run_args = ["train", "--no-plot", "--name", "run", "--config"];

    let whole = dir.join("whole");
    let status = spawn(&run_args, &[&config, Path::new("--out"), &whole]).wait().unwrap();
    assert!(status.success());
    let uninterrupted = losses(&whole.join("run"));
    assert_eq!(uninterrupted.len(), 240);

    let runs = dir.join("killed");
    let run = runs.join("run");
    let mut child = spawn(&run_args, &[&config, Path::new("--out"), &runs]);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let (mut kills, mut resumes, mut inside_writes) = (0, 0, 0);
    loop {
        // Kill after 5 to 35 more recorded steps, unless the run finishes first.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let target = losses(&run).len() + 5 + (seed % 31) as usize;
        let started = Instant::now();
        let finished = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if losses(&run).len() >= target {
                break None;
            }
            assert!(started.elapsed() < Duration::from_secs(120), "no progress");
            std::thread::sleep(Duration::from_millis(2));
        };
        if let Some(status) = finished {
            assert!(status.success(), "a resumed run failed: {status}");
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        // Whatever the kill interrupted, the checkpoint on disk is a whole one.
        let _ = checkpoint(&run);
        inside_writes += usize::from(temporaries(&run) > 0);
        child = spawn(&["train", "--no-plot", "--resume"], &[&run]);
        resumes += 1;
    }
    println!("{kills} kills at random steps ({inside_writes} inside a write), {resumes} resumes");
    assert!(kills >= 4, "only {kills} kills landed; the run is too short to test this");
    assert_eq!(losses(&run), uninterrupted, "every step once, with the uninterrupted losses");
    let (killed_step, killed_bytes) = checkpoint(&run).unwrap();
    let (whole_step, whole_bytes) = checkpoint(&whole.join("run")).unwrap();
    assert_eq!((killed_step, killed_bytes), (whole_step, whole_bytes), "final checkpoints differ");
    // A kill inside a write leaves its temporary file; the resumed run removes it.
    assert_eq!(temporaries(&run), 0);
}
