//! A run under an address-space limit (`ulimit -v`) too small for it stops at setup with an
//! error that names the limit and what to lower, before its run directory exists; one that
//! fits trains. Swept from the least limit the program starts under at all. Never an abort, a panic or a hang, whatever the limit, with backtraces on
//! (printing one after running out of memory could hang).

mod common;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{dp, small_digits};

/// `command` limited to `limit_mib` of address space.
fn limited(command: &mut Command, limit_mib: u64) {
    let bytes = limit_mib << 20;
    // SAFETY: between fork and exec only `setrlimit`, which is async-signal-safe, runs.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            match libc::setrlimit(libc::RLIMIT_AS, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// The least limit, in steps of 10 MiB, under which the program starts at all. Below it the
/// kernel cannot map the program itself (`exec` fails past its point of no return, a SIGSEGV
/// before any of the program's code runs); the debug build's code alone is tens of MiB.
fn least_to_start() -> u64 {
    (10..=1000)
        .step_by(10)
        .find(|&mib| {
            let mut help = dp();
            help.arg("--help").stdout(Stdio::null()).stderr(Stdio::null());
            limited(&mut help, mib);
            help.status().unwrap().success()
        })
        .expect("the program starts under 1,000 MiB")
}

/// How a run under `limit_mib` of address space ended: its exit code and standard error.
fn train_under(limit_mib: u64, data: &Path, out: &Path) -> (i32, String) {
    let mut train = dp();
    train.args(["train", "--steps", "12", "--replicas", "2", "--no-plot", "--name", "run"]);
    train.args(["--set", "checkpoint_every=6", "--set", "eval_every=6"]);
    train.arg("--data").arg(data.join("train")).arg("--eval-data").arg(data.join("eval"));
    train.arg("--out").arg(out).env("RUST_BACKTRACE", "1");
    train.stdout(Stdio::null()).stderr(Stdio::piped());
    limited(&mut train, limit_mib);
    let mut child = train.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("under {limit_mib} MiB the run hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let code = status.code().unwrap_or_else(|| {
        panic!("under {limit_mib} MiB the run died of signal {:?}: {stderr}", status.signal())
    });
    (code, stderr)
}

#[test]
fn too_little_memory_is_refused_at_setup_and_enough_trains() {
    let scratch = common::scratch("ulimit");
    let data = scratch.path().join("data");
    small_digits(&data);
    let (mut refused, mut trained, mut named_limit) = (Vec::new(), Vec::new(), 0);
    let start = least_to_start();
    for limit_mib in (start..=start + 260).step_by(10) {
        let out = scratch.path().join(format!("runs-{limit_mib}"));
        let (code, stderr) = train_under(limit_mib, &data, &out);
        assert!(!stderr.contains("panicked"), "under {limit_mib} MiB: {stderr}");
        if code == 0 {
            assert!(out.join("run/summary.json").is_file(), "under {limit_mib} MiB");
            trained.push(limit_mib);
        } else {
            assert_eq!(code, 1, "under {limit_mib} MiB: {stderr}");
            assert!(stderr.contains("ulimit -v"), "under {limit_mib} MiB: {stderr}");
            if stderr.contains("ulimit -v is") || stderr.contains("ulimit -v of") {
                let named = format!("{limit_mib} MiB");
                assert!(stderr.contains(&named), "the limit misread: {stderr}");
                named_limit += 1;
            }
            assert!(!out.join("run").exists(), "under {limit_mib} MiB a run directory: {stderr}");
            refused.push(limit_mib);
        }
    }
    println!(
        "starts from {start} MiB; refused under {refused:?} MiB, trained under {trained:?} MiB"
    );
    // The sweep spans the run's need: it is refused below it and trains above it.
    assert!(!refused.is_empty() && !trained.is_empty(), "{refused:?} {trained:?}");
    assert!(refused.iter().max() < trained.iter().min(), "{refused:?} {trained:?}");
    assert!(named_limit > 0, "no refusal named the limit it ran under");
}
