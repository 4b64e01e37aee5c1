//! Language models through the trainer: a GPT trains on a token dataset imported from text,
//! two replicas equal one replica with the global batch, and a resumed run continues exactly.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use common::{
    StopAfter, TempDir, eval_losses, final_params_of, max_relative_difference, run_dir,
    train_losses,
};
use dp_data::{TextOptions, WriterOptions, import_text};
use dp_model::ModelSpec;
use dp_train::{RunOptions, TrainConfig, train};

const MODEL: &str = "gpt:2,2,32";
const CONTEXT: usize = 24;

/// A byte-level token dataset of a small text with structure to learn (sentences of a few
/// words), imported once for all the tests: `train` and `eval` (the last 10%).
fn text() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dp-train-gpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let words = ["the", "model", "reads", "tokens", "and", "predicts", "next", "one"];
        let mut state = 7u64;
        let mut text = String::new();
        while text.len() < 40_000 {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let n = 3 + (state >> 60) as usize;
            // Three bits of the state a word (at most 18 words: 54 bits).
            let sentence: Vec<&str> =
                (0..n).map(|k| words[((state >> (3 * k)) & 7) as usize]).collect();
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

    let whole = TempDir::new("gpt-whole");
    let c = TrainConfig { eval_every: 3, ..config(2, 8) };
    train(c.clone(), &RunOptions::new(&whole.0), &mut ()).unwrap();
    let parts = TempDir::new("gpt-parts");
    let options = RunOptions::new(&parts.0);
    let mut stopper = StopAfter { step: 3, stop: Arc::clone(&options.stop) };
    assert!(train(c, &options, &mut stopper).unwrap().interrupted);
    let dir = run_dir(&parts.0);
    let resume = RunOptions { resume: Some(dir.clone()), ..RunOptions::new(&parts.0) };
    assert_eq!(train(TrainConfig::default(), &resume, &mut ()).unwrap().steps, 8);
    let whole = run_dir(&whole.0);
    let bits =
        |v: Vec<(u64, f64)>| v.into_iter().map(|(s, l)| (s, l.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(train_losses(&dir)), bits(train_losses(&whole)));
    assert_eq!(bits(eval_losses(&dir)), bits(eval_losses(&whole)));
    assert_eq!(final_params_of(&dir, &spec()), final_params_of(&whole, &spec()));
}

#[test]
fn records_and_tokens_do_not_mix() {
    let out = TempDir::new("gpt-mixed");
    let c = TrainConfig { eval_data: Some(common::digits().join("eval")), ..config(1, 2) };
    let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
    assert!(error.contains("eval_data") && error.contains("holds records"), "{error}");
}
