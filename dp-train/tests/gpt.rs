//! Language models through the trainer: a GPT trains on a token dataset imported from text,
//! is evaluated and writes text from its run directory, two replicas equal one replica with
//! the global batch, a resumed run continues exactly, and its summary and metrics speak in
//! tokens and bits.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{TempDir, final_params_of, max_relative_difference, run_dir, train_losses};
use dp_data::{TextOptions, TokenDataset, WriterOptions, import_text};
use dp_model::ModelSpec;
use dp_train::{
    MetricsRecord, RunOptions, SampleOptions, SavedRun, TrainConfig, read_metrics, train,
};

const MODEL: &str = "gpt:2,2,32";
const CONTEXT: usize = 24;
/// The words of the text.
const WORDS: [&str; 8] = ["the", "model", "reads", "tokens", "and", "predicts", "next", "one"];

/// A byte-level token dataset of a small text with structure to learn (sentences of a few
/// words), imported once for all the tests: `train` and `eval` (the last 10%).
fn text() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dp-train-gpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut state = 7u64;
        let mut text = String::new();
        while text.len() < 40_000 {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let n = 3 + (state >> 60) as usize;
            // Three bits of the state a word (at most 18 words: 54 bits).
            let sentence: Vec<&str> =
                (0..n).map(|k| WORDS[((state >> (3 * k)) & 7) as usize]).collect();
            text.push_str(&sentence.join(" "));
            text.push_str(". ");
        }
        let file = dir.join("corpus.txt");
        std::fs::write(&file, text).unwrap();
        import_text(&[file.as_path()], &dir, &TextOptions::default(), WriterOptions::default())
            .unwrap();
        dir
    })
}

fn config(replicas: usize, steps: u64) -> TrainConfig {
    TrainConfig {
        train_data: text().join("train"),
        eval_data: Some(text().join("eval")),
        model: MODEL.into(),
        context: Some(CONTEXT),
        replicas,
        global_batch: 8,
        steps: Some(steps),
        timeout_s: 60.0,
        ..TrainConfig::default()
    }
}

fn spec() -> ModelSpec {
    ModelSpec::builtin(MODEL, &[CONTEXT], 256).unwrap()
}

#[test]
fn a_gpt_learns_the_text_with_the_defaults() {
    let out = TempDir::new("gpt-learns");
    let summary = train(config(1, 300), &RunOptions::new(&out.0), &mut ()).unwrap();
    let losses = train_losses(&run_dir(&out.0));
    let (first, last) = (losses[0].1, losses.last().unwrap().1);
    // Chance over 256 bytes is ln 256 = 5.5; the text uses a few letters.
    assert!(first > 4.5, "first loss {first}");
    let eval = summary.eval_loss.unwrap();
    println!("loss {first} -> {last}, eval {eval}");
    assert!(last < 2.0 && eval < 2.0, "loss {first} -> {last}, eval {eval}");

    // `eval` on the run's directory scores what the run's evaluation scored: every held-out
    // token after the first, predicted once.
    let run = SavedRun::open(&run_dir(&out.0)).unwrap();
    let evaluation = run.evaluate(&text().join("eval"), false).unwrap();
    let scores = &evaluation.model;
    assert!((scores.loss - eval).abs() < 1e-5 * eval, "eval {} vs the run's {eval}", scores.loss);
    let held_out = TokenDataset::open(&text().join("eval")).unwrap().len();
    assert_eq!(evaluation.tokens, Some(held_out - 1));
    let bits = scores.loss / std::f64::consts::LN_2;
    assert!((scores.bits_per_token.unwrap() - bits).abs() < 1e-12);
    // A byte a token.
    assert!((scores.bits_per_byte.unwrap() - bits).abs() < 1e-12);

    // Text: more tokens than the context holds, streamed as decoded, repeatable by seed, and
    // in the text's letters and words: a model that learned nothing draws from all 256 bytes
    // (19 of them the text's) and writes none of its words.
    let options = SampleOptions { tokens: 3 * CONTEXT, temperature: 0.5, top_k: 0, seed: 1 };
    let mut streamed = String::new();
    let generated = run
        .sample("the model ", &options, |piece| {
            streamed.push_str(piece);
            Ok(())
        })
        .unwrap();
    assert_eq!((generated.tokens.len(), &streamed), (3 * CONTEXT, &generated.text));
    let again = run.sample("the model ", &options, |_| Ok(())).unwrap();
    assert_eq!(again.text, generated.text);
    let written = &generated.text;
    let letters = written.chars().filter(|&c| c == ' ' || c == '.' || WORDS.concat().contains(c));
    let words: Vec<&str> =
        written.split(|c: char| !c.is_ascii_lowercase()).filter(|w| !w.is_empty()).collect();
    let known = words.iter().filter(|w| WORDS.contains(w)).count();
    println!("{written:?}: {known} of {} words known", words.len());
    assert!(letters.count() * 10 >= 9 * written.chars().count(), "{written:?}");
    assert!(known >= 3, "{written:?}: {known} of {} words known", words.len());

    // On a GPU the run evaluates to the CPU's loss and writes text of the same quality, with
    // the KV cache in device memory; a build or machine without one says so, and writes
    // nothing.
    let on_gpu = SavedRun::open(&run_dir(&out.0)).unwrap().on(dp_train::Device::Cuda);
    match on_gpu.evaluate(&text().join("eval"), false) {
        Ok(gpu) => {
            let loss = gpu.model.loss;
            assert!((loss - scores.loss).abs() < 1e-4 * scores.loss, "{loss} vs {}", scores.loss);
            let text = on_gpu.sample("the model ", &options, |_| Ok(())).unwrap().text;
            let words = text.split(|c: char| !c.is_ascii_lowercase()).filter(|w| !w.is_empty());
            assert!(words.filter(|w| WORDS.contains(w)).count() >= 3, "{text:?}");
        }
        Err(error) => {
            let error = error.to_string();
            assert!(error.contains("CUDA") || error.contains("cuda"), "{error}");
            let mut wrote = false;
            let refused = on_gpu.sample("the model ", &options, |_| {
                wrote = true;
                Ok(())
            });
            assert!(refused.is_err() && !wrote, "no text without a GPU");
            eprintln!("skipped the GPU's eval and sample: {error}");
        }
    }

    // A language model's run has no row of outputs per record, and reads no records.
    let predict = run.predict(&text().join("eval")).unwrap_err().to_string();
    assert!(predict.contains("use eval") && predict.contains("sample"), "{predict}");
    let records = run.evaluate(&common::digits().join("eval"), false).unwrap_err().to_string();
    assert!(records.contains("holds records"), "{records}");
}

#[test]
fn two_replicas_equal_one_with_the_global_batch_and_resume_continues_exactly() {
    let run = |replicas| {
        let out = TempDir::new("gpt-replicas");
        train(config(replicas, 4), &RunOptions::new(&out.0), &mut ()).unwrap();
        final_params_of(&run_dir(&out.0), &spec())
    };
    let one = run(1);
    let difference = max_relative_difference(&run(2), &one);
    assert!(difference < 1e-5, "two replicas: {difference:e} from one");

    let c = TrainConfig { eval_every: 3, ..config(2, 8) };
    let (whole, resumed, _out) = common::assert_resumes_exactly(c, 3);
    assert_eq!(final_params_of(&resumed, &spec()), final_params_of(&whole, &spec()));
}

#[test]
fn records_and_tokens_do_not_mix() {
    let out = TempDir::new("gpt-mixed");
    let c = TrainConfig { eval_data: Some(common::digits().join("eval")), ..config(1, 2) };
    let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
    assert!(error.contains("eval_data") && error.contains("holds records"), "{error}");
}

#[test]
fn a_language_models_summary_counts_tokens_and_bits_and_a_record_runs_does_not() {
    let out = TempDir::new("gpt-bits");
    let summary = train(config(1, 4), &RunOptions::new(&out.0), &mut ()).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
    assert_eq!(summary.context, Some(CONTEXT));
    let tokens = summary.tokens_per_s.unwrap();
    assert!(close(tokens, summary.samples_per_s * CONTEXT as f64), "{tokens} tokens/s");
    let (loss, bits) = (summary.eval_loss.unwrap(), summary.eval_bits_per_token.unwrap());
    assert!(close(bits, loss / std::f64::consts::LN_2), "eval loss {loss}: {bits} bits");
    // Byte-level data: a token is a byte.
    let per_byte = summary.eval_bits_per_byte.unwrap();
    assert!(close(per_byte, bits), "{per_byte} bits/byte against {bits} bits/token");
    let train_bits = summary.train_bits_per_token.unwrap();
    assert!(close(train_bits, summary.train_loss / std::f64::consts::LN_2), "{train_bits}");
    // The evaluation lines of the metrics say the same.
    let dir = run_dir(&out.0);
    let evals: Vec<_> = read_metrics(&dir.join(dp_train::METRICS))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            MetricsRecord::Eval(e) => Some(e),
            MetricsRecord::Train(_) => None,
        })
        .collect();
    assert!(!evals.is_empty());
    for e in evals {
        let bits = e.bits_per_token.unwrap();
        assert!(close(bits, e.eval_loss / std::f64::consts::LN_2), "step {}: {bits}", e.step);
        assert!(close(e.bits_per_byte.unwrap(), bits), "step {}", e.step);
    }
    let json = std::fs::read_to_string(dir.join(dp_train::SUMMARY)).unwrap();
    assert!(json.contains("\"tokens_per_s\"") && json.contains("\"eval_bits_per_byte\""));

    // A run on records has none of them, in its summary or its file.
    let records = TempDir::new("gpt-records-bits");
    let summary = train(common::config(1, 2), &RunOptions::new(&records.0), &mut ()).unwrap();
    let none = (summary.context, summary.tokens_per_s, summary.train_bits_per_token);
    assert_eq!(none, (None, None, None));
    assert_eq!((summary.eval_bits_per_token, summary.eval_bits_per_byte), (None, None));
    let json = std::fs::read_to_string(run_dir(&records.0).join(dp_train::SUMMARY)).unwrap();
    for field in ["context", "tokens_per_s", "bits_per_token", "bits_per_byte"] {
        assert!(!json.contains(field), "a record run's summary has `{field}`: {json}");
    }
    let metrics = std::fs::read_to_string(run_dir(&records.0).join(dp_train::METRICS)).unwrap();
    assert!(!metrics.contains("bits_per"), "{metrics}");
}
