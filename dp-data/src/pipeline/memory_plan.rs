//! What a pipeline holds at least and at most, checked against its memory budget.

use super::config::PipelineConfig;
use super::plan::BlockSizes;
use super::producer::{self, Columns};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::image::ImageSampler;

/// Checks that the working set fits the budget; returns the least and the most the pipeline
/// holds (see [`Pipeline::minimum_bytes`] and [`Pipeline::working_bytes`]), and whether the
/// whole dataset can be cached.
pub(super) fn plan_memory(
    dataset: &Dataset,
    config: &PipelineConfig,
    columns: &Columns,
) -> Result<(u64, u64, bool)> {
    let (max_raw, _) = dataset.largest_block();
    let sizes = dataset.block_records();
    let blocks = sizes.len() as u64;
    let min_records = sizes.iter().copied().min().unwrap_or(1).max(1);
    // A window larger than the dataset is the whole dataset.
    let window = (config.shuffle_window.unwrap_or(1) as u64).clamp(1, blocks.max(1));
    // Batches made at once: one per worker (and the consumer's, when it helps), or one on the
    // calling thread without prefetch.
    let makers = match config.prefetch {
        0 => 1,
        _ => config.workers as u64 + u64::from(config.consumer_helps),
    };
    // Decoded blocks are kept from the window the latest finished batch's successor starts in
    // to the one read ahead of the furthest batch being made, at most `makers + prefetch`
    // batches on; a worker that fell behind still holds its own batch's blocks.
    let sizes = BlockSizes::new(sizes);
    let (cursors, window_blocks, table) = producer::cursors_for(&sizes, config);
    let (held, window) = match config.partitions {
        None => {
            let ahead =
                (makers + config.prefetch as u64 + 1).saturating_mul(config.global_batch() as u64);
            let window_records = window.saturating_mul(min_records);
            let spans = ahead.div_ceil(window_records)
                + 3
                + (config.batch_size as u64).div_ceil(window_records)
                + 1;
            (spans.saturating_mul(window).min(blocks.max(1)), window)
        }
        // The same for each partition this rank reads, a window of it `table` records over at
        // most `window_blocks` blocks.
        Some(count) => {
            let per_batch = (config.global_batch() / count) as u64;
            let ahead = (makers + config.prefetch as u64 + 1).saturating_mul(per_batch);
            let spans = ahead.div_ceil(table.max(1) as u64) + 3 + 1;
            let window = ((cursors - 1) * window_blocks) as u64;
            (spans.saturating_mul(window).min(blocks.max(1)), window)
        }
    };
    // Every buffer is at least one 64-byte block.
    let buffer = |bytes: u64| bytes.max(64);
    let targets = match columns.label_dtype.is_float() {
        true => buffer(config.batch_size as u64 * 4),
        false => 0,
    };
    // A sparse input's offsets, and its positions and values for the densest records.
    let sparse = columns.sparse.map_or(0, |column| {
        let nnz = config.batch_size as u64 * column.max_per_record as u64;
        buffer((config.batch_size as u64 + 1) * 4) + 2 * buffer(nnz * 4)
    });
    // Each maker's image buffers, grown to the largest image.
    let input_name = &dataset.schema().features()[columns.input].name;
    let images = match (&columns.image, dataset.manifest().images.get(input_name)) {
        (Some(input), Some(counts)) => ImageSampler::bytes_for(counts.most_pixels, input),
        _ => 0,
    };
    let batch_bytes = buffer(config.batch_size as u64 * columns.elements as u64 * 4)
        + 2 * buffer(config.batch_size as u64 * 8)
        + targets
        + sparse;
    // Batches being made, made ahead, held by the consumer, and being dropped.
    let batches = (makers + config.prefetch as u64 + 2) * batch_bytes;
    // Each maker's window tables.
    let tables = makers * cursors as u64 * buffer(table.max(1) as u64 * 8);
    // Size classes round up by at most ~3%, and a buffer may take a cached block one class up.
    let rounding = |bytes: u64| bytes + bytes / 14;
    let working = rounding(
        held.saturating_mul(max_raw)
            .saturating_add(tables)
            .saturating_add(batches)
            .saturating_add(makers * images),
    );
    if working > config.memory_budget {
        return Err(Error::Budget {
            budget: config.memory_budget,
            needed: working,
            detail: format!(
                "{held} decoded blocks of up to {max_raw} bytes for a shuffle window of {window}, {} batches of {batch_bytes} bytes, and the window tables{} of {makers} batch makers",
                makers + config.prefetch as u64 + 2,
                if images > 0 {
                    format!(" and image buffers ({images} bytes)")
                } else {
                    String::new()
                },
            ),
        });
    }
    let everything = rounding(
        dataset
            .raw_bytes()
            .saturating_add(tables)
            .saturating_add(batches)
            .saturating_add(makers * images),
    );
    let mean_block = dataset.raw_bytes() / blocks.max(1);
    let in_flight = match config.prefetch {
        0 => 1,
        prefetch => makers + prefetch as u64 + 1,
    };
    let minimum = window.saturating_mul(mean_block) + in_flight * batch_bytes + images;
    let cached = config.cache && everything <= config.memory_budget;
    Ok((minimum, if cached { everything } else { working }, cached))
}
