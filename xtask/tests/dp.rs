//! The `dp` binary: the user commands, with defaults relative to the working directory, and
//! none of the development ones.

use std::process::Command;

mod common;

/// `dp`, run in `dir`.
fn dp(dir: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dp"));
    command.current_dir(dir);
    command
}

#[test]
fn dp_trains_the_digits_of_its_working_directory_into_its_runs() {
    let dir = common::scratch("binary");
    // The built-in digits where `dp train` looks for them by default, relative to here.
    let made = dp(dir.path())
        .args(["data", "gen", "--records", "512", "--eval-records", "64", "--out", "data/digits"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let trained = dp(dir.path())
        .args(["train", "--steps", "3", "--replicas", "1", "--no-plot", "--name", "here"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&trained.stdout);
    assert!(trained.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&trained.stderr));
    // The run went to `./runs`, and trained on `./data/digits`.
    let run = dir.path().join("runs/here");
    assert!(run.join(dp_train::CHECKPOINT).is_file(), "{stdout}");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let data = dir.path().join("data/digits/train");
    assert!(config.contains(&*data.to_string_lossy()), "{config}");

    // The development commands are `cargo xtask`'s, not the installed binary's.
    for command in ["ci", "bench"] {
        let output = dp(dir.path()).arg(command).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains("unrecognized subcommand"), "{stderr}");
    }
}
