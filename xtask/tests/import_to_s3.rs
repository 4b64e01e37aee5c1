//! `data import ... --out s3://...` against a real S3-compatible server on 127.0.0.1 (s3s-fs,
//! started here; skipped without it unless DP_REQUIRE_S3 is set, as CI sets it): a CSV file
//! and a text corpus (train and eval, and the BPE's tokenizer.json beside them) land at the
//! URL, each dataset with its manifest, and verify there.

mod common;

use std::path::Path;
use std::process::Output;

use common::dp;
use dp_data::LocalS3;

fn succeeded(output: Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    stdout
}

/// The files under `dir`, as paths relative to it, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match path.is_dir() {
            true => found.extend(files(&path).into_iter().map(|f| format!("{name}/{f}"))),
            false => found.push(name),
        }
    }
    found.sort();
    found
}

#[test]
fn imports_land_in_object_storage_dataset_by_dataset() {
    if LocalS3::binary().is_none() {
        assert!(
            std::env::var_os("DP_REQUIRE_S3").is_none(),
            "DP_REQUIRE_S3 is set but s3s-fs is not installed (scripts/setup-s3.sh)"
        );
        eprintln!("skipped: s3s-fs is not installed (bash scripts/setup-s3.sh)");
        return;
    }
    let objects = common::scratch("s3");
    // Sets the AWS_* variables the commands below inherit.
    let _server = LocalS3::start(objects.path()).unwrap();
    let scratch = common::scratch("s3-in");

    let csv = scratch.path().join("table.csv");
    // Hashed values, which do not compress away: several shards of 8 KiB.
    let mut state = 7u64;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 40) as f64 / (1u64 << 24) as f64
    };
    let rows: String =
        (0..3000).map(|i| format!("{:.6},{:.6},{}\n", next(), next(), i % 2)).collect();
    std::fs::write(&csv, format!("a,b,label\n{rows}")).unwrap();
    let mut import = dp();
    import.args(["data", "import", "--format", "csv", "--label", "label"]);
    import.args(["--block-size", "4096", "--shard-size", "8192", "--out", "s3://bucket/table"]);
    let report = succeeded(import.arg(&csv).output().unwrap());
    assert!(report.contains("s3://bucket/table: 3000 records"), "{report}");

    let corpus = scratch.path().join("corpus.txt");
    let words = ["the", "model", "reads", "data", "and", "writes", "tokens"];
    let text: String =
        (0..20_000).map(|i| words[i * 7 % 11 % words.len()].to_string() + " ").collect();
    std::fs::write(&corpus, text).unwrap();
    let mut import = dp();
    import.args(["data", "import", "--format", "text", "--tokenizer", "bpe:300"]);
    let report =
        succeeded(import.args(["--out", "s3://bucket/text"]).arg(&corpus).output().unwrap());
    assert!(report.contains("-> s3://bucket/text/train"), "{report}");

    let written = files(&objects.path().join("bucket"));
    let shards = written.iter().filter(|f| f.starts_with("table/shard-")).count();
    assert!(shards >= 3, "{written:?}");
    for expected in [
        "table/manifest.json",
        "text/eval/manifest.json",
        "text/eval/shard-00000.dps",
        "text/tokenizer.json",
        "text/train/manifest.json",
        "text/train/shard-00000.dps",
    ] {
        assert!(written.iter().any(|f| f == expected), "no {expected} in {written:?}");
    }
    for url in ["s3://bucket/table", "s3://bucket/text/train", "s3://bucket/text/eval"] {
        let report = succeeded(dp().args(["data", "verify", url]).output().unwrap());
        assert!(report.contains("sound"), "{report}");
    }
}
