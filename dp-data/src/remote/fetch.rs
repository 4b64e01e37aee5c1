//! Reading a remote shard's blocks: from what was fetched ahead, else from the local cache,
//! else with a ranged GET. Fetching ahead coalesces neighbouring blocks into one request,
//! keeps up to `ObjectOptions::requests` requests in flight and at most
//! `ObjectOptions::ahead_bytes` fetched bytes waiting in memory.
//!
//! No read waits longer than the retry window (and one last attempt) when the server goes
//! away: a reader's deadline is set when it starts, and bounds both its wait for a block on
//! its way and its own retries; each request fetching ahead is retried only within the window
//! from when it was asked for, its wait for a turn included; every slot a reader can wait on
//! is resolved when its request ends, however it ends (see [`Request`]); and a block whose
//! fetch has just failed after retrying is tried once more by its next readers, not for a
//! whole window each.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use dp_mem::{Reservation, Tag, Tracker};

use super::cache::BlockCache;
use super::object::{Patience, RemoteDir, RemoteObject, in_window};
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

/// A block of a shard: the shard's key and the block's index.
type Key = (Arc<str>, usize);

/// A block fetched ahead, or being fetched, with its bytes accounted in
/// [`fetched_ahead_memory`] until a reader takes them or they are dropped for room.
enum Slot {
    /// Being fetched by request `id`: a reader waiting on it stops when it is resolved, even if
    /// a later request of the same block has taken its place by the time the reader looks.
    Fetching {
        id: u64,
        _accounted: Reservation,
    },
    Landed {
        bytes: Bytes,
        _accounted: Reservation,
    },
}

#[derive(Default)]
struct Ahead {
    slots: HashMap<Key, Slot>,
    /// Bytes in `Fetching` and `Landed` slots.
    held: u64,
    /// Landed blocks, oldest first (some may have been taken since).
    landed: VecDeque<Key>,
    /// Blocks whose last fetch failed after retrying (for its window), with when that failure
    /// goes stale: until then a reader of one tries once more instead of waiting out another
    /// window, and fetching ahead leaves it alone.
    failed: HashMap<Key, Instant>,
    /// The last request's id.
    requests: u64,
}

/// What [`Fetcher::take`] found.
enum Found {
    Bytes(Bytes),
    /// A fetch of the block failed lately, after retrying.
    Failed,
    /// Not fetched ahead, or no longer waited for.
    Missing,
}

impl Ahead {
    /// Puts `bytes` under `key`, the newest to be dropped for room.
    fn land(&mut self, key: Key, bytes: Bytes, accounted: Reservation) {
        self.held += bytes.len() as u64;
        self.slots.insert(key.clone(), Slot::Landed { bytes, _accounted: accounted });
        self.landed.push_back(key);
        // Forgets the blocks taken since they landed once they are most of the queue: it
        // would otherwise grow by a key per block read while memory never runs short.
        if self.landed.len() > 2 * self.slots.len() + 64 {
            let slots = &self.slots;
            self.landed.retain(|k| matches!(slots.get(k), Some(Slot::Landed { .. })));
        }
    }

    /// Notes that a fetch of `key` failed after retrying, news until `until`.
    fn fail(&mut self, key: Key, until: Instant) {
        // Stale failures go once there are many: a map that only grows would otherwise keep
        // every block that ever failed.
        if self.failed.len() >= 1024 {
            let now = Instant::now();
            self.failed.retain(|_, until| *until > now);
        }
        self.failed.insert(key, until);
    }

    /// A server answered: the failures noted are news no more (it may be back), so that a
    /// server that goes away again is retried for a whole window again.
    fn answered(&mut self) {
        if !self.failed.is_empty() {
            self.failed.clear();
        }
    }

    fn failed_lately(&self, key: &Key) -> bool {
        self.failed.get(key).is_some_and(|until| *until > Instant::now())
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

    /// The block fetched ahead under `key`, waiting while the request fetching it is on its
    /// way, but not past `deadline`, nor once `object`'s reads are halted.
    fn take(&self, key: &Key, deadline: Instant, object: &RemoteObject) -> Found {
        let mut ahead = self.lock();
        let mut waiting_for = None;
        loop {
            if object.is_halted() {
                return Found::Missing;
            }
            match ahead.slots.get(key) {
                Some(Slot::Fetching { id, .. }) if waiting_for.is_none_or(|w| w == *id) => {
                    waiting_for = Some(*id);
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Found::Missing;
                    }
                    ahead = self
                        .changed
                        .wait_timeout(ahead, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                Some(Slot::Landed { .. }) => {
                    let Some(Slot::Landed { bytes, .. }) = ahead.slots.remove(key) else {
                        unreachable!("matched above");
                    };
                    ahead.held -= bytes.len() as u64;
                    return Found::Bytes(bytes);
                }
                // Not fetched ahead; or the request waited for ended without it (a later
                // one may have started since, which this reader does not wait for too).
                _ if ahead.failed_lately(key) => return Found::Failed,
                _ => return Found::Missing,
            }
        }
    }

    /// Makes room for `bytes` more by dropping the oldest landed blocks (they are in the
    /// cache, when it had room); false when the blocks in flight alone leave none.
    fn room(&self, ahead: &mut Ahead, bytes: u64) -> bool {
        while ahead.held + bytes > self.limit {
            let Some(key) = ahead.landed.pop_front() else { return false };
            if let Some(Slot::Landed { bytes: old, .. }) = ahead.slots.get(&key) {
                ahead.held -= old.len() as u64;
                ahead.slots.remove(&key);
            }
        }
        true
    }

    /// Resolves every slot `request` still holds: lands what it fetched, and notes a failed
    /// fetch; then wakes the readers.
    fn resolve(&self, request: &mut Request) {
        let outcome = std::mem::replace(&mut request.outcome, Outcome::Abandoned);
        let failed_until = in_window(Instant::now(), request.shard.object.retry_for());
        let none = || vec![None; request.blocks.len()];
        let (mut fetched, failed) = match outcome {
            Outcome::Fetched(blocks) => (blocks, false),
            Outcome::Failed => (none(), true),
            Outcome::Abandoned => (none(), false),
        };
        let mut ahead = self.lock();
        if !failed && fetched.iter().any(Option::is_some) {
            ahead.answered();
        }
        for ((index, entry), bytes) in request.blocks.iter().zip(fetched.iter_mut()) {
            let key = (Arc::clone(&request.shard.key), *index);
            // Only this request resolves its slots; the check keeps it from taking another's.
            if !matches!(ahead.slots.get(&key), Some(Slot::Fetching { id, .. }) if *id == request.id)
            {
                continue;
            }
            let Some(Slot::Fetching { _accounted: accounted, .. }) = ahead.slots.remove(&key)
            else {
                unreachable!("matched above");
            };
            ahead.held -= entry.compressed;
            match bytes.take() {
                // The payload is the block's compressed bytes, as accounted.
                Some(bytes) => ahead.land(key, bytes, accounted),
                None if failed => ahead.fail(key, failed_until),
                // Never sent, or its bytes did not match the index: its readers fetch it.
                None => {}
            }
        }
        drop(ahead);
        self.changed.notify_all();
    }
}

/// How a request of blocks fetched ahead ended.
enum Outcome {
    /// Each block's payload, or `None` when its header did not match the index.
    Fetched(Vec<Option<Bytes>>),
    /// The server failed it, after retrying.
    Failed,
    /// Never sent (its window passed while it waited for its turn), or ended without an
    /// answer: its task panicked, or was dropped with the runtime.
    Abandoned,
}

/// One request of neighbouring blocks fetched ahead, which holds their `Fetching` slots. It
/// resolves them when dropped, however its task ends (with the bytes, the server's error, a
/// panic, or dropped unpolled), so that no reader waits on a block that nobody fetches.
struct Request {
    shard: Arc<RemoteBlocks>,
    /// `(index, entry)` in index order, neighbours in the shard.
    blocks: Vec<(usize, BlockEntry)>,
    id: u64,
    outcome: Outcome,
}

impl Drop for Request {
    fn drop(&mut self) {
        fetcher().resolve(self);
    }
}

impl Request {
    /// Fetches the blocks, retried until `deadline` (whose window counts the wait for a turn
    /// among the requests in flight, so that a queue of them never holds a reader longer).
    async fn fetch(mut self, requests: Arc<tokio::sync::Semaphore>, deadline: Instant) {
        let turn = tokio::time::timeout_at(deadline.into(), requests.acquire_owned()).await;
        let Ok(Ok(_permit)) = turn else { return };
        let (first, last) = (self.blocks[0].1, self.blocks[self.blocks.len() - 1].1);
        let range = first.offset..last.offset + BLOCK_HEADER_LEN + last.compressed;
        let patience = Patience::ReadUntil(deadline);
        let shard = Arc::clone(&self.shard);
        let Ok(fetched) =
            shard.object.get_async(Some(range), shard.etag.as_deref(), patience).await
        else {
            self.outcome = Outcome::Failed;
            return;
        };
        let split = self.blocks.iter().map(|(index, entry)| {
            let at = (entry.offset - first.offset) as usize;
            let end = at + (BLOCK_HEADER_LEN + entry.compressed) as usize;
            shard.split(*index, entry, &fetched.slice(at..end)).ok()
        });
        self.outcome = Outcome::Fetched(split.collect());
    }
}

/// Wakes the readers waiting for blocks fetched ahead, to look again (their reads were halted).
fn wake_readers() {
    let fetcher = fetcher();
    // Taken, so that a reader between its look and its wait does not miss the wake-up.
    drop(fetcher.lock());
    fetcher.changed.notify_all();
}

/// Halts the reads of `dir`'s objects, those under way and every later one, and wakes the
/// readers waiting on blocks fetched ahead, so that they fail with [`Error::Stopped`] now.
pub(crate) fn halt_reads(dir: &RemoteDir) {
    dir.halt();
    wake_readers();
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
    /// index). Waiting for it included, it takes at most the retry window (and one attempt
    /// past it), whatever happens to the requests fetching it ahead.
    pub(crate) fn payload(&self, index: usize, entry: &BlockEntry) -> Result<Bytes> {
        let key = (Arc::clone(&self.key), index);
        let retry_for = self.object.retry_for();
        let mut deadline = in_window(Instant::now(), retry_for);
        match fetcher().take(&key, deadline, &self.object) {
            Found::Bytes(bytes) => return Ok(bytes),
            // Another read retried it for a whole window lately: one more try tells whether
            // the server is back, without waiting out a window again.
            Found::Failed => deadline = Instant::now(),
            Found::Missing => {}
        }
        if self.object.is_halted() {
            return Err(self.object.halted());
        }
        if let Some(cache) = &self.cache
            && let Some(bytes) = cache.get(&self.cache_name(index), entry.crc)
        {
            return Ok(Bytes::from(bytes));
        }
        add(&COUNTERS.cache_misses, 1);
        let end = entry.offset + BLOCK_HEADER_LEN + entry.compressed;
        let fetched =
            self.object.get_range_until(entry.offset..end, self.etag.as_deref(), deadline);
        let mut ahead = fetcher().lock();
        match fetched {
            Ok(bytes) => {
                ahead.answered();
                drop(ahead);
                self.split(index, entry, &bytes)
            }
            // A halted read says nothing of the server.
            Err(error @ Error::Stopped(_)) => Err(error),
            Err(error) => {
                ahead.fail(key, in_window(Instant::now(), retry_for));
                Err(error)
            }
        }
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
    /// allows; neighbours go in one request. Blocks whose fetch failed lately are left to
    /// their readers.
    pub(crate) fn prefetch(self: &Arc<Self>, blocks: &[(usize, BlockEntry)]) -> Result<()> {
        let fetcher = fetcher();
        // Before any slot is made: a slot must never wait for a request that cannot start.
        let runtime = runtime()?;
        let wanted: Vec<(usize, BlockEntry)> = blocks
            .iter()
            .filter(|(i, _)| self.cache.as_ref().is_none_or(|c| !c.contains(&self.cache_name(*i))))
            .copied()
            .collect();
        let deadline = in_window(Instant::now(), self.object.retry_for());
        let mut refused = None;
        // Declared before the lock is taken, so that on any early exit the requests, which
        // take it to resolve their slots, are dropped after it is released.
        let mut requests: Vec<Request> = Vec::new();
        {
            let mut ahead = fetcher.lock();
            for (index, entry) in wanted {
                let key = (Arc::clone(&self.key), index);
                if ahead.slots.contains_key(&key) || ahead.failed_lately(&key) {
                    continue;
                }
                if !fetcher.room(&mut ahead, entry.compressed) {
                    break;
                }
                let accounted = match fetched_ahead_memory().reserve(Tag::Data, entry.compressed) {
                    Ok(accounted) => accounted,
                    Err(error) => {
                        refused = Some(error);
                        break;
                    }
                };
                let joins =
                    requests.last().and_then(|r| r.blocks.last()).is_some_and(|(i, last)| {
                        *i + 1 == index
                            && last.offset + BLOCK_HEADER_LEN + last.compressed == entry.offset
                    });
                let size = |r: &Request| {
                    r.blocks.iter().map(|(_, e)| BLOCK_HEADER_LEN + e.compressed).sum::<u64>()
                };
                match requests.last_mut() {
                    Some(r) if joins && size(r) + entry.compressed <= MOST_PER_REQUEST => {
                        r.blocks.push((index, entry));
                    }
                    _ => {
                        ahead.requests += 1;
                        requests.push(Request {
                            shard: Arc::clone(self),
                            blocks: vec![(index, entry)],
                            id: ahead.requests,
                            outcome: Outcome::Abandoned,
                        });
                    }
                }
                let id = ahead.requests;
                ahead.held += entry.compressed;
                ahead.slots.insert(key, Slot::Fetching { id, _accounted: accounted });
            }
        }
        for request in requests {
            add(&COUNTERS.fetched_ahead, request.blocks.len() as u64);
            runtime.spawn(request.fetch(Arc::clone(&fetcher.requests), deadline));
        }
        refused.map_or(Ok(()), |error| Err(error.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes `Fetching` slots for blocks 0 and 1 of `shard`, held by the request returned.
    fn request_of_two(shard: &Arc<RemoteBlocks>) -> Request {
        let entry = BlockEntry {
            offset: 0,
            compressed: 100,
            raw: 100,
            first_record: 0,
            records: 1,
            crc: 0,
        };
        let mut ahead = fetcher().lock();
        ahead.requests += 1;
        let id = ahead.requests;
        for index in 0..2 {
            let accounted = fetched_ahead_memory().reserve(Tag::Data, entry.compressed).unwrap();
            ahead.held += entry.compressed;
            ahead.slots.insert(
                (Arc::clone(&shard.key), index),
                Slot::Fetching { id, _accounted: accounted },
            );
        }
        Request {
            shard: Arc::clone(shard),
            blocks: vec![(0, entry), (1, entry)],
            id,
            outcome: Outcome::Abandoned,
        }
    }

    /// What a reader of block 1 finds, waiting up to a minute, and how long it waited.
    fn reader_of_block_1(
        shard: &Arc<RemoteBlocks>,
    ) -> std::thread::JoinHandle<(&'static str, f64)> {
        let shard = Arc::clone(shard);
        std::thread::spawn(move || {
            let started = Instant::now();
            let key = (Arc::clone(&shard.key), 1);
            let deadline = started + std::time::Duration::from_secs(60);
            let found = match fetcher().take(&key, deadline, &shard.object) {
                Found::Bytes(_) => "bytes",
                Found::Failed => "failed",
                Found::Missing => "missing",
            };
            (found, started.elapsed().as_secs_f64())
        })
    }

    #[test]
    fn a_request_that_ends_without_bytes_resolves_its_slots_and_wakes_their_readers() {
        let dir = super::super::RemoteDir::new("s3://bucket/unit").unwrap();
        let object = dir.object("shard-0");
        let shard = Arc::new(RemoteBlocks::new(object, None, "request-ends".into(), None));
        // Dropped without an answer: its task panicked, or was dropped with the runtime.
        let request = request_of_two(&shard);
        let reader = reader_of_block_1(&shard);
        drop(request);
        let (found, waited) = reader.join().unwrap();
        assert_eq!(found, "missing", "the reader fetches it itself");
        assert!(waited < 30.0, "waited {waited} s for a request that was gone");
        assert!(!fetcher().lock().slots.contains_key(&(Arc::clone(&shard.key), 0)));
        // Failed by the server after retrying: its readers try once more, and fetching ahead
        // leaves the blocks alone until a server answers again.
        let mut request = request_of_two(&shard);
        let reader = reader_of_block_1(&shard);
        request.outcome = Outcome::Failed;
        drop(request);
        let (found, waited) = reader.join().unwrap();
        assert_eq!(found, "failed");
        assert!(waited < 30.0, "waited {waited} s for a request that had failed");
        assert!(fetcher().lock().failed_lately(&(Arc::clone(&shard.key), 0)));
    }

    #[test]
    fn the_queue_of_landed_blocks_forgets_those_taken() {
        let mut ahead = Ahead::default();
        let shard: Arc<str> = "shard".into();
        for index in 0..10_000 {
            let key = (Arc::clone(&shard), index);
            let accounted = Tracker::new().reserve(Tag::Data, 0).unwrap();
            ahead.land(key.clone(), Bytes::new(), accounted);
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
