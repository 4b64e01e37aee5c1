//! `dp eval`, `dp predict` and `dp sample`: a run's model on
//! another dataset, or a language model's text.

use std::path::Path;

use anyhow::{Context, Result};
use dp_train::{Device, SampleOptions, SavedRun, Scores};

/// Prints the run's loss, accuracy and confusion matrix on `data`; with `int8`, the int8-weight
/// model's beside them, and both models' weight memory.
pub(crate) fn eval(
    run_dir: &Path,
    checkpoint: &str,
    data: &Path,
    (int8, device): (bool, Device),
) -> Result<()> {
    let run = SavedRun::open_checkpoint(run_dir, checkpoint)?.on(device);
    if device == Device::Cuda && run.tokens().is_none() {
        eprintln!("note: a classifier or regression is evaluated on the CPU");
    }
    let evaluation =
        run.evaluate(data, int8).with_context(|| format!("evaluate on {}", data.display()))?;
    match evaluation.tokens {
        Some(tokens) => println!("tokens         {tokens} in {} windows", evaluation.records),
        None => println!("records        {}", evaluation.records),
    }
    let line = |name: &str, s: &Scores| {
        let scores = match (s.accuracy, s.rmse, s.mae, s.bits_per_token) {
            (Some(accuracy), .., Some(bits)) => format!(
                "next-token accuracy {:.2}%  bits/token {bits:.4}  bits/byte {:.4}",
                100.0 * accuracy,
                s.bits_per_byte.unwrap_or(f64::NAN)
            ),
            (Some(accuracy), ..) => format!("accuracy {:.2}%", 100.0 * accuracy),
            (None, Some(rmse), Some(mae), _) => format!("rmse {rmse:.4}  mae {mae:.4}"),
            _ => String::new(),
        };
        let mib = s.weight_bytes as f64 / (1 << 20) as f64;
        println!("{name:<14} {scores}  loss {:.4}  weights {mib:.2} MiB", s.loss);
    };
    line("f32", &evaluation.model);
    if let Some(q) = &evaluation.int8 {
        line("int8", q);
        let smaller = evaluation.model.weight_bytes as f64 / q.weight_bytes.max(1) as f64;
        match (q.accuracy, evaluation.model.accuracy) {
            (Some(int8), Some(f32)) => println!(
                "int8 vs f32    accuracy {:+.2} points, weights {smaller:.2}x smaller",
                100.0 * (int8 - f32)
            ),
            _ => println!("int8 vs f32    weights {smaller:.2}x smaller"),
        }
    }
    print_confusion(&evaluation.model.confusion, run.class_names());
    Ok(())
}

/// A classifier's confusion matrix, rows the labels and columns the predictions, when it fits
/// a screen; the classes by name when the run has their names.
fn print_confusion(confusion: &[Vec<u64>], names: Option<&[String]>) {
    const MOST: usize = 20;
    if confusion.is_empty() {
        return;
    }
    if confusion.len() > MOST {
        println!("confusion      {} classes: more than {MOST}, not printed", confusion.len());
        return;
    }
    if let Some(names) = names {
        let numbered: Vec<String> =
            names.iter().enumerate().map(|(k, name)| format!("{k} {name}")).collect();
        println!("classes        {}", numbered.join(", "));
    }
    // Columns carry the class numbers; rows their names, where known.
    let width = confusion.iter().flatten().max().map_or(1, |m| m.to_string().len()).max(3);
    let row_name = |label: usize| match names.and_then(|names| names.get(label)) {
        Some(name) => name.chars().take(16).collect(),
        None => label.to_string(),
    };
    let name_width = (0..confusion.len()).map(|c| row_name(c).chars().count()).max().unwrap_or(0);
    let name_width = name_width.max(6);
    println!("confusion      rows: label, columns: predicted");
    print!("{:>name_width$}", "");
    (0..confusion.len()).for_each(|c| print!(" {c:>width$}"));
    println!();
    for (label, row) in confusion.iter().enumerate() {
        print!("{:>name_width$}", row_name(label));
        row.iter().for_each(|n| print!(" {n:>width$}"));
        println!();
    }
}

/// Writes the run's outputs for every record of `data` to `out` (npy, f32, dataset order):
/// class probabilities `[records, classes]`, or a regression's values `[records, 1]`; `-`
/// writes them to standard output.
pub(crate) fn predict(run_dir: &Path, checkpoint: &str, data: &Path, out: &Path) -> Result<()> {
    let to_stdout = out.as_os_str() == "-";
    if !to_stdout {
        // Before the work: the path may hold something that must not be replaced.
        dp_data::check_output_file(out)?;
    }
    let run = SavedRun::open_checkpoint(run_dir, checkpoint)?;
    let predictions =
        run.predict(data).with_context(|| format!("predict on {}", data.display()))?;
    let shape = [predictions.records, predictions.columns as u64];
    let what = match predictions.regression {
        true => "predicted values".to_string(),
        false => format!("{} class probabilities", predictions.columns),
    };
    if to_stdout {
        let mut stdout = std::io::stdout().lock();
        dp_data::write_npy_f32_to(&mut stdout, &shape, &predictions.values)
            .context("write the predictions to standard output")?;
        eprintln!("wrote {} records x {what} (f32 npy) to standard output", predictions.records);
        return Ok(());
    }
    dp_data::write_npy_f32(out, &shape, &predictions.values)?;
    println!("wrote {} ({} records x {what}, f32)", out.display(), predictions.records);
    if let Some(names) = run.class_names() {
        println!("columns        {}", names.join(", "));
    }
    Ok(())
}

/// Writes `options.tokens` tokens of a language model's run after `prompt` to standard
/// output as they come (the prompt first), and how fast to standard error.
///
/// Nothing goes out before the first generated text: by then the options, the run (a
/// language model), its checkpoint, tokenizer and the prompt's tokens have all been checked,
/// so a refusal leaves standard output empty rather than holding a prompt that reads like
/// the start of an answer.
pub(crate) fn sample(
    (run_dir, checkpoint, device): (&Path, &str, Device),
    prompt: &str,
    options: &SampleOptions,
) -> Result<()> {
    use std::io::Write;
    let run = SavedRun::open_checkpoint(run_dir, checkpoint)?.on(device);
    let mut stdout = std::io::stdout().lock();
    let mut prompt_written = false;
    let mut write = |text: &str| -> dp_train::Result<()> {
        let prompt = if prompt_written { "" } else { prompt };
        prompt_written = true;
        // A closed pipe (`| head`) ends the writing, as it ends any command's.
        stdout
            .write_all(prompt.as_bytes())
            .and_then(|()| stdout.write_all(text.as_bytes()))
            .and_then(|()| stdout.flush())
            .map_err(|e| dp_train::Error::Io {
                path: "standard output".into(),
                op: "write",
                source: e,
            })
    };
    let generated = run.sample(prompt, options, &mut write)?;
    // With no text generated (`--tokens 0`) the prompt still opens the output.
    write("\n")?;
    eprintln!(
        "{} tokens after a prompt of {} in {:.2} s ({:.0} tokens/s)",
        generated.tokens.len(),
        generated.prompt_tokens,
        generated.seconds,
        generated.tokens.len() as f64 / generated.seconds.max(1e-9)
    );
    Ok(())
}
