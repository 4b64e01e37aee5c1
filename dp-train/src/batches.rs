//! Where a replica's batches come from: the record pipeline, or a token dataset's windows.
//! One type, so that training, evaluation and the memory report take both alike.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use dp_data::{Batch, Pipeline, PipelineConfig, PipelineState, TokenPipeline};
use dp_mem::Tracker;

/// The batches of one replica.
#[derive(Debug)]
pub(crate) enum Batches {
    Records(Pipeline),
    Tokens(TokenPipeline),
}

impl Batches {
    /// The token pipeline of `context`-token windows from `dir` for `config`'s rank, resumed
    /// at `state` when given.
    pub(crate) fn tokens(
        dir: &Path,
        config: &PipelineConfig,
        context: usize,
        train: bool,
        state: Option<&PipelineState>,
    ) -> dp_data::Result<Self> {
        Ok(Batches::Tokens(match state {
            Some(state) => TokenPipeline::resume(dir, config, context, train, state)?,
            None => TokenPipeline::new(dir, config, context, train)?,
        }))
    }

    /// Gives up waiting for a batch once `stop` is set and `grace` has passed (see
    /// [`Pipeline::give_up_when`]). The token pipeline makes its windows on the calling
    /// thread, which no flag can interrupt.
    pub(crate) fn give_up_when(&mut self, stop: Arc<AtomicBool>, grace: Duration) {
        match self {
            Batches::Records(p) => p.give_up_when(stop, grace),
            Batches::Tokens(_) => {}
        }
    }

    pub(crate) fn next_batch(&mut self) -> dp_data::Result<Batch> {
        match self {
            Batches::Records(p) => p.next_batch(),
            Batches::Tokens(p) => p.next_batch(),
        }
    }

    pub(crate) fn state(&self) -> PipelineState {
        match self {
            Batches::Records(p) => p.state(),
            Batches::Tokens(p) => p.state(),
        }
    }

    pub(crate) fn batches_per_epoch(&self) -> u64 {
        match self {
            Batches::Records(p) => p.batches_per_epoch(),
            Batches::Tokens(p) => p.batches_per_epoch(),
        }
    }

    pub(crate) fn minimum_bytes(&self) -> u64 {
        match self {
            Batches::Records(p) => p.minimum_bytes(),
            Batches::Tokens(p) => p.minimum_bytes(),
        }
    }

    pub(crate) fn working_bytes(&self) -> u64 {
        match self {
            Batches::Records(p) => p.working_bytes(),
            Batches::Tokens(p) => p.working_bytes(),
        }
    }

    pub(crate) fn tracker(&self) -> &Tracker {
        match self {
            Batches::Records(p) => p.tracker(),
            Batches::Tokens(p) => p.tracker(),
        }
    }
}
