//! The local cache of fetched blocks: one file per block, least recently used evicted, its
//! files never more than the limit in all, shared safely by the processes of a host.
//!
//! The processes that share a cache directory agree on its size through two files: `lock`,
//! held (flock) while the size changes, and `usage`, the bytes its files take. A block is
//! written by reserving its size (evicting the least recently used files first when the
//! reservation would pass the limit), creating its temporary file at full length, and renaming
//! it into place, so the files never take more than `usage` says and `usage` never passes the
//! limit. Sizes are counted in whole 4 KiB pages, as the file system allocates them. Nothing
//! waits on the cache: a block that does not fit is used and not kept, so a limit smaller than
//! an epoch (or than one block) slows reading down but never stops it. Each block read back is
//! checked against its CRC32C; a damaged one is removed and fetched again.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use super::stats::{COUNTERS, add};
use crate::checksum;
use crate::error::{Error, Result};

/// Files are counted in pages of this size.
const PAGE: u64 = 4096;

/// Evicting frees this share of the limit beyond what the new block needs, so that a full
/// cache lists its files once per tenth of the limit written, not once per block.
const HEADROOM: u64 = 10;

/// A temporary file this old belongs to a writer that died: removed by the next eviction.
const STALE: Duration = Duration::from_secs(600);

/// An open cache directory.
pub(crate) struct BlockCache {
    blocks: PathBuf,
    limit: u64,
    lock: File,
    usage_path: PathBuf,
    /// flock excludes other processes; this, the other threads of this one (they share the
    /// lock file's description, which flock does not tell apart).
    local: Mutex<()>,
    temp_counter: AtomicU64,
}

fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE) * PAGE
}

impl BlockCache {
    /// Opens (creating) the cache in `dir` with `limit` bytes at most, and brings it under the
    /// limit (it may have been used with a larger one, or by a process that died mid-write).
    pub(crate) fn open(dir: &Path, limit: u64) -> Result<Self> {
        let blocks = dir.join("blocks");
        fs::create_dir_all(&blocks).map_err(|e| Error::io(&blocks, "create the cache", e))?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io(&lock_path, "open", e))?;
        let cache = BlockCache {
            blocks,
            limit,
            lock,
            usage_path: dir.join("usage"),
            local: Mutex::new(()),
            temp_counter: AtomicU64::new(0),
        };
        let guard = cache.locked()?;
        let usage = cache.evict(limit, 0)?;
        cache.set_usage(usage)?;
        drop(guard);
        Ok(cache)
    }

    /// Whether the cache holds block `name` (unchecked).
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.blocks.join(name).exists()
    }

    /// Block `name`'s bytes if the cache holds them and they match `crc`. A damaged copy is
    /// removed.
    pub(crate) fn get(&self, name: &str, crc: u32) -> Option<Vec<u8>> {
        let path = self.blocks.join(name);
        let mut file = File::open(&path).ok()?;
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            return None;
        }
        if checksum::crc32c(&bytes) != crc {
            add(&COUNTERS.cache_damaged, 1);
            if let Ok(_guard) = self.locked() {
                let _ = fs::remove_file(&path);
            }
            return None;
        }
        // Its time of use, for eviction (a failure leaves it older than it is, no more).
        let _ = file.set_modified(SystemTime::now());
        add(&COUNTERS.cache_hits, 1);
        Some(bytes)
    }

    /// Keeps `bytes` as block `name` when they fit under the limit. Failures are counted and
    /// otherwise ignored: the block is in memory, and the cache only saves fetching it again.
    pub(crate) fn put(&self, name: &str, bytes: &[u8]) {
        if let Err(e) = self.try_put(name, bytes)
            && COUNTERS.cache_errors.fetch_add(1, Ordering::Relaxed) == 0
        {
            eprintln!("warning: the object cache could not keep a block: {e}");
        }
    }

    fn try_put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let size = pages(bytes.len() as u64);
        if size > self.limit {
            return Ok(());
        }
        let path = self.blocks.join(name);
        let temp = self.blocks.join(format!(
            "{name}.tmp.{}.{}",
            std::process::id(),
            self.temp_counter.fetch_add(1, Ordering::Relaxed)
        ));
        let mut file = {
            let _guard = self.locked()?;
            if path.exists() {
                return Ok(());
            }
            let mut usage = self.usage()?;
            if usage + size > self.limit {
                let free_to = self.limit.saturating_sub(size + self.limit / HEADROOM);
                usage = self.evict(free_to, size)?;
            }
            if usage + size > self.limit {
                return Ok(());
            }
            let file = File::create(&temp).map_err(|e| Error::io(&temp, "create", e))?;
            // At its full size now, so that a listing counts it as the reservation does.
            file.set_len(bytes.len() as u64).map_err(|e| Error::io(&temp, "size", e))?;
            self.set_usage(usage + size)?;
            file
        };
        let written = file.write_all(bytes).map_err(|e| Error::io(&temp, "write", e));
        let moved = written.and_then(|()| {
            fs::rename(&temp, &path).map_err(|e| Error::io(&path, "rename into place", e))
        });
        if moved.is_err() {
            let _guard = self.locked()?;
            if fs::remove_file(&temp).is_ok() {
                let usage = self.usage()?;
                self.set_usage(usage.saturating_sub(size))?;
            }
        }
        moved
    }

    /// Under the lock: lists the files, removes dead writers' temporary files and then the
    /// least recently used blocks until their total is at most `target` (when it is over
    /// `limit - need`); returns the total left.
    fn evict(&self, target: u64, need: u64) -> Result<u64> {
        let list = fs::read_dir(&self.blocks).map_err(|e| Error::io(&self.blocks, "list", e))?;
        let now = SystemTime::now();
        let mut files = Vec::new();
        let mut total = 0;
        for entry in list {
            let entry = entry.map_err(|e| Error::io(&self.blocks, "list", e))?;
            let Ok(meta) = entry.metadata() else { continue };
            let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let temporary = entry.file_name().to_string_lossy().contains(".tmp.");
            let age = now.duration_since(used).unwrap_or_default();
            if temporary && age > STALE {
                let _ = fs::remove_file(entry.path());
                continue;
            }
            total += pages(meta.len());
            if !temporary {
                files.push((used, entry.path(), pages(meta.len())));
            }
        }
        if total + need <= self.limit {
            return Ok(total);
        }
        files.sort();
        for (_, path, size) in files {
            if total <= target {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= size;
                add(&COUNTERS.evicted, 1);
            }
        }
        Ok(total)
    }

    /// Holds the cache's lock, against this process's threads and the other processes.
    fn locked(&self) -> Result<CacheLock<'_>> {
        let local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        self.lock.lock().map_err(|e| Error::io(&self.usage_path, "lock the cache", e))?;
        Ok(CacheLock { cache: self, _local: local })
    }

    fn usage(&self) -> Result<u64> {
        match fs::read(&self.usage_path) {
            Ok(bytes) if bytes.len() == 8 => {
                Ok(u64::from_le_bytes(bytes.try_into().unwrap_or_default()))
            }
            // Missing or torn: count the files again.
            Ok(_) => self.evict(u64::MAX, 0),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.evict(u64::MAX, 0),
            Err(e) => Err(Error::io(&self.usage_path, "read", e)),
        }
    }

    fn set_usage(&self, bytes: u64) -> Result<()> {
        fs::write(&self.usage_path, bytes.to_le_bytes())
            .map_err(|e| Error::io(&self.usage_path, "write", e))
    }
}

/// The cache's lock, released when dropped.
struct CacheLock<'a> {
    cache: &'a BlockCache,
    _local: MutexGuard<'a, ()>,
}

impl Drop for CacheLock<'_> {
    fn drop(&mut self) {
        let _ = self.cache.lock.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk_use(dir: &Path) -> u64 {
        fs::read_dir(dir.join("blocks"))
            .unwrap()
            .map(|e| pages(e.unwrap().metadata().unwrap().len()))
            .sum()
    }

    #[test]
    fn blocks_come_back_checked_and_the_files_never_pass_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlockCache::open(dir.path(), 40 * PAGE).unwrap();
        let block = |i: u8| vec![i; 3 * PAGE as usize + 1];
        for i in 0..30u8 {
            cache.put(&format!("b{i}"), &block(i));
            assert!(disk_use(dir.path()) <= 40 * PAGE, "after block {i}");
            let crc = checksum::crc32c(&block(i));
            assert_eq!(cache.get(&format!("b{i}"), crc), Some(block(i)));
        }
        // The oldest went first; the newest are there.
        let crc = |i: u8| checksum::crc32c(&block(i));
        assert_eq!(cache.get("b0", crc(0)), None);
        assert_eq!(cache.get("b29", crc(29)), Some(block(29)));
        // A damaged file is not returned, and is removed.
        fs::write(dir.path().join("blocks/b29"), b"rot").unwrap();
        assert_eq!(cache.get("b29", crc(29)), None);
        assert!(!dir.path().join("blocks/b29").exists());
        // A block larger than the limit is not kept, and nothing else is lost for it.
        let held = disk_use(dir.path());
        cache.put("huge", &vec![1; 41 * PAGE as usize]);
        assert_eq!(disk_use(dir.path()), held);
    }

    #[test]
    fn reopening_with_a_smaller_limit_evicts_down_to_it_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlockCache::open(dir.path(), 100 * PAGE).unwrap();
        for i in 0..20u8 {
            cache.put(&format!("b{i}"), &[i; PAGE as usize]);
            // Distinct times of use, oldest first.
            let path = dir.path().join(format!("blocks/b{i}"));
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + u64::from(i));
            File::options().write(true).open(path).unwrap().set_modified(at).unwrap();
        }
        drop(cache);
        let cache = BlockCache::open(dir.path(), 8 * PAGE).unwrap();
        assert!(disk_use(dir.path()) <= 8 * PAGE);
        assert_eq!(
            cache.get("b19", checksum::crc32c(&[19; PAGE as usize])),
            Some(vec![19; PAGE as usize])
        );
        assert_eq!(cache.get("b0", checksum::crc32c(&[0; PAGE as usize])), None);
    }
}
