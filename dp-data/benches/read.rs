//! Reading the built-in dataset: sequential passes and random access under criterion, then a
//! report of the ratios against references measured in this same run (raw zstd decompression
//! of the same blocks, CRC32C of them, gzip -6 of the same records).
//! `cargo bench -p dp-data` (or `cargo xtask bench dp-data`).

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, Throughput};
use dp_data::measure::{gzip_reference, measure_read};
use dp_data::{Dataset, SyntheticDigits, WriterOptions, generate_digits};

const RECORDS: u64 = 20_000;

fn main() {
    let dir = std::env::temp_dir().join(format!("dp-data-bench-read-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = SyntheticDigits { records: RECORDS, eval_records: 1_000, seed: 1 };
    generate_digits(&dir, &spec, WriterOptions::default()).expect("generate the built-in dataset");
    let train: PathBuf = dir.join("train");
    let dataset = Dataset::open(&train).expect("open the built-in dataset");

    let mut criterion = Criterion::default().configure_from_args();
    {
        let mut group = criterion.benchmark_group("read");
        group.throughput(Throughput::Bytes(dataset.manifest().raw_bytes()));
        group.bench_function("sequential", |b| {
            b.iter(|| {
                for block in dataset.blocks() {
                    black_box(block.expect("read block").len());
                }
            })
        });
        group.throughput(Throughput::Elements(1));
        let mut i = 0u64;
        group.bench_function("get_random", |b| {
            b.iter(|| {
                i = (i + 7919 * 97) % dataset.len();
                black_box(dataset.get(i).expect("get").index())
            })
        });
        group.finish();
    }
    criterion.final_summary();

    if std::env::args().any(|a| a == "--bench") {
        report(&dataset);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn report(dataset: &Dataset) {
    let r = measure_read(dataset, 9, 2000, 7).expect("measure");
    let gzip = gzip_reference(dataset).expect("gzip reference");
    let verdict = |met: bool| if met { "(met)" } else { "(NOT MET)" };
    println!();
    println!(
        "built-in dataset: {} records in {} blocks, {:.2} MB raw, one thread, medians of 9 passes",
        r.records,
        r.blocks,
        r.raw_bytes as f64 / 1e6
    );
    println!("raw zstd decompression   {:>8.1} MB/s", r.zstd_bytes_per_s / 1e6);
    println!(
        "sequential read          {:>8.1} MB/s   {:.3}x zstd   >= 0.85 {}",
        r.read_bytes_per_s / 1e6,
        r.read_vs_zstd,
        verdict(r.read_vs_zstd >= 0.85)
    );
    println!(
        "CRC32C cost in the read  {:>8.2} %      <= 3% {}   (CRC32C of every block alone: {:.2} % of a read)",
        r.crc_fraction * 100.0,
        verdict(r.crc_fraction <= 0.03),
        r.crc_alone_fraction * 100.0
    );
    println!(
        "bytes on disk            {:>10}   gzip -6 of the same records {:>10}   {:.3}x   <= 1 {}",
        r.bytes_on_disk,
        gzip,
        r.bytes_on_disk as f64 / gzip as f64,
        verdict(r.bytes_on_disk <= gzip)
    );
    println!(
        "get(i), random           median {:.1} us, p99 {:.1} us",
        r.get_median_us, r.get_p99_us
    );
}
