//! Decoded blocks shared by the pipelines of one process that read the same dataset, such as
//! the ranks of a trainer whose replicas are threads: every rank's batches draw on every block
//! of a window, so without sharing each rank would decompress the whole dataset. A block one
//! pipeline decoded is found here by the others, which copy it (a memcpy, a few percent of
//! decompressing it) instead of decoding it again.
//!
//! Only weak references are kept, so a block is found while the pipeline that decoded it still
//! holds it. The copy keeps each pipeline's memory its own: counted and budgeted where it is
//! held, whatever the other pipelines hold or release.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::block::Block;

/// The decoded blocks of one dataset, by block number.
#[derive(Debug)]
pub(crate) struct SharedBlocks {
    blocks: Mutex<Vec<Weak<Block>>>,
}

/// The datasets of this process that some pipeline reads: directory, identity, blocks.
type Registry = Vec<(PathBuf, u64, Weak<SharedBlocks>)>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SharedBlocks {
    /// The shared blocks of the dataset of `count` blocks in `dir` whose content hashes to
    /// `identity`, made on first use.
    pub(crate) fn of(dir: &Path, identity: u64, count: usize) -> Arc<Self> {
        static REGISTRY: Mutex<Registry> = Mutex::new(Vec::new());
        // The same dataset reached by another path is still the same dataset.
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let mut registry = lock(&REGISTRY);
        registry.retain(|(_, _, blocks)| blocks.strong_count() > 0);
        let found = registry
            .iter()
            .filter(|(d, i, _)| *d == dir && *i == identity)
            .find_map(|(_, _, blocks)| blocks.upgrade())
            .filter(|blocks| lock(&blocks.blocks).len() == count);
        found.unwrap_or_else(|| {
            let blocks = (0..count).map(|_| Weak::new()).collect();
            let made = Arc::new(SharedBlocks { blocks: Mutex::new(blocks) });
            registry.push((dir, identity, Arc::downgrade(&made)));
            made
        })
    }

    /// Block `b`, if another pipeline holds it decoded.
    pub(crate) fn get(&self, b: usize) -> Option<Arc<Block>> {
        lock(&self.blocks)[b].upgrade()
    }

    /// Offers block `b` to the other pipelines.
    pub(crate) fn put(&self, b: usize, block: &Arc<Block>) {
        lock(&self.blocks)[b] = Arc::downgrade(block);
    }
}
