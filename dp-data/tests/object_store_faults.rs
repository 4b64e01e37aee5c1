//! Object storage faults against a real S3-compatible server (see tests/s3): the server killed
//! mid-epoch and started again is retried through, counted, and the epoch is the same as an
//! uninterrupted one; a server that stays down fails the read within the retry window, naming
//! the object, never hanging.

mod s3;

use std::path::Path;
use std::time::{Duration, Instant};

use dp_data::{
    ObjectOptions, Pipeline, PipelineConfig, object_stats, set_object_options, upload_dataset,
};

fn config() -> PipelineConfig {
    let mut c = PipelineConfig::default();
    c.batch_size = 32;
    c.workers = 2;
    c.prefetch = 1;
    c.seed = 9;
    c.shuffle_window = Some(2);
    c.memory_budget = 64 << 20;
    c
}

#[test]
fn a_server_that_dies_is_retried_through_and_one_that_stays_down_fails_the_read() {
    let Some((server, _root)) = s3::start("object_store_faults") else { return };
    let local = tempfile::tempdir().unwrap();
    s3::dataset(local.path(), 4000);
    let url = server.url("faults/train");
    upload_dataset(local.path(), &url).unwrap();
    // No cache: every block comes from the server.
    let mut options = ObjectOptions::from_env().unwrap();
    options.cache_limit = 0;
    options.retry_for = Duration::from_secs(30);
    set_object_options(options.clone());

    // A budget smaller than the dataset, so that its blocks are read again each epoch: the
    // workers may have fetched the whole epoch ahead before the server goes.
    let mut small = config();
    small.memory_budget = 192 << 10;
    let mut reference = Pipeline::new(local.path(), small.clone(), vec![]).unwrap();
    let mut remote = Pipeline::new(Path::new(&url), small.clone(), vec![]).unwrap();
    let batches = 2 * reference.batches_per_epoch();
    let (mut server, mut restart) = (Some(server), None);
    let retried = object_stats().retries;
    for i in 0..batches {
        if i == batches / 6 {
            // Down until a read has been retried, then back.
            let mut server = server.take().expect("one kill");
            server.kill();
            restart = Some(std::thread::spawn(move || {
                let started = Instant::now();
                while object_stats().retries == retried && started.elapsed().as_secs() < 60 {
                    std::thread::sleep(Duration::from_millis(10));
                }
                server.restart().unwrap();
                server
            }));
        }
        let (a, b) = (reference.next_batch().unwrap(), remote.next_batch().unwrap());
        assert_eq!((a.record_ids(), a.x_flat()), (b.record_ids(), b.x_flat()), "batch {i}");
    }
    let mut server = restart.expect("killed").join().unwrap();
    assert!(object_stats().retries > retried, "{:?}", object_stats());

    // Down for good, with a short retry window: the read fails, naming the object.
    options.retry_for = Duration::from_secs(2);
    set_object_options(options);
    // (A pipeline of the same dataset would share its decoded blocks with the new one.)
    drop(remote);
    let mut remote = Pipeline::new(Path::new(&url), small, vec![]).unwrap();
    server.kill();
    let started = Instant::now();
    let error = loop {
        match remote.next_batch() {
            Ok(_) => assert!(started.elapsed() < Duration::from_secs(60), "reads never failed"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(error.contains(&url) && error.contains("retrying"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
}
