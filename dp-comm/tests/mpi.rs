//! The MPI backend between real processes. Each test, run by `cargo test`, starts itself under
//! `mpirun` with 2 or 3 ranks; the ranks run the test's body and the parent checks their exit
//! and output. Without the `mpi` feature or without `mpirun` the tests print why they are
//! skipped and pass (`.ci/run` installs Open MPI and runs them for real).

mod cases;

use std::process::Output;
use std::time::{Duration, Instant};

use dp_comm::{
    Communicator, Error, Hierarchical, LocalGroup, MpiComm, MpiConfig, MpiWorld, ReduceOp,
};

/// Set in the ranks' environment: run the body, not the launcher.
const RANK_VAR: &str = "DP_COMM_MPI_RANK_BODY";

fn is_rank() -> bool {
    std::env::var_os(RANK_VAR).is_some()
}

/// Says why an MPI test cannot run here, or fails it where it must run (`DP_REQUIRE_MPI`, which
/// CI sets once it has installed Open MPI), so that a broken setup never passes as a skip.
fn skip(why: &str) {
    assert!(std::env::var_os("DP_REQUIRE_MPI").is_none(), "{why}, and DP_REQUIRE_MPI is set");
    eprintln!("skipping {why}");
}

/// Runs the test `name` under `mpirun` with `processes` ranks and returns their output and how
/// long they took, or `None` after printing why it cannot run here.
fn launch(name: &str, processes: usize) -> Option<(Output, Duration)> {
    if !cfg!(feature = "mpi") {
        skip(&format!("MPI test {name}: dp-comm was built without the `mpi` feature"));
        return None;
    }
    let mut command = match dp_comm::mpirun(processes) {
        Ok(command) => command,
        Err(error) => {
            skip(&format!("MPI test {name}: {error}"));
            return None;
        }
    };
    let exe = std::env::current_exe().unwrap();
    command.arg(exe).args([name, "--exact", "--nocapture", "--test-threads=1"]).env(RANK_VAR, "1");
    let started = Instant::now();
    let output = command.output().expect("start mpirun");
    Some((output, started.elapsed()))
}

/// Launches `name` and asserts that every rank passed.
fn launch_and_pass(name: &str, processes: usize) {
    if let Some((output, _)) = launch(name, processes) {
        let text = text(&output);
        assert!(output.status.success(), "{processes} ranks of {name} failed:\n{text}");
        // The ranks' lines may interleave; what matters is that the body ran (a name that
        // matches no test would pass with 0 tests).
        assert!(text.contains("1 passed") && !text.contains(" 0 passed"), "{text}");
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A rank's world and a communicator with `timeout`.
fn join(timeout: Duration) -> (MpiWorld, MpiComm) {
    let world = MpiWorld::init().expect("join the MPI job");
    let comm = world.communicator(MpiConfig::with_timeout(timeout)).unwrap();
    (world, comm)
}

/// Runs `body` with a rank's communicator, which it consumes, then leaves the job cleanly.
fn on_rank(body: impl FnOnce(MpiComm)) {
    let (world, comm) = join(Duration::from_secs(60));
    body(comm);
    world.finalize().unwrap();
}

#[test]
fn shared_cases_on_2_and_3_processes() {
    if is_rank() {
        on_rank(|mut comm| cases::all(&mut comm));
        return;
    }
    launch_and_pass("shared_cases_on_2_and_3_processes", 2);
    launch_and_pass("shared_cases_on_2_and_3_processes", 3);
}

#[test]
fn shared_cases_on_processes_of_threads() {
    if is_rank() {
        on_rank(|comm| {
            let processes = comm.world_size();
            let comms = Hierarchical::group(LocalGroup::new(2).unwrap(), Some(comm));
            std::thread::scope(|s| {
                for mut c in comms {
                    s.spawn(move || {
                        cases::all(&mut c);
                        assert_eq!(c.world_size(), 2 * processes);
                    });
                }
            });
        });
        return;
    }
    launch_and_pass("shared_cases_on_processes_of_threads", 2);
}

/// A float input whose sums round differently in different orders.
fn noisy(rank: usize, i: usize) -> f32 {
    let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(rank as u32 * 40_503);
    (x as f32 / u32::MAX as f32 - 0.5) * 10f32.powi((x % 9) as i32 - 4)
}

#[test]
fn float_sums_are_bitwise_the_same_on_every_rank() {
    if is_rank() {
        on_rank(|mut comm| {
            for len in [1, 1000, 300_007, 3 << 20] {
                let mut buf: Vec<f32> = (0..len).map(|i| noisy(comm.rank(), i)).collect();
                comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                let hash = buf.iter().fold(0u64, |h, x| h.rotate_left(5) ^ u64::from(x.to_bits()));
                let mut all = vec![0u64; comm.world_size()];
                comm.all_gather(&[hash], &mut all).unwrap();
                assert!(all.iter().all(|&h| h == all[0]), "len {len}: {all:?}");
            }
        });
        return;
    }
    launch_and_pass("float_sums_are_bitwise_the_same_on_every_rank", 3);
}

#[test]
fn ranks_that_call_differently_all_get_the_same_error() {
    if is_rank() {
        on_rank(|mut comm| {
            let len = if comm.rank() == 1 { 9 } else { 8 };
            let mut x = vec![1.0f32; len];
            let error = comm.all_reduce(&mut x, ReduceOp::Sum).unwrap_err();
            assert_eq!(
                error,
                Error::Inconsistent {
                    op: "all_reduce",
                    rank: 1,
                    detail: "it passed 9 elements instead of 8".into()
                }
            );
            assert!(x.iter().all(|&v| v == 1.0), "the buffer was touched");
            // The communicator stays failed; a size mistake is a local error that leaves it as is.
            assert_eq!(comm.barrier(), Err(error));
        });
        return;
    }
    launch_and_pass("ranks_that_call_differently_all_get_the_same_error", 3);
}

#[test]
fn a_stalled_peer_ends_the_job_within_the_timeout_naming_the_call() {
    if is_rank() {
        let (_world, mut comm) = join(Duration::from_secs(2));
        if comm.rank() == 1 {
            // Never arrives; the abort ends this process too.
            std::thread::sleep(Duration::from_secs(120));
        }
        let mut x = vec![1.0f32; 1000];
        let _ = comm.all_reduce(&mut x, ReduceOp::Sum);
        unreachable!("the all-reduce cannot complete without rank 1");
    }
    let Some((output, took)) =
        launch("a_stalled_peer_ends_the_job_within_the_timeout_naming_the_call", 2)
    else {
        return;
    };
    let text = text(&output);
    assert!(!output.status.success(), "{text}");
    assert!(
        text.contains(
            "rank 0 of 2: all_reduce of 4000 bytes did not complete within 2s (waiting for every rank to arrive"
        ),
        "{text}"
    );
    // Start-up, a 2 s timeout and the launcher's clean-up; far below the 120 s stall.
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{text}");
}

#[test]
fn a_killed_peer_ends_every_other_rank() {
    if is_rank() {
        let (_world, mut comm) = join(Duration::from_secs(60));
        let mut x = vec![1.0f32; 1 << 20];
        comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        if comm.rank() == 1 {
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill").args(["-9", &pid]).status();
        }
        let _ = comm.all_reduce(&mut x, ReduceOp::Sum);
        unreachable!("the all-reduce cannot complete without rank 1");
    }
    let Some((output, took)) = launch("a_killed_peer_ends_every_other_rank", 3) else {
        return;
    };
    let text = text(&output);
    assert!(!output.status.success(), "{text}");
    // The launcher sees the death and names the rank; the others end with the job, long
    // before the 60 s timeout.
    assert!(text.contains("rank 1") && text.contains("signal 9"), "{text}");
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{text}");
}
