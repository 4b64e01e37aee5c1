//! What a block cache's files take on disk, for the tests and benchmarks that hold the cache
//! to its limit while a pipeline reads (feature `bench`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes the files of the cache at `cache_dir` take, in whole 4 KiB pages as its limit counts
/// them, each file once: a listing taken while a temporary file is renamed into place may
/// name it twice.
pub fn cache_disk_use(cache_dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(list) = std::fs::read_dir(cache_dir.join("blocks")) else { return 0 };
    let files: std::collections::HashMap<u64, u64> = list
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| (m.ino(), m.len().div_ceil(4096) * 4096))
        .collect();
    files.values().sum()
}

/// Samples [`cache_disk_use`] every 100 ms on a thread of its own until [`CacheSampler::peak`].
pub struct CacheSampler {
    stop: Arc<AtomicBool>,
    sampler: JoinHandle<u64>,
}

impl CacheSampler {
    /// Starts sampling the cache at `cache_dir`.
    pub fn start(cache_dir: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, dir): (_, PathBuf) = (Arc::clone(&stop), cache_dir.to_path_buf());
        let sampler = std::thread::spawn(move || {
            let mut peak = 0;
            while !stopped.load(Ordering::Relaxed) {
                peak = peak.max(cache_disk_use(&dir));
                std::thread::sleep(Duration::from_millis(100));
            }
            peak.max(cache_disk_use(&dir))
        });
        CacheSampler { stop, sampler }
    }

    /// Stops sampling; the most bytes seen, a last sample included.
    pub fn peak(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.sampler.join().unwrap_or(u64::MAX)
    }
}
