//! Reading a remote shard's blocks: from what was fetched ahead, else from the local cache,
//! else with a ranged GET. Fetching ahead coalesces neighbouring blocks into one request,
//! keeps up to `ObjectOptions::requests` requests in flight and at most
//! `ObjectOptions::ahead_bytes` fetched bytes waiting in memory.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

use bytes::Bytes;
use dp_mem::{Reservation, Tag, Tracker};

use super::cache::BlockCache;
use super::object::RemoteObject;
use super::options::object_options;
use super::runtime::runtime;
use super::stats::{COUNTERS, add};
use crate::error::{Error, Result};
use crate::shard::{BLOCK_HEADER_LEN, BlockEntry};

/// A run of neighbouring blocks is fetched in one request up to this size.
const MOST_PER_REQUEST: u64 = 8 << 20;

/// A shard in object storage, read block by block.
pub(crate) struct RemoteBlocks {
    object: RemoteObject,
    /// The ETag the manifest recorded at upload, which every answer must carry.
    etag: Option<String>,
    /// The shard's name in the cache and among the fetched blocks: its URL's and its
    /// content's CRC32C, so that a changed shard never meets its old blocks.
    key: Arc<str>,
    cache: Option<Arc<BlockCache>>,
}

/// A block fetched ahead, or being fetched, with its bytes accounted in
/// [`fetched_ahead_memory`] until a reader takes them or they are dropped for room.
enum Slot {
    Fetching(Reservation),
    Landed {
        bytes: Bytes,
        _accounted: Reservation,
    },
    /// The fetch failed: the reader fetches again itself, and reports what it meets.
    Failed,
}

#[derive(Default)]
struct Ahead {
    slots: HashMap<(Arc<str>, usize), Slot>,
    /// Bytes in `Fetching` and `Landed` slots.
    held: u64,
    /// Landed and failed blocks, oldest first (some may have been taken since).
    landed: VecDeque<(Arc<str>, usize)>,
}

impl Ahead {
    /// Puts `slot` (landed or failed) under `key`, the newest to be dropped for room.
    fn land(&mut self, key: (Arc<str>, usize), slot: Slot) {
        self.slots.insert(key.clone(), slot);
        self.landed.push_back(key);
        // Forgets the blocks taken since they landed once they are most of the queue: it
        // would otherwise grow by a key per block read while memory never runs short.
        if self.landed.len() > 2 * self.slots.len() + 64 {
            let slots = &self.slots;
            self.landed
                .retain(|k| matches!(slots.get(k), Some(Slot::Landed { .. } | Slot::Failed)));
        }
    }
}

/// The blocks fetched ahead, for every remote dataset of the process.
struct Fetcher {
    ahead: Mutex<Ahead>,
    changed: Condvar,
    limit: u64,
    requests: Arc<tokio::sync::Semaphore>,
}

/// The process's fetcher, sized by the object storage settings in force at its first use
/// (settings that do not parse were refused already, when the dataset was opened).
fn fetcher() -> &'static Fetcher {
    static FETCHER: OnceLock<Fetcher> = OnceLock::new();
    FETCHER.get_or_init(|| {
        let (limit, requests) =
            object_options().map_or((64 << 20, 16), |o| (o.ahead_bytes, o.requests));
        Fetcher {
            ahead: Mutex::new(Ahead::default()),
            changed: Condvar::new(),
            limit,
            requests: Arc::new(tokio::sync::Semaphore::new(requests.max(1))),
        }
    })
}

/// The most bytes of blocks fetched ahead held in memory: the process's, for all its remote
/// datasets (`ObjectOptions::ahead_bytes` in force at the first fetch).
pub fn fetch_ahead_limit() -> u64 {
    fetcher().limit
}

/// Accounts the blocks fetched ahead and not yet read, in the process (tag `Data`): what a
/// run adds to its own accounting, since no pipeline's pool holds them.
pub fn fetched_ahead_memory() -> &'static Tracker {
    static TRACKER: OnceLock<Tracker> = OnceLock::new();
    TRACKER.get_or_init(Tracker::new)
}

impl Fetcher {
    fn lock(&self) -> MutexGuard<'_, Ahead> {
        self.ahead.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The block fetched ahead under `key`, waiting while it is on its way; `None` when it was
    /// not fetched ahead or its fetch failed.
    fn take(&self, key: &(Arc<str>, usize)) -> Option<Bytes> {
        let mut ahead = self.lock();
        loop {
            match ahead.slots.get(key) {
                None => return None,
                Some(Slot::Fetching(_)) => {
                    ahead = self.changed.wait(ahead).unwrap_or_else(PoisonError::into_inner);
                }
                Some(Slot::Landed { .. } | Slot::Failed) => {
                    return match ahead.slots.remove(key) {
                        Some(Slot::Landed { bytes, .. }) => {
                            ahead.held -= bytes.len() as u64;
                            Some(bytes)
                        }
                        _ => None,
                    };
                }
            }
        }
    }

    /// Makes room for `bytes` more by dropping the oldest landed blocks (they are in the
    /// cache, when it had room); false when the blocks in flight alone leave none.
    fn room(&self, ahead: &mut Ahead, bytes: u64) -> bool {
        while ahead.held + bytes > self.limit {
            let Some(key) = ahead.landed.pop_front() else { return false };
            match ahead.slots.get(&key) {
                Some(Slot::Landed { bytes: old, .. }) => {
                    ahead.held -= old.len() as u64;
                    ahead.slots.remove(&key);
                }
                // A failure nobody came to read: its reader has moved on.
                Some(Slot::Failed) => {
                    ahead.slots.remove(&key);
                }
                _ => {}
            }
        }
        true
    }
}

/// The cache directory of each (directory, limit) this process opened, shared.
pub(crate) fn open_cache() -> Result<Option<Arc<BlockCache>>> {
    static CACHES: Mutex<Vec<(PathBuf, u64, Arc<BlockCache>)>> = Mutex::new(Vec::new());
    let options = object_options()?;
    if options.cache_limit == 0 {
        return Ok(None);
    }
    let mut caches = CACHES.lock().unwrap_or_else(PoisonError::into_inner);
    let key = (options.cache_dir.clone(), options.cache_limit);
    if let Some((_, _, cache)) = caches.iter().find(|(d, l, _)| (d, *l) == (&key.0, key.1)) {
        return Ok(Some(Arc::clone(cache)));
    }
    let cache = Arc::new(BlockCache::open(&key.0, key.1)?);
    caches.push((key.0, key.1, Arc::clone(&cache)));
    Ok(Some(cache))
}

impl RemoteBlocks {
    pub(crate) fn new(
        object: RemoteObject,
        etag: Option<String>,
        key: String,
        cache: Option<Arc<BlockCache>>,
    ) -> Self {
        RemoteBlocks { object, etag, key: key.into(), cache }
    }

    /// The object's URL.
    pub(crate) fn url(&self) -> &str {
        self.object.url()
    }

    /// Bytes `range` of the shard (its header and index, when opening it).
    pub(crate) fn get_range(&self, range: std::ops::Range<u64>) -> Result<Bytes> {
        self.object.get_range(range, self.etag.as_deref())
    }

    /// The whole shard, in the pieces it arrives in.
    pub(crate) fn stream(&self, each: &mut dyn FnMut(&[u8])) -> Result<()> {
        self.object.stream(self.etag.as_deref(), each)
    }

    fn cache_name(&self, index: usize) -> String {
        format!("{}-{index}", self.key)
    }

    /// Block `index`'s compressed bytes (after its header, which is checked against the
    /// index).
    pub(crate) fn payload(&self, index: usize, entry: &BlockEntry) -> Result<Bytes> {
        if let Some(bytes) = fetcher().take(&(Arc::clone(&self.key), index)) {
            return Ok(bytes);
        }
        if let Some(cache) = &self.cache
            && let Some(bytes) = cache.get(&self.cache_name(index), entry.crc)
        {
            return Ok(Bytes::from(bytes));
        }
        add(&COUNTERS.cache_misses, 1);
        let end = entry.offset + BLOCK_HEADER_LEN + entry.compressed;
        let bytes = self.get_range(entry.offset..end)?;
        self.split(index, entry, &bytes)
    }

    /// Checks a fetched block's header against the index and keeps its payload in the
    /// cache when its CRC32C holds.
    fn split(&self, index: usize, entry: &BlockEntry, bytes: &Bytes) -> Result<Bytes> {
        let header = BLOCK_HEADER_LEN as usize;
        if bytes.len() < header || bytes[..header] != entry.header() {
            return Err(Error::corrupt(
                self.url(),
                entry.offset,
                format!("block {index} header does not match the index"),
            ));
        }
        let payload = bytes.slice(header..);
        if let Some(cache) = &self.cache
            && crate::checksum::crc32c(&payload) == entry.crc
        {
            cache.put(&self.cache_name(index), &payload);
        }
        Ok(payload)
    }

    /// Starts fetching the blocks `blocks` (`(index, entry)` in index order) that are neither
    /// cached nor fetched or on their way, as far as the memory for blocks fetched ahead
    /// allows; neighbours go in one request.
    pub(crate) fn prefetch(self: &Arc<Self>, blocks: &[(usize, BlockEntry)]) -> Result<()> {
        let fetcher = fetcher();
        let wanted: Vec<(usize, BlockEntry)> = blocks
            .iter()
            .filter(|(i, _)| self.cache.as_ref().is_none_or(|c| !c.contains(&self.cache_name(*i))))
            .copied()
            .collect();
        let mut runs: Vec<Vec<(usize, BlockEntry)>> = Vec::new();
        {
            let mut ahead = fetcher.lock();
            for (index, entry) in wanted {
                let key = (Arc::clone(&self.key), index);
                if ahead.slots.contains_key(&key) {
                    continue;
                }
                if !fetcher.room(&mut ahead, entry.compressed) {
                    break;
                }
                let accounted = fetched_ahead_memory().reserve(Tag::Data, entry.compressed)?;
                ahead.held += entry.compressed;
                ahead.slots.insert(key, Slot::Fetching(accounted));
                let joins = runs.last().and_then(|run| run.last()).is_some_and(|(i, last)| {
                    *i + 1 == index
                        && last.offset + BLOCK_HEADER_LEN + last.compressed == entry.offset
                });
                let size = |run: &Vec<(usize, BlockEntry)>| {
                    run.iter().map(|(_, e)| BLOCK_HEADER_LEN + e.compressed).sum::<u64>()
                };
                match runs.last_mut() {
                    Some(run) if joins && size(run) + entry.compressed <= MOST_PER_REQUEST => {
                        run.push((index, entry));
                    }
                    _ => runs.push(vec![(index, entry)]),
                }
            }
        }
        let runtime = runtime()?;
        for run in runs {
            add(&COUNTERS.fetched_ahead, run.len() as u64);
            let shard = Arc::clone(self);
            let requests = Arc::clone(&fetcher.requests);
            runtime.spawn(async move {
                let _permit = requests.acquire().await;
                let (first, last) = (run[0].1, run[run.len() - 1].1);
                let range = first.offset..last.offset + BLOCK_HEADER_LEN + last.compressed;
                let fetched = shard.object.get_async(Some(range), shard.etag.as_deref()).await;
                let mut landed = Vec::with_capacity(run.len());
                for (index, entry) in &run {
                    let at = (entry.offset - first.offset) as usize;
                    let end = at + (BLOCK_HEADER_LEN + entry.compressed) as usize;
                    let split = fetched
                        .as_ref()
                        .ok()
                        .and_then(|bytes| shard.split(*index, entry, &bytes.slice(at..end)).ok());
                    landed.push((*index, entry.compressed, split));
                }
                let mut ahead = fetcher.lock();
                for (index, size, bytes) in landed {
                    let key = (Arc::clone(&shard.key), index);
                    let Some(Slot::Fetching(accounted)) = ahead.slots.remove(&key) else {
                        unreachable!("only this fetch lands a fetching slot");
                    };
                    ahead.held -= size;
                    match bytes {
                        // The payload is the block's compressed bytes, as accounted.
                        Some(bytes) => {
                            ahead.held += bytes.len() as u64;
                            ahead.land(key, Slot::Landed { bytes, _accounted: accounted });
                        }
                        None => ahead.land(key, Slot::Failed),
                    }
                }
                drop(ahead);
                fetcher.changed.notify_all();
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_of_landed_blocks_forgets_those_taken() {
        let mut ahead = Ahead::default();
        let shard: Arc<str> = "shard".into();
        for index in 0..10_000 {
            let key = (Arc::clone(&shard), index);
            ahead.land(key.clone(), Slot::Failed);
            // Every other block is read: its slot goes, its key stays queued for a while.
            if index % 2 == 0 {
                ahead.slots.remove(&key);
            }
            assert!(ahead.landed.len() <= 2 * ahead.slots.len() + 65, "{}", ahead.landed.len());
        }
        // The blocks not read are all still there, oldest first.
        let queued: Vec<usize> =
            ahead.landed.iter().map(|(_, i)| *i).filter(|i| i % 2 == 1).collect();
        assert_eq!(queued, (1..10_000).step_by(2).collect::<Vec<_>>());
    }
}
