//! Windows of a token stream for a language model: shuffled for training, in order for
//! evaluation, each rank its own share, resumable exactly, without allocating per batch.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::tokens::Tokens;
use crate::error::{Error, Result};
use crate::pipeline::permutation::{Permutation, hash};

/// What [`SequenceSampler`] cuts and how it shares it out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SequenceConfig {
    /// Tokens a window predicts from: a window holds `context + 1` tokens, its inputs the
    /// first `context` and its targets the last `context`.
    pub context: usize,
    /// Windows per batch, on each rank.
    pub batch: usize,
    /// Seed of the shifts and orders (training only).
    pub seed: u64,
    /// This sampler's rank, below `ranks`.
    pub rank: usize,
    /// Ranks sharing each epoch.
    pub ranks: usize,
}

impl SequenceConfig {
    /// `batch` windows of `context + 1` tokens, seed 0, one rank.
    pub fn new(context: usize, batch: usize) -> Self {
        SequenceConfig { context, batch, seed: 0, rank: 0, ranks: 1 }
    }

    fn check(&self) -> Result<()> {
        let fail = |field, what: String| Err(Error::Config { field, what });
        if self.context == 0 {
            return fail("context", "a window needs a context of at least 1 token".into());
        }
        if self.batch == 0 {
            return fail("batch", "a batch needs at least 1 window".into());
        }
        if self.ranks == 0 || self.rank >= self.ranks {
            return fail("rank", format!("rank {} of {} ranks", self.rank, self.ranks));
        }
        let window = self.context.checked_add(1);
        let global = self.batch.checked_mul(self.ranks);
        if window.and_then(|w| w.checked_mul(self.batch)).is_none() || global.is_none() {
            return fail(
                "batch",
                format!("{} windows of {} tokens overflow", self.batch, self.context),
            );
        }
        Ok(())
    }
}

/// Where a [`SequenceSampler`] is: the next batch's epoch and index, for a checkpoint.
/// [`SequenceSampler::seek`] takes it back and the batches that follow are the ones an
/// uninterrupted run would have had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SequenceState {
    /// The epoch of the next batch.
    pub epoch: u64,
    /// The index within its epoch of the next batch.
    pub batch: u64,
    /// Windows per global batch (`batch * ranks`): a resumed run may change the rank count
    /// only if this stays the same.
    pub global_batch: u64,
    /// A hash of what defines the stream of global batches: the token count, context, global
    /// batch, seed and mode.
    pub config_hash: u64,
}

impl SequenceState {
    /// The state as bytes (JSON), for a checkpoint.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A state from [`SequenceState::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| Error::Config {
            field: "state",
            what: format!("not a sequence sampler state: {e}"),
        })
    }
}

/// What one [`SequenceSampler::next_batch`] filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SequenceBatch {
    /// The epoch it belongs to.
    pub epoch: u64,
    /// Its index within the epoch.
    pub index: u64,
    /// Windows holding tokens, at the front of the batch: all of them in training; in
    /// evaluation fewer in the last batches, whose other windows are zeros to be ignored.
    pub windows: usize,
    /// Targets (predicted positions) of the last of those windows: `context`, or fewer for
    /// the final partial window of an evaluation stream.
    pub last_targets: usize,
    /// The sampler's context.
    pub context: usize,
}

impl SequenceBatch {
    /// The positions of window `window` that are predicted (its first `targets` inputs and
    /// targets count; 0 for a window holding no tokens).
    pub fn targets(&self, window: usize) -> usize {
        match (window + 1).cmp(&self.windows) {
            std::cmp::Ordering::Less => self.context,
            std::cmp::Ordering::Equal => self.last_targets,
            std::cmp::Ordering::Greater => 0,
        }
    }

    /// Predicted positions in the batch.
    pub fn predicted(&self) -> usize {
        (self.windows.saturating_sub(1)) * self.context
            + if self.windows > 0 { self.last_targets } else { 0 }
    }
}

/// The order of one epoch: where windows start, and in which order they come.
#[derive(Debug, Clone, Copy)]
struct EpochView {
    epoch: u64,
    shift: u64,
    order: Permutation,
}

/// Keys that separate the two draws made per epoch.
const SHIFT_KEY: u64 = 0x5_1F7;
const ORDER_KEY: u64 = 0x0_4DE4;

/// Windows of `context + 1` tokens from a token stream in memory, `batch` at a time, for one
/// rank of `ranks`.
///
/// **Training** ([`SequenceSampler::new`]): epoch `e` cuts the stream into non-overlapping
/// windows starting at `shift(seed, e) + k * context` (a shift in `0..context`, so each epoch
/// sees another alignment; consecutive windows share one token, the last target of one being
/// the first input of the next), `(tokens - 1 - shift) / context` of them, and visits them in
/// a computed permutation keyed by (seed, e). So the order is a pure function of (seed,
/// epoch, position), like the record pipeline's. Every epoch has the same number of batches,
/// [`SequenceSampler::batches_per_epoch`]: `windows / (batch * ranks)` with the fewest windows
/// any shift leaves, `(tokens - context) / context`. The windows past the last whole global
/// batch are dropped (fewer than `batch * ranks`, plus one when the shift leaves a window
/// more): which ones changes with the permutation from epoch to epoch. Global batch `b` is
/// positions `b * batch * ranks ..` of the order, rank `r` taking the `r`-th `batch` of them,
/// so the ranks' shares are disjoint, cover the used windows once and have equal sizes.
///
/// **Evaluation** ([`SequenceSampler::evaluation`]): the windows starting at `k * context`,
/// unshuffled, with the last one partial (`(tokens - 1) % context` targets) when the stream
/// does not divide, so that every token but the first is predicted exactly once over all
/// ranks. Ranks take global batches as in training; the last batches are completed with
/// empty windows (zeros, [`SequenceBatch::targets`] 0), so every rank gets the same number
/// of batches. The seed is not used.
///
/// **Resume**: [`SequenceSampler::state`] and [`SequenceSampler::seek`]; the batches after a
/// seek are those an uninterrupted run would have made. Epochs follow one another in both
/// modes (an evaluation pass repeats).
///
/// **Memory**: an `Arc` of the tokens (shared with the other ranks' samplers, 2 or 4 bytes a
/// token) and a few words; [`SequenceSampler::next_batch`] fills the caller's buffer and
/// allocates nothing.
#[derive(Debug)]
pub struct SequenceSampler {
    tokens: Arc<Tokens>,
    config: SequenceConfig,
    shuffle: bool,
    batches: u64,
    /// Evaluation: full windows, and the targets of the partial one after them (0: none).
    full: u64,
    partial: usize,
    config_hash: u64,
    epoch: u64,
    batch: u64,
    view: EpochView,
}

impl SequenceSampler {
    /// A training sampler over `tokens` (see the type's docs); an error if the stream does
    /// not make one global batch of `batch * ranks` windows.
    pub fn new(tokens: Arc<Tokens>, config: SequenceConfig) -> Result<Self> {
        config.check()?;
        let (n, context) = (tokens.len() as u64, config.context as u64);
        let global = (config.batch * config.ranks) as u64;
        let fewest = n.saturating_sub(context) / context;
        let batches = fewest / global;
        if batches == 0 {
            return Err(Error::Config {
                field: "batch",
                what: format!(
                    "{n} tokens make {fewest} windows of {} tokens (at the largest shift), fewer \
                     than one global batch of {} ranks x {} windows; lower the batch or the \
                     context",
                    context + 1,
                    config.ranks,
                    config.batch
                ),
            });
        }
        Ok(Self::build(tokens, config, true, batches, 0, 0))
    }

    /// An evaluation sampler over `tokens` (see the type's docs); an error if there is not
    /// one token to predict.
    pub fn evaluation(tokens: Arc<Tokens>, config: SequenceConfig) -> Result<Self> {
        config.check()?;
        let (n, context) = (tokens.len() as u64, config.context as u64);
        if n < 2 {
            return Err(Error::Config {
                field: "tokens",
                what: format!("{n} tokens hold nothing to predict (at least 2 are needed)"),
            });
        }
        let (full, partial) = ((n - 1) / context, ((n - 1) % context) as usize);
        let windows = full + u64::from(partial > 0);
        let batches = windows.div_ceil((config.batch * config.ranks) as u64);
        Ok(Self::build(tokens, config, false, batches, full, partial))
    }

    fn build(
        tokens: Arc<Tokens>,
        config: SequenceConfig,
        shuffle: bool,
        batches: u64,
        full: u64,
        partial: usize,
    ) -> Self {
        let global = (config.batch * config.ranks) as u64;
        let seed = if shuffle { config.seed } else { 0 };
        let words =
            [1, tokens.len() as u64, config.context as u64, global, seed, u64::from(shuffle)];
        let mut sampler = SequenceSampler {
            config_hash: hash(&words),
            view: EpochView { epoch: 0, shift: 0, order: Permutation::new(1, 0) },
            tokens,
            config,
            shuffle,
            batches,
            full,
            partial,
            epoch: 0,
            batch: 0,
        };
        sampler.view = sampler.epoch_view(0);
        sampler
    }

    fn epoch_view(&self, epoch: u64) -> EpochView {
        if !self.shuffle {
            return EpochView { epoch, shift: 0, order: Permutation::new(1, 0) };
        }
        let (seed, n, context) = (self.config.seed, self.tokens.len() as u64, self.config.context);
        let shift = hash(&[seed, epoch, SHIFT_KEY]) % context as u64;
        let windows = (n - 1 - shift) / context as u64;
        EpochView {
            epoch,
            shift,
            order: Permutation::new(windows, hash(&[seed, epoch, ORDER_KEY])),
        }
    }

    /// Batches each rank gets per epoch (the same for every rank and epoch).
    pub fn batches_per_epoch(&self) -> u64 {
        self.batches
    }

    /// Windows all ranks get per epoch together, empty ones excluded: `batches_per_epoch *
    /// batch * ranks` in training; every window of the stream, the partial one included, in
    /// evaluation.
    pub fn windows_per_epoch(&self) -> u64 {
        if self.shuffle {
            self.batches * (self.config.batch * self.config.ranks) as u64
        } else {
            self.full + u64::from(self.partial > 0)
        }
    }

    /// Tokens in one batch: `batch * (context + 1)`, the length `next_batch` fills.
    pub fn batch_len(&self) -> usize {
        self.config.batch * (self.config.context + 1)
    }

    /// The configuration.
    pub fn config(&self) -> &SequenceConfig {
        &self.config
    }

    /// The tokens windows are cut from.
    pub fn tokens(&self) -> &Arc<Tokens> {
        &self.tokens
    }

    /// Where the sampler is: the next batch's epoch and index.
    pub fn state(&self) -> SequenceState {
        SequenceState {
            epoch: self.epoch,
            batch: self.batch,
            global_batch: (self.config.batch * self.config.ranks) as u64,
            config_hash: self.config_hash,
        }
    }

    /// Continues from `state` (taken from a sampler over the same tokens, context, global batch,
    /// seed and mode; the rank count may differ if the global batch does not).
    pub fn seek(&mut self, state: SequenceState) -> Result<()> {
        let global = (self.config.batch * self.config.ranks) as u64;
        if state.global_batch != global || state.config_hash != self.config_hash {
            return Err(Error::Config {
                field: "state",
                what: format!(
                    "the state is of another stream (global batch {}, hash {:016x}; this sampler: \
                     global batch {global}, hash {:016x}: tokens, context, seed or mode differ)",
                    state.global_batch, state.config_hash, self.config_hash
                ),
            });
        }
        if state.batch > self.batches {
            return Err(Error::Config {
                field: "state",
                what: format!("batch {} of an epoch of {} batches", state.batch, self.batches),
            });
        }
        (self.epoch, self.batch) = (state.epoch, state.batch);
        Ok(())
    }

    /// Fills `out` (`batch * (context + 1)` tokens, [`SequenceSampler::batch_len`]) with this
    /// rank's next batch: window `j` at `out[j * (context + 1)..][..context + 1]`, its inputs
    /// the first `context` tokens and its targets the last `context`. Moves to the next epoch
    /// after the last batch of one. Allocates nothing.
    pub fn next_batch(&mut self, out: &mut [u32]) -> Result<SequenceBatch> {
        let (context, batch) = (self.config.context, self.config.batch);
        if out.len() != self.batch_len() {
            return Err(Error::Config {
                field: "out",
                what: format!(
                    "a buffer of {} tokens for {batch} windows of {} tokens ({} tokens)",
                    out.len(),
                    context + 1,
                    self.batch_len()
                ),
            });
        }
        if self.batch >= self.batches {
            self.epoch += 1;
            self.batch = 0;
        }
        if self.view.epoch != self.epoch {
            self.view = self.epoch_view(self.epoch);
        }
        let global = (batch * self.config.ranks) as u64;
        let first = self.batch * global + (self.config.rank * batch) as u64;
        let (mut windows, mut last_targets) = (0, 0);
        for (j, window) in out.chunks_exact_mut(context + 1).enumerate() {
            let position = first + j as u64;
            let (start, targets) = if self.shuffle {
                (self.view.shift + self.view.order.apply(position) * context as u64, context)
            } else if position < self.full {
                (position * context as u64, context)
            } else if position == self.full && self.partial > 0 {
                (position * context as u64, self.partial)
            } else {
                (0, 0)
            };
            if targets == 0 {
                window.fill(0);
                continue;
            }
            let (filled, rest) = window.split_at_mut(targets + 1);
            self.tokens.copy_to(start as usize, filled)?;
            rest.fill(0);
            windows += 1;
            last_targets = targets;
        }
        let done =
            SequenceBatch { epoch: self.epoch, index: self.batch, windows, last_targets, context };
        self.batch += 1;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dp_mem::{Pool, Tracker};

    fn stream(n: u32) -> Arc<Tokens> {
        let tokens: Vec<u32> = (0..n).collect();
        Arc::new(Tokens::from_u32(&Pool::new(&Tracker::new()), &tokens).unwrap())
    }

    #[test]
    fn batch_descriptions_count_the_predicted_positions() {
        let b = SequenceBatch { epoch: 0, index: 0, windows: 3, last_targets: 2, context: 8 };
        assert_eq!((b.targets(0), b.targets(2), b.targets(3)), (8, 2, 0));
        assert_eq!(b.predicted(), 18);
        let empty = SequenceBatch { windows: 0, last_targets: 0, ..b };
        assert_eq!(empty.predicted(), 0);
    }

    #[test]
    fn too_little_text_or_bad_settings_are_errors_naming_the_knob() {
        let tokens = stream(100);
        let too_big = SequenceSampler::new(Arc::clone(&tokens), SequenceConfig::new(64, 2));
        assert!(matches!(too_big, Err(Error::Config { field: "batch", .. })), "{too_big:?}");
        let mut config = SequenceConfig::new(0, 1);
        assert!(matches!(
            SequenceSampler::new(Arc::clone(&tokens), config.clone()),
            Err(Error::Config { field: "context", .. })
        ));
        config.context = 4;
        config.rank = 2;
        config.ranks = 2;
        assert!(matches!(
            SequenceSampler::evaluation(Arc::clone(&tokens), config),
            Err(Error::Config { field: "rank", .. })
        ));
        let mut sampler = SequenceSampler::new(tokens, SequenceConfig::new(4, 2)).unwrap();
        let mut short = vec![0; 9];
        assert!(matches!(sampler.next_batch(&mut short), Err(Error::Config { field: "out", .. })));
    }
}
