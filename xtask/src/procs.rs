//! `dp train --procs N`: starts N training processes on this host under `mpirun`,
//! from one MPI-enabled build of this binary, so that no rank builds anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, Result, bail};
use libc::{SIGTERM, SIGUSR1};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::Home;
use crate::stop::Stop;

/// Set by `--procs` to its terminal's width when its output is a terminal: draw the progress
/// bar, though this process's output is mpirun's pipe.
pub(crate) const PROGRESS_TERMINAL: &str = "DP_XTASK_PROGRESS_TERMINAL";

/// Runs this command line again as `processes` MPI ranks and returns their exit status.
pub(crate) fn launch(home: &Home, processes: usize) -> Result<ExitCode> {
    if processes == 0 {
        bail!("--procs must be at least 1");
    }
    let mut command = dp_comm::mpirun(processes)
        .context("training in processes needs MPI; scripts/setup-mpi.sh installs it")?;
    let exe = match &home.workspace {
        Some(root) => mpi_build(root)?,
        None if cfg!(feature = "mpi") => std::env::current_exe().context("find this binary")?,
        None => bail!(
            "--procs needs MPI, and this dp was built without it: install it with MPI \
             (scripts/setup-mpi.sh, then cargo install --path xtask --bin dp --features mpi), \
             or run it under mpirun or srun yourself"
        ),
    };
    command.arg(exe).args(args_without_procs());
    if std::io::stderr().is_terminal() {
        // Rank 0's output reaches the terminal through mpirun's pipes, where indicatif would
        // hide the progress bar: tell it the terminal is there, and how wide.
        let width = console::Term::stderr().size().1;
        command.env(PROGRESS_TERMINAL, width.to_string());
    }
    // mpirun answers Ctrl-C by killing the job, so it runs in a process group of its own,
    // away from the terminal's Ctrl-C, and this process turns the first SIGINT or SIGTERM
    // into a SIGUSR1, which mpirun forwards to every rank: a graceful stop after the current
    // step, with a checkpoint. A second one ends the job. The handler is in place before
    // mpirun starts, and forgets its pid once it has ended.
    let mpirun = Arc::new(AtomicI32::new(0));
    let target = Arc::clone(&mpirun);
    let stop = Stop::listen(move |_, signal, first| {
        let relay = match (first, signal) {
            (_, SIGUSR1) => return,
            (true, SIGTERM) => {
                eprintln!("\npreempted (SIGTERM): stopping every rank after this step");
                SIGUSR1
            }
            (true, _) => {
                eprintln!(
                    "\nstopping after this step (a checkpoint will be saved; Ctrl-C again to quit now)"
                );
                SIGUSR1
            }
            (false, _) => SIGTERM,
        };
        let pid = target.load(Ordering::Acquire);
        if pid > 0 {
            // SAFETY: kill(2) on the child this process started, while it runs.
            unsafe { libc::kill(pid, relay) };
        }
    })?;
    command.process_group(0);
    // SAFETY: prctl is async-signal-safe, as a pre_exec hook must be. A launcher killed
    // outright takes mpirun (and so the ranks) with it instead of leaving them training.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = command.spawn().with_context(|| format!("cannot start {command:?}"))?;
    mpirun.store(
        libc::pid_t::try_from(child.id()).context("mpirun's process id")?,
        Ordering::Release,
    );
    if stop.requested() {
        // A stop asked for while mpirun was starting.
        // SAFETY: as above.
        unsafe { libc::kill(mpirun.load(Ordering::Acquire), SIGUSR1) };
    }
    let status = child.wait().context("wait for mpirun");
    mpirun.store(0, Ordering::Release);
    let status = status?;
    Ok(match status.code() {
        Some(0) if stop.requested() => ExitCode::from(stop.status()),
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

/// This binary when it was built with MPI; otherwise an MPI-enabled build of it, made once
/// in its own target directory (so it does not replace the running binary).
pub fn mpi_build(root: &Path) -> Result<PathBuf> {
    if cfg!(feature = "mpi") {
        return std::env::current_exe().context("find this binary");
    }
    let target = root.join("target/mpi");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let exe = target.join("release/xtask");
    if !exe.exists() {
        println!("building xtask with MPI into {} (once) ...", target.display());
    }
    let status = Command::new(cargo)
        .args(["build", "--release", "--quiet", "--package", "xtask", "--bin", "xtask"])
        .args(["--features", "mpi,dev"])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(root)
        .status()
        .context("run cargo")?;
    if !status.success() {
        bail!(
            "building xtask with MPI failed ({status}); when the error above is about mpi-sys, \
             mpicc or libclang, install them first: scripts/setup-mpi.sh"
        );
    }
    Ok(exe)
}

/// This process's arguments, without `--procs N` (or `--procs=N`).
fn args_without_procs() -> Vec<OsString> {
    let mut args = Vec::new();
    let mut skip = false;
    for arg in std::env::args_os().skip(1) {
        if std::mem::take(&mut skip) {
            continue;
        }
        match arg.to_str() {
            Some("--procs") => skip = true,
            Some(a) if a.starts_with("--procs=") => {}
            _ => args.push(arg),
        }
    }
    args
}
