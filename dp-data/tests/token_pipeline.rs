//! A token dataset's windows as a trainer's batches (`TokenPipeline`): inputs and next-token
//! labels agree with the text, ranks share an epoch, resume continues exactly, and an
//! evaluation predicts every held-out token once.

#[path = "support/temp_dir.rs"]
#[allow(dead_code)]
mod temp_dir;

use std::collections::BTreeMap;
use std::path::Path;

use dp_data::{
    PipelineConfig, TextOptions, TokenDataset, TokenPipeline, WriterOptions, import_text,
};
use temp_dir::TempDir;

const CONTEXT: usize = 16;

/// A byte-level token dataset of `text` in `dir/train` and `dir/eval` (the last 20%).
fn import(dir: &Path, text: &str) {
    let file = dir.join("corpus.txt");
    std::fs::write(&file, text).unwrap();
    let options = TextOptions { eval_fraction: 0.2, ..TextOptions::default() };
    import_text(&[file.as_path()], &dir.join("data"), &options, WriterOptions::default()).unwrap();
}

/// `len` bytes of printable ASCII from a fixed generator: a window of 16 of them occurs
/// once, so it tells where it was cut.
fn counting(len: usize) -> String {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from(b' ' + ((state >> 33) % 95) as u8)
        })
        .collect()
}

fn config(batch: usize, rank: usize, world: usize) -> PipelineConfig {
    let mut config = PipelineConfig::default();
    (config.batch_size, config.rank, config.world_size, config.seed) = (batch, rank, world, 9);
    config
}

#[test]
fn windows_are_inputs_and_the_next_tokens_and_ranks_share_the_epoch() {
    let dir = TempDir::new("token-pipeline-train");
    let text = counting(5_000);
    import(&dir.0, &text);
    let train = dir.path("data/train");
    let bytes = text.as_bytes();
    let mut seen = BTreeMap::new();
    for rank in 0..2 {
        let mut pipeline = TokenPipeline::new(&train, &config(4, rank, 2), CONTEXT, true).unwrap();
        let per_epoch = pipeline.batches_per_epoch();
        assert!(per_epoch > 10, "{per_epoch} batches");
        for _ in 0..per_epoch {
            let batch = pipeline.next_batch().unwrap();
            assert_eq!((batch.len(), batch.padded(), batch.epoch()), (4, 0, 0));
            let (x, y) = (batch.x_flat(), batch.y());
            assert_eq!((x.len(), y.len()), (4 * CONTEXT, 4 * CONTEXT));
            for w in 0..4 {
                let xs: Vec<u8> = x[w * CONTEXT..][..CONTEXT].iter().map(|&t| t as u8).collect();
                // The window is a slice of the text, and its labels the slice one further.
                let start = (0..bytes.len() - CONTEXT).find(|&s| bytes[s..s + CONTEXT] == xs[..]);
                let start = start.expect("a window is a slice of the text");
                for i in 0..CONTEXT {
                    assert_eq!(y[w * CONTEXT + i], i64::from(bytes[start + i + 1]));
                }
                *seen.entry(batch.record_ids()[w]).or_insert(0) += 1;
            }
        }
        assert_eq!(pipeline.next_batch().unwrap().epoch(), 1);
    }
    // Every window of the epoch once, over both ranks.
    assert!(seen.values().all(|&n| n == 1));
    assert_eq!(seen.len() as u64, *seen.keys().last().unwrap() + 1);
}

#[test]
fn a_resumed_pipeline_continues_with_the_same_batches() {
    let dir = TempDir::new("token-pipeline-resume");
    import(&dir.0, &counting(3_000));
    let train = dir.path("data/train");
    let mut whole = TokenPipeline::new(&train, &config(3, 0, 1), CONTEXT, true).unwrap();
    let per_epoch = whole.batches_per_epoch() as usize;
    let batches: Vec<Vec<f32>> =
        (0..per_epoch + 5).map(|_| whole.next_batch().unwrap().x_flat().to_vec()).collect();
    for stop in [1, per_epoch - 1, per_epoch + 2] {
        let mut first = TokenPipeline::new(&train, &config(3, 0, 1), CONTEXT, true).unwrap();
        (0..stop).for_each(|_| drop(first.next_batch().unwrap()));
        let state = first.state();
        let mut resumed =
            TokenPipeline::resume(&train, &config(3, 0, 1), CONTEXT, true, &state).unwrap();
        for expected in &batches[stop..] {
            assert_eq!(resumed.next_batch().unwrap().x_flat(), &expected[..], "after {stop}");
        }
    }
    // Another seed is another stream: its state does not fit.
    let mut other = config(3, 0, 1);
    other.seed = 10;
    let err = TokenPipeline::resume(&train, &other, CONTEXT, true, &whole.state()).unwrap_err();
    assert!(err.to_string().contains("another stream"), "{err}");
}

#[test]
fn an_evaluation_predicts_every_held_out_token_once() {
    let dir = TempDir::new("token-pipeline-eval");
    let text = counting(2_003);
    import(&dir.0, &text);
    let eval = dir.path("data/eval");
    let held_out = TokenDataset::open(&eval).unwrap().read_all().unwrap();
    let mut predicted = Vec::new();
    for rank in 0..3 {
        let mut pipeline = TokenPipeline::new(&eval, &config(2, rank, 3), CONTEXT, false).unwrap();
        for _ in 0..pipeline.batches_per_epoch() {
            let batch = pipeline.next_batch().unwrap();
            let real = batch.len() - batch.padded();
            for (i, &label) in batch.y().iter().enumerate() {
                if label >= 0 {
                    assert!(i < real * CONTEXT, "a padded window predicts");
                    predicted.push((batch.record_ids()[i / CONTEXT], i % CONTEXT, label as u8));
                }
            }
        }
    }
    predicted.sort_unstable();
    let labels: Vec<u32> = predicted.iter().map(|p| u32::from(p.2)).collect();
    // The held-out split's tokens, each but the first predicted once, in order.
    assert!(held_out.len() > 300);
    assert_eq!(labels, &held_out[1..]);
}

#[test]
fn the_memory_a_pipeline_needs_is_known_before_it_reads_the_tokens() {
    let dir = TempDir::new("token-pipeline-needs");
    import(&dir.0, &counting(3_000));
    for (path, train) in [("data/train", true), ("data/eval", false)] {
        let data = dir.path(path);
        let pipeline = TokenPipeline::new(&data, &config(5, 1, 2), CONTEXT, train).unwrap();
        let needs = TokenPipeline::memory_needs(&data, &config(5, 1, 2), CONTEXT).unwrap();
        assert_eq!(needs, pipeline.minimum_bytes());
        assert!(needs > TokenDataset::open(&data).unwrap().len(), "the tokens are held");
    }
}
