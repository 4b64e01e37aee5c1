//! Checkpoints written in the background (`checkpoint_async`): every file is the very file a
//! synchronous save writes at the same step, for each way replicas hold the optimizer state
//! (each its own, ZeRO-1 shards, shared parameters); the staging copies are accounted; and a
//! run resumed from one ends where the uninterrupted run does.

mod common;

use std::path::Path;

use common::{TempDir, config, run_dir};
use dp_train::{Observer, RunOptions, TrainConfig, train};

/// The steps the run said it checkpointed, in order.
#[derive(Default)]
struct Checkpointed(Vec<u64>);

impl Observer for Checkpointed {
    fn checkpoint(&mut self, step: u64) {
        self.0.push(step);
    }
}

/// The run directory's checkpoint and optimizer shard files, by name, with their bytes.
fn checkpoint_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().into_string().unwrap(), e.path()))
        .filter(|(name, _)| name.ends_with(".ckpt") && name != dp_train::BEST)
        .map(|(name, path)| (name, std::fs::read(path).unwrap()))
        .collect();
    files.sort();
    files
}

#[test]
fn background_saves_write_the_files_a_synchronous_save_writes() {
    let out = TempDir::new("async-files");
    let layouts = [
        ("own", TrainConfig { share_params: false, ..config(2, 22) }),
        ("zero1", TrainConfig { share_params: false, zero_stage: 1, ..config(2, 22) }),
        ("shared", config(2, 22)),
    ];
    for (name, layout) in layouts {
        let c =
            TrainConfig { optimizer: Some(common::adam()), checkpoint_every: 4, keep: 3, ..layout };
        let sync_out = out.0.join(format!("{name}-sync"));
        let mut said = Checkpointed::default();
        let sync = train(c.clone(), &RunOptions::new(&sync_out), &mut said).unwrap();
        let async_out = out.0.join(format!("{name}-async"));
        let background = TrainConfig { checkpoint_async: true, ..c };
        let mut said_async = Checkpointed::default();
        let summary = train(background, &RunOptions::new(&async_out), &mut said_async).unwrap();
        assert_eq!(summary.train_loss, sync.train_loss, "{name}");
        // Each checkpoint is announced once it is whole, the last one included.
        assert_eq!(said.0, [4, 8, 12, 16, 20, 22], "{name}");
        assert_eq!(said_async.0, said.0, "{name}");

        let (want, got) =
            (checkpoint_files(&run_dir(&sync_out)), checkpoint_files(&run_dir(&async_out)));
        let names =
            |files: &[(String, Vec<u8>)]| files.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
        assert_eq!(names(&got), names(&want), "{name}");
        // The last three of steps 4, 8, ..., 20 and the run's end at 22.
        assert!(names(&want).contains(&"checkpoint-0000000022.ckpt".to_string()), "{name}");
        assert!(names(&want).contains(&"checkpoint-0000000016.ckpt".to_string()), "{name}");
        assert!(!names(&want).contains(&"checkpoint-0000000012.ckpt".to_string()), "{name}");
        for ((file, want), (_, got)) in want.iter().zip(&got) {
            assert!(want == got, "{name}: {file} differs");
        }
        // The staging copies are in the memory report: at least the parameters and, for
        // replica 0, its Adam moments (all of them, or its shard).
        let staged = summary.peak_memory.get("Temp").copied().unwrap_or(0);
        let unstaged = sync.peak_memory.get("Temp").copied().unwrap_or(0);
        let at_least = summary.params * 4 + (summary.opt_state_per_replica).min(summary.params * 8);
        assert!(staged >= unstaged + at_least, "{name}: Temp {staged} vs {unstaged} + {at_least}");
    }
}
