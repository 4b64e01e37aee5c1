//! dp-data alone: a CSV file imported into a sharded dataset, read back record by record, and
//! fed through the input pipeline in shuffled batches, as each of two ranks would see them.
//!
//! `cargo run -p dp-data --example import_and_batch`

use dp_data::{CsvOptions, Dataset, Pipeline, PipelineConfig, WriterOptions, import_csv};

/// Runs the example (a test runs it too).
pub(crate) fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("dp-data-example-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let csv = dir.join("points.csv");
    let mut text = String::from("x,y,label\n");
    for i in 0..1000 {
        text += &format!("{},{},{}\n", i as f32 / 100.0, (i % 7) as f32, i % 3);
    }
    std::fs::write(&csv, text)?;

    let options = CsvOptions { label: Some("label".into()), ..CsvOptions::default() };
    let manifest = import_csv(&csv, &dir.join("points"), &options, WriterOptions::default())?;
    println!("imported {} records: {}", manifest.records, manifest.schema);

    let dataset = Dataset::open(dir.join("points"))?;
    let record = dataset.get(42)?;
    println!(
        "record 42: features {:?}",
        record.dense::<f32>("features")?.iter().collect::<Vec<_>>()
    );

    for rank in 0..2 {
        let mut config = PipelineConfig::default();
        config.input = "features".into();
        config.batch_size = 100;
        config.rank = rank;
        config.world_size = 2;
        let mut pipeline = Pipeline::new(dir.join("points"), config, vec![])?;
        let batch = pipeline.next_batch()?;
        println!(
            "rank {rank}: {} batches an epoch; the first has x {:?} and labels {:?}...",
            pipeline.batches_per_epoch(),
            batch.x().shape(),
            &batch.y().to_vec()[..5]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
