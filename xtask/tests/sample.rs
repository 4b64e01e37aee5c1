//! `sample` writes nothing to standard output until everything it needs has been checked: a
//! bad temperature, a run that is not a language model, or another model's checkpoint is
//! refused with standard output empty, and a good request starts with the prompt.

mod common;

use std::path::Path;
use std::process::Output;

use common::{dp, small_digits};

fn succeeded(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
}

/// A refusal: a failed exit, an error that says `says`, and not one byte on standard output.
fn refused(output: &Output, says: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "", "{stderr}");
}

fn train(dir: &Path, data: &Path, name: &str, extra: &[&str]) {
    let mut train = dp();
    train.args(["train", "--steps", "2", "--replicas", "1", "--no-plot", "--name", name]);
    train.arg("--data").arg(data).arg("--out").arg(dir.join("runs")).args(extra);
    succeeded(&train.output().unwrap());
}

#[test]
fn sample_refuses_before_the_prompt_goes_out() {
    let scratch = common::scratch("sample");
    let dir = scratch.path();
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, "the model reads tokens and predicts the next one. ".repeat(80))
        .unwrap();
    let mut import = dp();
    import.args(["data", "import", "--format", "text", "--out"]).arg(dir.join("text"));
    succeeded(&import.arg(&corpus).output().unwrap());
    train(dir, &dir.join("text/train"), "lm", &["--model", "gpt:1,1,16", "--context", "8"]);
    small_digits(&dir.join("digits"));
    train(dir, &dir.join("digits/train"), "mlp", &[]);
    let (lm, mlp) = (dir.join("runs/lm"), dir.join("runs/mlp"));
    let sample = |run: &Path, extra: &[&str]| {
        let mut sample = dp();
        sample.arg("sample").arg(run).args(["--prompt", "PROMPT"]).args(extra);
        if !extra.contains(&"--tokens") {
            sample.args(["--tokens", "4"]);
        }
        sample.output().unwrap()
    };

    refused(&sample(&lm, &["--temperature=-1"]), "temperature");
    refused(&sample(&mlp, &[]), "only a language model writes text");
    // The digits model's checkpoint, copied into the language model's run.
    std::fs::copy(mlp.join(dp_train::CHECKPOINT), lm.join("other.ckpt")).unwrap();
    let other = sample(&lm, &["--checkpoint", "other.ckpt"]);
    assert!(!other.status.success());
    assert_eq!(String::from_utf8_lossy(&other.stdout), "");

    let output = sample(&lm, &[]);
    succeeded(&output);
    assert!(output.stdout.starts_with(b"PROMPT"), "{:?}", String::from_utf8_lossy(&output.stdout));
    // With nothing to generate, the prompt is still what was asked for.
    let output = sample(&lm, &["--tokens", "0"]);
    succeeded(&output);
    assert_eq!(String::from_utf8_lossy(&output.stdout), "PROMPT\n");
}
