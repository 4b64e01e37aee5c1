//! Training from object storage, against an S3-compatible server on 127.0.0.1 (s3s-fs,
//! scripts/setup-s3.sh): a server that dies for good mid-run fails the run, naming the object,
//! with a checkpoint to resume from; resumed with the server back, the run takes every step
//! as an uninterrupted run from local disk does, loss for loss.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{TempDir, config, run_dir, train_losses};
use dp_data::{LocalS3, ObjectOptions, set_object_options, upload_dataset};
use dp_train::{Observer, RunOptions, StepMetrics, TrainConfig, train};

/// Kills the server once a step has been seen.
struct KillAfter<'a> {
    step: u64,
    server: &'a mut LocalS3,
}

impl Observer for KillAfter<'_> {
    fn step(&mut self, metrics: &StepMetrics) {
        if metrics.step == self.step {
            self.server.kill();
        }
    }
}

#[test]
fn a_run_whose_server_dies_fails_with_a_checkpoint_and_resumes_as_if_uninterrupted() {
    if LocalS3::binary().is_none() {
        assert!(std::env::var_os("DP_REQUIRE_S3").is_none(), "DP_REQUIRE_S3: s3s-fs is missing");
        eprintln!("skipped: s3s-fs is not installed (bash scripts/setup-s3.sh)");
        return;
    }
    let out = TempDir::new("objects");
    let mut server = LocalS3::start(&out.0.join("server")).unwrap();
    let url = server.url("digits/train");
    upload_dataset(&common::digits().join("train"), &url).unwrap();
    // No cache, so that every block comes from the server; a short retry window.
    let mut options = ObjectOptions::from_env().unwrap();
    options.cache_limit = 0;
    options.retry_for = Duration::from_secs(1);
    set_object_options(options);
    let steps = 48;
    let local = out.0.join("local");
    train(TrainConfig { eval_data: None, ..config(2, steps) }, &RunOptions::new(&local), &mut ())
        .unwrap();

    let remote =
        TrainConfig { train_data: url.clone().into(), eval_data: None, ..config(2, steps) };
    let runs = out.0.join("remote");
    let mut killer = KillAfter { step: 3, server: &mut server };
    let error = train(remote, &RunOptions::new(&runs), &mut killer).unwrap_err().to_string();
    assert!(error.contains(&url) && error.contains("retrying"), "{error}");
    let dir = run_dir(&runs);
    assert!(dir.join(dp_train::CHECKPOINT).is_file(), "no checkpoint to resume from");

    server.restart().unwrap();
    let resume = RunOptions { resume: Some(dir.clone()), ..RunOptions::new(&runs) };
    let resumed = train(TrainConfig::default(), &resume, &mut ()).unwrap();
    assert_eq!(resumed.steps, steps);
    let bits = |dir: &Path| -> Vec<(u64, u64)> {
        train_losses(dir).into_iter().map(|(s, l)| (s, l.to_bits())).collect()
    };
    assert_eq!(bits(&dir), bits(&run_dir(&local)), "every step once, as from local disk");
}
