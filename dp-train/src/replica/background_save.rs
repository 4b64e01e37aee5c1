//! Asynchronous checkpoints (`checkpoint_async`): at a step boundary a replica copies what it
//! saves into staging buffers its tracker accounts (`Temp`), and a thread of its own writes
//! them while training goes on. At most one save is in flight: the next save and the run's
//! end wait for it, and a failure abandons it. The checkpoint that names optimizer shards is
//! written only once every replica's shard is, each file atomically (written to a temporary
//! name, synced, renamed), so a crash or kill at any point of a save leaves the previous
//! checkpoint whole.
//!
//! When every shard is written is learnt without a collective of its own: each step's totals
//! carry whether this replica's part is down ([`BackgroundSaves::written_here`]), and the sum
//! lets replica 0 write the checkpoint steps before the next save would have made it.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use dp_comm::Communicator;
use dp_mem::{Pool, Tracker};
use dp_model::{ModelSnapshot, OptimizerSnapshot, ShardFile};

use crate::error::{Error, Result, panic_message};
use crate::run_dir::{CHECKPOINT, keep_checkpoints, remove_unnamed_shards};

/// What one replica writes of checkpoint `step`, copied at its step boundary.
pub(super) struct Job {
    pub(super) dir: PathBuf,
    pub(super) step: u64,
    /// Checkpoints kept (see `TrainConfig::keep`).
    pub(super) keep: usize,
    /// This replica's optimizer state (none: it saves none).
    pub(super) state: Option<OptimizerSnapshot<f32>>,
    /// The shard file this replica writes `state` to, and the parameters it covers.
    pub(super) shard: Option<(PathBuf, Range<usize>)>,
    /// Replica 0's: the checkpoint itself, from the parameters, the run's state (JSON) and the
    /// shard files holding the optimizer state (none: `state` is all of it, in the file).
    pub(super) checkpoint: Option<(ModelSnapshot<f32>, String, Option<Vec<ShardFile>>)>,
}

/// The save in flight.
struct Pending {
    step: u64,
    /// Says whether it wrote the checkpoint itself.
    thread: Option<JoinHandle<Result<bool>>>,
    /// Set by the thread once this replica's shard is written (at once without one).
    written: Arc<AtomicBool>,
    /// Replica 0 with shard files: tells its thread that every shard is written; dropped, it
    /// abandons the checkpoint.
    commit: Option<Sender<()>>,
    /// Every replica knows every shard written.
    committed: bool,
}

impl Pending {
    /// Every replica's part is written: replica 0's thread may write the checkpoint.
    fn commit(&mut self) {
        self.committed = true;
        if let Some(commit) = self.commit.take() {
            // A thread that has gone already reports why when joined.
            let _ = commit.send(());
        }
    }
}

/// A replica's asynchronous saves.
pub(super) struct BackgroundSaves {
    /// The staging buffers' pool: a save reuses the blocks of the one before, instead of
    /// faulting in fresh pages for every copy.
    pub(super) staging: Pool,
    /// Whether saves name shard files, which every replica must have written first (then the
    /// replicas agree on it together).
    shards: bool,
    rank: usize,
    pending: Option<Pending>,
}

impl BackgroundSaves {
    /// The saves of replica `rank`, staged in a pool of `tracker`'s; `shards`: whether they
    /// name shard files.
    pub(super) fn new(tracker: &Tracker, shards: bool, rank: usize) -> Self {
        Self { staging: Pool::new(tracker), shards, rank, pending: None }
    }

    /// Starts writing `job` on a thread (a previous save must be finished).
    pub(super) fn start(&mut self, job: Job) -> Result<()> {
        debug_assert!(self.pending.is_none(), "one save in flight at most");
        let step = job.step;
        let written = Arc::new(AtomicBool::new(job.shard.is_none()));
        let (commit, go) = match (&job.checkpoint, self.shards) {
            (Some(_), true) => {
                let (commit, go) = channel();
                (Some(commit), Some(go))
            }
            _ => (None, None),
        };
        let thread = match (&job.state, &job.checkpoint) {
            (None, None) => None,
            _ => {
                let flag = Arc::clone(&written);
                let spawned = std::thread::Builder::new()
                    .name(format!("dp-checkpoint-{}", self.rank))
                    .spawn(move || write(job, &flag, go));
                Some(spawned.map_err(|e| Error::Replica {
                    rank: self.rank,
                    what: format!(
                        "cannot start its checkpoint thread ({e}): {}; set checkpoint_async = false",
                        dp_mem::THREAD_REFUSED
                    ),
                })?)
            }
        };
        self.pending = Some(Pending { step, thread, written, commit, committed: false });
        Ok(())
    }

    /// Whether this replica's part of the save in flight is written (or none is in flight):
    /// what it adds to a step's totals. A part that failed fails the replica here.
    pub(super) fn written_here(&mut self) -> Result<bool> {
        let Some(pending) = &mut self.pending else { return Ok(true) };
        if !pending.written.load(Ordering::Acquire) {
            // A thread that ended without setting it failed: its error, now.
            if pending.thread.as_ref().is_some_and(JoinHandle::is_finished) {
                join(pending, self.rank)?;
            }
            return Ok(false);
        }
        Ok(true)
    }

    /// After a step's totals: with every replica's part written (`all`), replica 0 goes on
    /// to the checkpoint. Returns the step of a save now finished whole.
    pub(super) fn all_written(&mut self, all: bool) -> Result<Option<u64>> {
        let Some(pending) = &mut self.pending else { return Ok(None) };
        if all {
            pending.commit();
        }
        let finished = pending.thread.as_ref().is_none_or(JoinHandle::is_finished);
        if pending.committed && finished { self.finish_pending() } else { Ok(None) }
    }

    /// Waits for the save in flight, all replicas together (a collective over `ctl` when
    /// replicas write shards and had not yet all said theirs were written). Returns its step
    /// when it finished a save.
    pub(super) fn finish(&mut self, ctl: &mut impl Communicator) -> Result<Option<u64>> {
        let rank = self.rank;
        let Some(pending) = &mut self.pending else { return Ok(None) };
        if !pending.committed {
            // This replica's part first. Polled, as replica 0's thread goes on to wait for
            // the word to write the checkpoint: the wait is the rest of one file's writing,
            // at a save or the run's end.
            while !pending.written.load(Ordering::Acquire) {
                if pending.thread.as_ref().is_none_or(JoinHandle::is_finished) {
                    // Ended without its part written: it failed, and says why.
                    join(pending, rank)?;
                    break;
                }
                std::thread::park_timeout(std::time::Duration::from_millis(5));
            }
            if self.shards {
                // Every replica's shard is written once all are here; one that failed to
                // write has left the group, failing this.
                ctl.barrier()?;
            }
            pending.commit();
        }
        self.finish_pending()
    }

    /// After a failure: waits for the thread, letting a checkpoint that every shard was
    /// written for finish, and abandoning one that waits for shards. Returns the step of a
    /// checkpoint now written whole.
    pub(super) fn abandon(mut self) -> Option<u64> {
        let mut pending = self.pending.take()?;
        pending.commit = None;
        let whole = join(&mut pending, self.rank).unwrap_or(false);
        whole.then_some(pending.step)
    }

    /// Joins the thread of the save in flight; its step, when it wrote the checkpoint.
    fn finish_pending(&mut self) -> Result<Option<u64>> {
        let Some(mut pending) = self.pending.take() else { return Ok(None) };
        let whole = join(&mut pending, self.rank)?;
        Ok(whole.then_some(pending.step))
    }
}

/// Joins the thread of replica `rank`, if it has not been: whether it wrote the checkpoint,
/// its error, or its panic as one.
fn join(pending: &mut Pending, rank: usize) -> Result<bool> {
    let Some(thread) = pending.thread.take() else { return Ok(false) };
    thread.join().unwrap_or_else(|panic| {
        let what = format!("its checkpoint thread panicked: {}", panic_message(&*panic));
        Err(Error::Replica { rank, what })
    })
}

/// The thread's work: the shard, then (replica 0, once `go` says every shard is written) the
/// checkpoint, and the older checkpoints and shards it replaces removed. Says whether it
/// wrote the checkpoint.
fn write(job: Job, written: &AtomicBool, go: Option<Receiver<()>>) -> Result<bool> {
    idle_priority();
    let Job { dir, step, keep, state, shard, checkpoint } = job;
    if let (Some((path, range)), Some(state)) = (&shard, &state) {
        state.save_shard(path, range.clone())?;
    }
    written.store(true, Ordering::Release);
    let (Some((model, extra, shards)), Some(state)) = (checkpoint, &state) else {
        return Ok(false);
    };
    if let Some(go) = go
        && go.recv().is_err()
    {
        // Abandoned: a replica failed before every shard was known written.
        return Ok(false);
    }
    let writer = model.writer().with_extra(extra);
    let writer = match shards {
        Some(files) => writer.with_snapshot_shards(state, files),
        None => writer.with_optimizer_snapshot(state),
    };
    writer.save(&dir.join(CHECKPOINT))?;
    keep_checkpoints(&dir, step, keep)?;
    remove_unnamed_shards(&dir, step)?;
    Ok(true)
}

/// Lowers the calling thread to idle priority (Linux's `SCHED_IDLE`): where the replicas keep
/// every core busy, compressing a checkpoint then takes only the time they leave (their waits
/// for peers and data) instead of slowing their steps; with cores to spare it runs at once. A
/// save it delays is waited for at the next one, or the run's end, where the replicas wait.
fn idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sets this thread's own scheduling policy (pid 0) from a valid parameter; a
        // refusal leaves it as it was, which is only slower.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    }
}
