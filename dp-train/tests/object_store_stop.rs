//! A run asked to stop (SIGTERM, Ctrl-C: `RunOptions::stop`) while its data is stuck on an
//! object store that is gone (s3s-fs on 127.0.0.1, killed; a retry window of ten minutes)
//! ends within the replicas' grace for a batch, with an error that says so and a checkpoint
//! to resume from, instead of waiting out the retry window.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{TempDir, config, run_dir};
use dp_data::{LocalS3, ObjectOptions, set_object_options, upload_dataset};
use dp_train::{Observer, RunOptions, StepMetrics, TrainConfig, train};

/// Kills the server once a step has been seen, and notes when the latest step came.
struct KillAfter {
    step: u64,
    server: LocalS3,
    latest: Arc<Mutex<Option<Instant>>>,
}

impl Observer for KillAfter {
    fn step(&mut self, metrics: &StepMetrics) {
        if metrics.step == self.step {
            self.server.kill();
        }
        if metrics.step >= self.step {
            *self.latest.lock().unwrap() = Some(Instant::now());
        }
    }
}

#[test]
fn a_run_asked_to_stop_while_its_data_is_stuck_ends_with_an_error_and_a_checkpoint() {
    if LocalS3::binary().is_none() {
        assert!(std::env::var_os("DP_REQUIRE_S3").is_none(), "DP_REQUIRE_S3: s3s-fs is missing");
        eprintln!("skipped: s3s-fs is not installed (bash scripts/setup-s3.sh)");
        return;
    }
    let out = TempDir::new("objects-stop");
    let server = LocalS3::start(&out.0.join("server")).unwrap();
    let url = server.url("digits/train");
    upload_dataset(&common::digits().join("train"), &url).unwrap();
    // No cache, so that every block comes from the server, which is then retried for longer
    // than the test may take.
    let mut options = ObjectOptions::from_env().unwrap();
    options.cache_limit = 0;
    options.retry_for = Duration::from_secs(600);
    set_object_options(options);

    let remote = TrainConfig {
        train_data: url.clone().into(),
        eval_data: None,
        // Longer than the test may take, so that it is not what ends the run.
        timeout_s: 600.0,
        ..config(2, 100_000)
    };
    let runs = out.0.join("remote");
    let stop = Arc::new(AtomicBool::new(false));
    let latest = Arc::new(Mutex::new(None));
    let run = {
        let options = RunOptions { stop: Arc::clone(&stop), ..RunOptions::new(&runs) };
        let mut killer = KillAfter { step: 3, server, latest: Arc::clone(&latest) };
        std::thread::spawn(move || train(remote, &options, &mut killer))
    };
    // Stuck: no step for two seconds after the kill (a step takes milliseconds).
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < Duration::from_secs(120), "the run never got stuck");
        assert!(!run.is_finished(), "the run ended before the stop: {:?}", run.join().unwrap());
        if latest.lock().unwrap().is_some_and(|at| at.elapsed() > Duration::from_secs(2)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let asked = Instant::now();
    // Polled, never joined blindly: a run that hangs fails the test instead of hanging it.
    while !run.is_finished() {
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "the run has not ended {:.0} s after the stop",
            asked.elapsed().as_secs_f64()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = asked.elapsed();
    let error = run.join().unwrap().unwrap_err().to_string();
    assert!(error.contains("stopped as asked") && error.contains(&url), "{error}");
    assert!(run_dir(&runs).join(dp_train::CHECKPOINT).is_file(), "no checkpoint to resume from");
    eprintln!("ended {:.1} s after the stop: {error}", took.as_secs_f64());
}
