//! The input pipeline on the built-in dataset: batches per second under criterion, then one
//! report against raw zstd decompression of the same blocks on as many threads, in rounds
//! that alternate the two in this same run. `cargo bench -p dp-data --bench pipeline`.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use dp_data::measure::measure_pipeline;
use dp_data::{
    Normalize, Pipeline, PipelineConfig, SyntheticDigits, WriterOptions, generate_digits,
};

const RECORDS: u64 = 200_000;

fn config(cache: bool) -> PipelineConfig {
    let mut config = PipelineConfig::default();
    config.batch_size = 256;
    config.cache = cache;
    config.memory_budget = 512 << 20;
    config
}

fn main() {
    let dir = std::env::temp_dir().join(format!("dp-data-bench-pipeline-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = SyntheticDigits { records: RECORDS, eval_records: 1_000, seed: 2 };
    generate_digits(&dir, &spec, WriterOptions::default()).expect("generate the built-in dataset");
    let train = dir.join("train");

    let mut criterion = Criterion::default().configure_from_args();
    {
        let mut group = criterion.benchmark_group("pipeline");
        group.throughput(Throughput::Elements(256));
        for (name, cache) in [("batch_no_cache", false), ("batch_cached", true)] {
            let transforms = vec![Box::new(Normalize::pixels(0.1307, 0.3081)) as _];
            let mut pipeline = Pipeline::new(&train, config(cache), transforms).expect("pipeline");
            group.bench_function(name, |b| {
                b.iter(|| black_box(pipeline.next_batch().expect("batch").len()))
            });
        }
        group.finish();
    }
    criterion.final_summary();

    if std::env::args().any(|a| a == "--bench") {
        // The consumer helps, with one worker fewer than the cores: as many threads make
        // batches as there are cores, like the reference's.
        let mut helped = config(true);
        helped.consumer_helps = true;
        helped.workers = helped.workers.saturating_sub(1).max(1);
        let r = measure_pipeline(&train, helped, 9).expect("measure");
        let verdict = |met: bool| if met { "(met)" } else { "(NOT MET)" };
        println!();
        println!(
            "built-in dataset, {} records/epoch, batch 256, {} worker thread(s) and the consumer, shuffle window 8; medians of {} rounds",
            r.records_per_epoch, r.workers, r.rounds
        );
        println!(
            "first epoch        {:>10.0} records/s  {:>7.1} MB/s   {:.3}x raw zstd on {} threads ({:.1} MB/s)   >= 0.85 {}",
            r.records_per_s,
            r.bytes_per_s / 1e6,
            r.first_epoch_vs_zstd,
            r.threads,
            r.zstd_bytes_per_s / 1e6,
            verdict(r.first_epoch_vs_zstd >= 0.85)
        );
        println!(
            "cache-filling epoch{:>10.0} records/s  {:.2}x the first epoch",
            r.fill_records_per_s,
            r.fill_records_per_s / r.records_per_s
        );
        println!(
            "cached epoch       {:>10.0} records/s  {:.2}x the first epoch   >= 3 {}",
            r.warm_records_per_s,
            r.warm_vs_first,
            verdict(r.warm_vs_first >= 3.0)
        );
        let peak = r.peak_bytes as f64 / r.memory_budget as f64;
        println!(
            "peak memory        {:.1} MiB of a {:.0} MiB budget ({peak:.3})   <= 1.05 {}",
            r.peak_bytes as f64 / (1 << 20) as f64,
            r.memory_budget as f64 / (1 << 20) as f64,
            verdict(peak <= 1.05)
        );
        println!(
            "first epoch time   load {:.0}%, map {:.0}%, consumer waiting {:.0}%",
            100.0 * r.load_share,
            100.0 * r.map_share,
            100.0 * r.consumer_wait_share,
        );
        println!(
            "shuffle            displacement {:.2} (1 = uniform); a batch mixes {:.1} blocks ({:.1} for a uniform shuffle)",
            r.shuffle_displacement, r.batch_blocks, r.batch_blocks_uniform
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
