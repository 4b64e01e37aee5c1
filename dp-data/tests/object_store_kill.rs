//! The object store killed at many points of a pipeline's reading (see tests/s3): with blocks
//! fetched ahead, more requests queued than may be in flight, and a cache a quarter of the
//! dataset's size, half of the points with a thread keeping a core busy. Every time, the read
//! ends with an error naming the object within the retry window and a margin, never hanging;
//! and once the server is back, the dataset reads as it did.

mod s3;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use dp_data::{ObjectOptions, Pipeline, PipelineConfig, set_object_options, upload_dataset};

/// The retry window of the reads (`DP_OBJECT_RETRY_SECONDS`).
const RETRY: Duration = Duration::from_secs(2);

/// What a read may take past the retry window: one last attempt, and the pipeline's error
/// reaching its consumer. A reader waiting on requests queued behind others, or on a block
/// that another worker retried already, took several windows.
const MARGIN: Duration = Duration::from_secs(10);

/// Points of the epoch at which the server is killed.
const KILLS: u64 = 20;

fn config() -> PipelineConfig {
    let mut c = PipelineConfig::default();
    c.batch_size = 32;
    c.workers = 2;
    c.prefetch = 1;
    c.seed = 5;
    c.shuffle_window = Some(2);
    // Smaller than the dataset: its blocks are read again each epoch.
    c.memory_budget = 192 << 10;
    c
}

#[test]
fn a_server_killed_at_any_point_fails_the_read_in_the_retry_window_and_serves_once_back() {
    let Some((mut server, _root)) = s3::start("object_store_kill") else { return };
    let local = tempfile::tempdir().unwrap();
    s3::dataset(local.path(), 4000);
    let url = server.url("kill/train");
    upload_dataset(local.path(), &url).unwrap();
    let dataset_bytes: u64 = std::fs::read_dir(local.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let cache = tempfile::tempdir().unwrap();
    let mut options = ObjectOptions::from_env().unwrap();
    options.cache_dir = cache.path().to_path_buf();
    options.cache_limit = dataset_bytes / 4;
    options.retry_for = RETRY;
    // Set before this process's first remote read, which sizes the fetcher: a queue of
    // requests longer than those in flight when the server goes.
    options.ahead_bytes = 256 << 10;
    options.requests = 1;
    set_object_options(options);

    let per_epoch = Pipeline::new(local.path(), config(), vec![]).unwrap().batches_per_epoch();
    let mut longest = Duration::ZERO;
    for kill in 0..KILLS {
        let at = kill * per_epoch / KILLS;
        let loaded = kill % 2 == 1;
        let what =
            format!("kill {kill} (after batch {at}{})", if loaded { ", loaded" } else { "" });
        if kill > 0 {
            server.restart().unwrap();
        }
        let busy = Arc::new(AtomicBool::new(true));
        let spinner = loaded.then(|| {
            let busy = Arc::clone(&busy);
            std::thread::spawn(move || {
                let mut x = 1u64;
                while busy.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005) + 1);
                }
            })
        });
        let (reached, reaching) = mpsc::channel();
        let reader = {
            let url = url.clone();
            std::thread::spawn(move || read_until_error(&url, at, 10 * per_epoch, &reached))
        };
        match reaching.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => {}
            Err(RecvTimeoutError::Disconnected) => {
                panic!("{what}: failed before the kill: {}", reader.join().unwrap())
            }
            Err(RecvTimeoutError::Timeout) => panic!("{what}: the batch never came"),
        }
        server.kill();
        let killed = Instant::now();
        // Polled, never joined blindly: a read that hangs fails the test instead of hanging it.
        while !reader.is_finished() {
            assert!(
                killed.elapsed() < RETRY + MARGIN,
                "{what}: the read has not ended {:.1} s after the kill (retry window {:.0} s)",
                killed.elapsed().as_secs_f64(),
                RETRY.as_secs_f64()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = killed.elapsed();
        busy.store(false, Ordering::Relaxed);
        if let Some(spinner) = spinner {
            spinner.join().unwrap();
        }
        let error = reader.join().unwrap();
        assert!(
            error.contains(&format!("{url}/")) && error.contains("DP_OBJECT_RETRY_SECONDS"),
            "{what}: {error}"
        );
        longest = longest.max(took);
        eprintln!("{what}: the read ended {:.1} s after the kill: {error}", took.as_secs_f64());
    }
    eprintln!(
        "{KILLS} of {KILLS} kills ended the read, the longest {:.1} s after the kill (retry \
         window {:.0} s)",
        longest.as_secs_f64(),
        RETRY.as_secs_f64()
    );

    // Back: an epoch reads as the local dataset's, whatever failed before.
    server.restart().unwrap();
    let mut reference = Pipeline::new(local.path(), config(), vec![]).unwrap();
    let mut remote = Pipeline::new(Path::new(&url), config(), vec![]).unwrap();
    for i in 0..per_epoch {
        let (a, b) = (reference.next_batch().unwrap(), remote.next_batch().unwrap());
        assert_eq!((a.record_ids(), a.x_flat()), (b.record_ids(), b.x_flat()), "batch {i}");
    }
}

/// Reads the dataset at `url` until a read fails, saying when batch `at` is in; returns the
/// error (or says that none came in `most` batches).
fn read_until_error(url: &str, at: u64, most: u64, reached: &mpsc::Sender<()>) -> String {
    let mut pipeline = match Pipeline::new(Path::new(url), config(), vec![]) {
        Ok(pipeline) => pipeline,
        Err(error) => return error.to_string(),
    };
    for i in 0..most {
        match pipeline.next_batch() {
            Ok(_) if i == at => {
                let _ = reached.send(());
            }
            Ok(_) => {}
            Err(error) => return error.to_string(),
        }
    }
    format!("no read failed in {most} batches")
}
