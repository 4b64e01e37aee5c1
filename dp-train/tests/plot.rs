//! `plot_run`: the four PNGs of a run, their size, the atomic write, and the errors for a
//! metrics file that is missing, empty or damaged.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

mod common;

use common::TempDir;
use dp_train::{Error, EvalMetrics, MetricsRecord, MetricsWriter, StepMetrics, plot_run};

const PNGS: [&str; 4] = ["loss.png", "accuracy.png", "throughput.png", "memory.png"];

/// A plausible run: the loss falls and the accuracy rises with noise, throughput has a slow
/// first step and occasional dips, memory grows during warm-up and then stays, and there is an
/// evaluation every `eval_every` steps (none when 0).
fn write_run(dir: &Path, steps: u64, eval_every: u64) {
    let mut writer = MetricsWriter::append(&dir.join("metrics.jsonl")).unwrap();
    for step in 1..=steps {
        let t = step as f64 / steps as f64;
        let noise = ((step * 7919) % 101) as f64 / 100.0 - 0.5;
        let samples_per_s = if step == 1 {
            2_000.0
        } else if step % 37 == 0 {
            18_000.0
        } else {
            30_000.0 + 500.0 * noise
        };
        let mut memory = BTreeMap::new();
        memory.insert("Param".to_string(), 2 << 20);
        memory.insert("Grad".to_string(), 2 << 20);
        memory.insert("OptState".to_string(), if step < 3 { 0 } else { 4 << 20 });
        memory.insert("Activation".to_string(), 3 << 20);
        memory.insert("Data".to_string(), (1 << 20) + (step.min(20) << 16));
        memory.insert("Comm".to_string(), 1 << 19);
        let record = StepMetrics {
            step,
            epoch: step / 100,
            loss: 2.3 * (-4.0 * t).exp() + 0.05 + 0.05 * noise,
            accuracy: Some((1.0 - 0.9 * (-5.0 * t).exp() + 0.03 * noise).clamp(0.0, 1.0)),
            lr: 0.01,
            samples_per_s,
            step_s: 256.0 / samples_per_s,
            data_wait_s: 0.0002 * (1.0 + noise),
            comm_exposed_s: 0.0005 * (1.0 + noise),
            memory,
        };
        writer.write(&MetricsRecord::Train(record)).unwrap();
        if eval_every > 0 && step % eval_every == 0 {
            let eval = EvalMetrics {
                step,
                epoch: step / 100,
                eval_loss: 2.3 * (-4.0 * t).exp() + 0.08,
                eval_accuracy: Some(1.0 - 0.9 * (-5.0 * t).exp() - 0.01),
                ..EvalMetrics::default()
            };
            writer.write(&MetricsRecord::Eval(eval)).unwrap();
        }
    }
}

/// The width and height from a PNG's header, after checking the signature and that the first
/// chunk is IHDR (which the format requires).
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = fs::read(path).unwrap();
    assert!(bytes.len() > 33, "{} is too short for a PNG", path.display());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
    assert_eq!(&bytes[12..16], b"IHDR", "{} does not start with IHDR", path.display());
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(be(8), 13, "IHDR length");
    // The last chunk of a complete PNG is IEND: a truncated file would not end with it.
    assert_eq!(
        &bytes[bytes.len() - 8..bytes.len() - 4],
        b"IEND",
        "{} is truncated",
        path.display()
    );
    (be(16), be(20))
}

/// Files in `dir` whose name says they are temporary.
fn leftovers(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".tmp"))
        .collect()
}

#[test]
fn a_run_with_eval_gets_four_pngs_of_the_expected_size() {
    let dir_tmp = TempDir::new("plot-full");
    let dir = dir_tmp.0.as_path();
    write_run(dir, 400, 50);
    let written = plot_run(dir).unwrap();
    let expected: Vec<PathBuf> = PNGS.iter().map(|name| dir.join(name)).collect();
    assert_eq!(written, expected);
    for path in &written {
        assert_eq!(png_size(path), (1000, 600), "{}", path.display());
    }
    assert!(leftovers(dir).is_empty(), "temporary files left: {:?}", leftovers(dir));

    // Plotting again replaces the images in place.
    let again = plot_run(dir).unwrap();
    assert_eq!(again, expected);
    assert!(leftovers(dir).is_empty());
}

#[test]
fn a_run_with_only_train_records_still_plots_and_the_eval_series_shows_when_present() {
    let with_eval_tmp = TempDir::new("plot-with-eval");
    let with_eval = with_eval_tmp.0.as_path();
    let without_eval_tmp = TempDir::new("plot-train-only");
    let without_eval = without_eval_tmp.0.as_path();
    write_run(with_eval, 120, 40);
    write_run(without_eval, 120, 0);
    plot_run(with_eval).unwrap();
    let written = plot_run(without_eval).unwrap();
    for path in &written {
        assert_eq!(png_size(path), (1000, 600), "{}", path.display());
    }
    // The train series are identical, so the loss images differ only by the eval series.
    let loss = |dir: &Path| fs::read(dir.join("loss.png")).unwrap();
    assert_ne!(loss(with_eval), loss(without_eval), "eval loss is not drawn");
    assert_eq!(
        fs::read(with_eval.join("memory.png")).unwrap(),
        fs::read(without_eval.join("memory.png")).unwrap(),
        "eval records changed the memory plot"
    );
}

#[test]
fn a_resumed_run_with_repeated_steps_plots() {
    let dir_tmp = TempDir::new("plot-resumed");
    let dir = dir_tmp.0.as_path();
    write_run(dir, 80, 20);
    // A resume from step 40 appends steps 41.. again.
    let mut writer = MetricsWriter::append(&dir.join("metrics.jsonl")).unwrap();
    for step in 41..=90 {
        let record = StepMetrics {
            step,
            loss: 0.3,
            accuracy: Some(0.9),
            samples_per_s: 1000.0,
            step_s: 0.25,
            ..Default::default()
        };
        writer.write(&MetricsRecord::Train(record)).unwrap();
    }
    for path in plot_run(dir).unwrap() {
        assert_eq!(png_size(&path), (1000, 600), "{}", path.display());
    }
}

fn assert_names_file(err: &Error, file: &Path, also: &str) {
    let text = err.to_string();
    assert!(
        text.contains(&file.display().to_string()),
        "`{text}` does not name {}",
        file.display()
    );
    assert!(text.contains(also), "`{text}` does not say `{also}`");
}

#[test]
fn a_missing_metrics_file_is_an_error_naming_it() {
    let dir_tmp = TempDir::new("plot-missing");
    let dir = dir_tmp.0.as_path();
    let err = plot_run(dir).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert_names_file(&err, &dir.join("metrics.jsonl"), "open");
    assert!(fs::read_dir(dir).unwrap().next().is_none(), "something was written");
}

#[test]
fn an_empty_metrics_file_is_an_error_naming_it() {
    let dir_tmp = TempDir::new("plot-empty");
    let dir = dir_tmp.0.as_path();
    let metrics = dir.join("metrics.jsonl");
    for content in ["", "\n\n", "{\"kind\":\"train\",\"st"] {
        fs::write(&metrics, content).unwrap();
        let err = plot_run(dir).unwrap_err();
        assert!(matches!(err, Error::Run { .. }), "{err:?}");
        assert_names_file(&err, &metrics, "no records");
    }
    // Eval records alone give nothing to plot against steps either.
    fs::write(&metrics, "").unwrap();
    let mut writer = MetricsWriter::append(&metrics).unwrap();
    writer.write(&MetricsRecord::Eval(EvalMetrics { step: 5, ..Default::default() })).unwrap();
    assert_names_file(&plot_run(dir).unwrap_err(), &metrics, "no training steps");
    assert!(!PNGS.iter().any(|name| dir.join(name).exists()), "a PNG was written");
}

#[test]
fn a_corrupt_line_is_an_error_naming_the_file_and_line_but_a_torn_last_line_is_not() {
    let dir_tmp = TempDir::new("plot-corrupt");
    let dir = dir_tmp.0.as_path();
    write_run(dir, 30, 0);
    let metrics = dir.join("metrics.jsonl");
    let text = fs::read_to_string(&metrics).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();

    // A run killed mid-write leaves a torn last line, which is skipped.
    let torn = format!("{}\n{{\"kind\":\"train\",\"step\":31,\"lo", text.trim_end());
    fs::write(&metrics, torn).unwrap();
    plot_run(dir).unwrap();

    lines[2] = "{\"kind\":\"train\",\"step\":3,\"loss\":oops}";
    fs::write(&metrics, lines.join("\n") + "\n").unwrap();
    let err = plot_run(dir).unwrap_err();
    assert!(matches!(err, Error::Run { .. }), "{err:?}");
    assert_names_file(&err, &metrics, "line 3");
}

#[test]
fn a_failed_write_leaves_no_temporary_file() {
    let dir_tmp = TempDir::new("plot-blocked");
    let dir = dir_tmp.0.as_path();
    write_run(dir, 20, 10);
    // A directory where the image should go is refused, not replaced.
    fs::create_dir(dir.join("accuracy.png")).unwrap();
    fs::write(dir.join("accuracy.png").join("keep"), "x").unwrap();
    let err = plot_run(dir).unwrap_err();
    assert_names_file(&err, &dir.join("accuracy.png"), "is a directory");
    assert!(dir.join("accuracy.png").join("keep").exists());
    assert!(leftovers(dir).is_empty(), "temporary files left: {:?}", leftovers(dir));
    assert_eq!(png_size(&dir.join("loss.png")), (1000, 600));
}
