//! `data import --format text`: two text files become OUT/train and OUT/eval, with bytes and
//! with a BPE trained on them; the report says what was made, and the datasets verify and
//! open as token datasets.

mod common;

use std::path::Path;
use std::process::Output;

use common::dp;
use dp_data::{TokenDataset, TokenWidth, TokenizerKind};

/// About `bytes` bytes of lines of words (some multi-byte) from a fixed stream.
fn text(seed: u64, bytes: usize) -> String {
    const WORDS: [&str; 12] = [
        "the",
        "and",
        "of",
        "token",
        "stream",
        "naïve",
        "日本語",
        "window",
        "a",
        "is",
        "🦀",
        "data",
    ];
    let mut rng = dp_data::Rng::new(seed);
    let mut text = String::new();
    while text.len() < bytes {
        for _ in 0..3 + rng.below(9) {
            text += WORDS[rng.below(WORDS.len() as u64) as usize];
            text.push(' ');
        }
        text += ".\n";
    }
    text
}

fn succeeded(output: Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    stdout
}

fn import(files: &[&Path], out: &Path, extra: &[&str]) -> String {
    let mut command = dp();
    command.args(["data", "import", "--format", "text", "--out"]).arg(out);
    command.args(files).args(extra);
    succeeded(command.output().unwrap())
}

#[test]
fn text_files_import_as_train_and_eval_token_datasets() {
    let scratch = common::scratch("text");
    let dir = scratch.path();
    let (a, b) = (dir.join("a.txt"), dir.join("b.txt"));
    let (first, second) = (text(1, 20_000), text(2, 10_000));
    std::fs::write(&a, &first).unwrap();
    std::fs::write(&b, &second).unwrap();
    let n = first.len() + second.len();

    let bytes = dir.join("bytes");
    let report = import(&[&a, &b], &bytes, &[]);
    let train_tokens = (n as f64 * 0.9) as usize;
    for expected in [
        format!(
            "2 file(s), {n} bytes of text -> {n} tokens (bytes, vocabulary 256, stored as u16)"
        ),
        format!("train {train_tokens} tokens"),
        format!("eval  {} tokens", n - train_tokens),
    ] {
        assert!(report.contains(&expected), "`{expected}` not in:\n{report}");
    }
    for split in ["train", "eval"] {
        let mut verify = dp();
        succeeded(verify.args(["data", "verify"]).arg(bytes.join(split)).output().unwrap());
    }

    let bpe = dir.join("bpe");
    let report = import(&[&a, &b], &bpe, &["--tokenizer", "bpe:400", "--eval-fraction", "0.2"]);
    assert!(report.contains("tokenizer.json") && report.contains("(bpe, vocabulary"), "{report}");
    let train = TokenDataset::open(&bpe.join("train")).unwrap();
    let eval = TokenDataset::open(&bpe.join("eval")).unwrap();
    assert_eq!((train.tokenizer().kind(), train.width()), (TokenizerKind::Bpe, TokenWidth::U16));
    let all: Vec<u32> = [train.read_all().unwrap(), eval.read_all().unwrap()].concat();
    assert_eq!(train.tokenizer().decode(&all).unwrap(), first + &second);
    assert!(train.tokenizer().bytes_per_token().unwrap() > 1.5);

    // A bad setting is refused with the knob's name, and nothing is written.
    let refused = dir.join("refused");
    let mut command = dp();
    command.args(["data", "import", "--format", "text", "--eval-fraction", "1.5", "--out"]);
    let output = command.arg(&refused).arg(&a).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("eval_fraction"));
    assert!(!refused.join("train").exists());
}
