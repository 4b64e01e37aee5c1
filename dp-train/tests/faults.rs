//! Faults that must lose nothing: a second writer, a run killed after its checkpoint with its
//! metrics torn, a run killed before its first checkpoint, a resume of a finished run, and a
//! config edited below its checkpoint. Each asserts the files a run leaves, byte for byte
//! where they must not change.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::{Duration, Instant};

use common::{
    StopAfter, TempDir, checkpoint_step, config, digits, final_params, run_dir, train_losses,
};
use dp_train::{
    ByteSize, CHECKPOINT, CONFIG, Error, Fault, FaultKind, METRICS, Observer, RunInfo, RunOptions,
    StepMetrics, TrainConfig, train,
};

fn resume_options(dir: &Path) -> RunOptions {
    RunOptions { resume: Some(dir.to_path_buf()), ..RunOptions::new(dir.parent().unwrap()) }
}

/// Every file of a run directory and its bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn a_resume_after_a_kill_between_checkpoints_repeats_no_step() {
    let out = TempDir::new("faults-torn");
    let whole = out.0.join("whole");
    train(config(2, 12), &RunOptions::new(&whole), &mut ()).unwrap();
    let uninterrupted = train_losses(&run_dir(&whole));

    // A run stopped with a checkpoint, whose process then wrote two more steps and half a
    // line before it was killed.
    let parts = out.0.join("parts");
    let options = RunOptions::new(&parts);
    let mut stopper = StopAfter { step: 6, stop: Arc::clone(&options.stop) };
    let stopped = train(config(2, 12), &options, &mut stopper).unwrap();
    let dir = run_dir(&parts);
    let metrics = std::fs::read_to_string(dir.join(METRICS)).unwrap();
    let mut later = String::new();
    for step in stopped.steps + 1..=stopped.steps + 2 {
        later += &format!(
            "{{\"kind\":\"train\",\"step\":{step},\"epoch\":0,\"loss\":999.0,\"accuracy\":0.0,\"lr\":0.0,\"samples_per_s\":0.0,\"step_s\":0.0,\"data_wait_s\":0.0,\"comm_exposed_s\":0.0,\"memory\":{{}}}}\n"
        );
    }
    std::fs::write(dir.join(METRICS), format!("{metrics}{later}{{\"kind\":\"tra")).unwrap();

    let resumed = train(TrainConfig::default(), &resume_options(&dir), &mut ()).unwrap();
    assert_eq!(resumed.steps, 12);
    let losses = train_losses(&dir);
    let bits = |l: &[(u64, f64)]| l.iter().map(|(s, v)| (*s, v.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(&losses), bits(&uninterrupted), "every step once, as uninterrupted");
    let whole_summary = train_losses(&run_dir(&whole));
    assert_eq!(bits(&whole_summary), bits(&losses));
    // The summary covers the whole run, not only the resumed part.
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(dp_train::SUMMARY)).unwrap()).unwrap();
    let tail = &uninterrupted[uninterrupted.len() - 2..];
    let want = tail.iter().map(|(_, l)| l).sum::<f64>() / 2.0;
    assert_eq!(summary["train_loss"].as_f64().unwrap().to_bits(), want.to_bits(), "{summary}");
}

/// Holds the run at its second step until told to go on.
struct Gate {
    reached: SyncSender<()>,
    go: Receiver<()>,
}

impl Observer for Gate {
    fn step(&mut self, metrics: &StepMetrics) {
        if metrics.step == 2 {
            self.reached.send(()).unwrap();
            // A test that failed drops the sender: go on then, so nothing waits forever.
            let _ = self.go.recv();
        }
    }
}

/// Reports the run directory.
struct Started(SyncSender<std::path::PathBuf>);

impl Observer for Started {
    fn started(&mut self, run: &RunInfo) {
        self.0.send(run.run_dir.clone()).unwrap();
    }
}

#[test]
fn a_second_writer_is_refused_at_once_and_the_first_goes_on() {
    let out = TempDir::new("faults-writer");
    let (reached, at_step) = sync_channel(1);
    let (release, go) = sync_channel(1);
    let (started, dir) = sync_channel(1);
    std::thread::scope(|s| {
        // Dropped when an assertion below fails, which releases the first run.
        let release = release;
        let first = s.spawn(|| {
            struct Both(Started, Gate);
            impl Observer for Both {
                fn started(&mut self, run: &RunInfo) {
                    self.0.started(run);
                }
                fn step(&mut self, metrics: &StepMetrics) {
                    self.1.step(metrics);
                }
            }
            let mut observer = Both(Started(started), Gate { reached, go });
            train(config(1, 6), &RunOptions::new(&out.0), &mut observer)
        });
        let dir = dir.recv().unwrap();
        at_step.recv().unwrap();
        let before = snapshot(&dir);
        let began = Instant::now();
        let error = train(TrainConfig::default(), &resume_options(&dir), &mut ()).unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(5), "refused after {:?}", began.elapsed());
        let text = error.to_string();
        let pid = std::process::id().to_string();
        assert!(text.contains("in use by another run") && text.contains(&pid), "{text}");
        assert_eq!(snapshot(&dir), before, "the refused writer changed the run directory");
        release.send(()).unwrap();
        let summary = first.join().unwrap().unwrap();
        assert_eq!(summary.steps, 6);
    });
}

#[test]
fn a_run_killed_before_its_first_checkpoint_restarts_from_step_0() {
    let out = TempDir::new("faults-early");
    let whole = out.0.join("whole");
    train(config(2, 6), &RunOptions::new(&whole), &mut ()).unwrap();

    // Replica 0 fails at the first step: there is no step to save.
    let early = out.0.join("early");
    let fault = Fault { rank: 0, step: 0, kind: FaultKind::Error };
    let options = RunOptions { fault: Some(fault), ..RunOptions::new(&early) };
    let error = train(config(2, 6), &options, &mut ()).unwrap_err();
    assert!(error.to_string().contains("injected fault at step 0"), "{error}");
    let dir = run_dir(&early);
    assert!(dir.join(CONFIG).exists() && !dir.join(CHECKPOINT).exists());

    let resumed = train(TrainConfig::default(), &resume_options(&dir), &mut ()).unwrap();
    assert_eq!(resumed.steps, 6);
    assert_eq!(train_losses(&dir), train_losses(&run_dir(&whole)));
    assert_eq!(final_params(&dir), final_params(&run_dir(&whole)));
}

#[test]
fn resuming_a_finished_run_says_so_and_changes_nothing() {
    let out = TempDir::new("faults-finished");
    train(config(1, 4), &RunOptions::new(&out.0), &mut ()).unwrap();
    let dir = run_dir(&out.0);
    let before = snapshot(&dir);
    let error = train(TrainConfig::default(), &resume_options(&dir), &mut ()).unwrap_err();
    assert!(matches!(error, Error::Finished { steps: 4, .. }), "{error}");
    assert!(error.to_string().contains("is finished at step 4: nothing to resume"), "{error}");
    assert_eq!(snapshot(&dir), before);
    // A directory that is not a run (the data's, say) is named as such and left as it was:
    // no lock file is made in it.
    let data = digits().join("train");
    let before = snapshot(&data);
    let error = train(TrainConfig::default(), &resume_options(&data), &mut ()).unwrap_err();
    assert!(
        error.to_string().contains("is not a run directory (it has no config.toml)"),
        "{error}"
    );
    assert_eq!(snapshot(&data), before);
    let missing = out.0.join("no-such-run");
    let error = train(TrainConfig::default(), &resume_options(&missing), &mut ()).unwrap_err();
    assert!(error.to_string().contains("is not a run directory"), "{error}");
}

#[test]
fn a_config_edited_below_its_checkpoint_is_refused() {
    let out = TempDir::new("faults-edited");
    train(config(1, 4), &RunOptions::new(&out.0), &mut ()).unwrap();
    let dir = run_dir(&out.0);
    let saved = std::fs::read_to_string(dir.join(CONFIG)).unwrap();
    std::fs::write(dir.join(CONFIG), saved.replace("steps = 4", "steps = 2")).unwrap();
    let before = snapshot(&dir);
    let error = train(TrainConfig::default(), &resume_options(&dir), &mut ()).unwrap_err();
    assert!(
        matches!(&error, Error::Config { field, what } if field == "steps"
            && what.contains("2 steps, fewer than the 4 its checkpoint has done")),
        "{error}"
    );
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn a_diverging_run_stops_at_that_step_and_keeps_its_last_good_checkpoint() {
    // A learning rate that blows the loss up at step 2, and one so large that step 1's update
    // overflows the parameters while that step's loss (computed before it) is finite.
    for (lr, what, at) in [(1e30, "the loss", 2), (1e300, "a parameter", 1)] {
        let out = TempDir::new(&format!("faults-diverge-{at}"));
        let c = TrainConfig { lr: Some(lr), checkpoint_every: 1, ..config(2, 40) };
        let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(error, Error::NonFinite { step, what: w, .. } if step == at && w == what),
            "{text}"
        );
        assert!(
            text.contains(&format!("training diverged at step {at}: {what} is"))
                && text.contains("(lr)")
                && text.contains("clip_grad_norm"),
            "{text}"
        );
        let dir = run_dir(&out.0);
        if at > 1 {
            // The checkpoint is the last step's whose parameters were finite, and it loads.
            assert!(final_params(&dir).iter().all(|p| p.is_finite()));
            let checkpoint = dp_model::CheckpointReader::open(&dir.join(CHECKPOINT)).unwrap();
            let saved = format!("\"step\":{}", at - 1);
            assert!(
                checkpoint.header().extra().contains(&saved),
                "{}",
                checkpoint.header().extra()
            );
        } else {
            assert!(!dir.join(CHECKPOINT).exists(), "a model with infinite parameters was saved");
        }
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(dp_train::SUMMARY)).unwrap()).unwrap();
        assert_eq!(summary["diverged_at"], at, "{summary}");
        assert_eq!(summary["steps"], at - 1, "{summary}");
    }
}

#[test]
fn a_loss_that_blows_up_but_stays_finite_is_a_divergence_too() {
    // Adam at lr 1e6 sends the loss to about 1e20 and keeps it finite: evaluations every 4
    // steps; the windows ending at 4 and 8 are far above ln 10, so the run ends at step 8,
    // with no model kept as the best.
    let out = TempDir::new("faults-exploded");
    let c = TrainConfig {
        lr: Some(1e6),
        optimizer: Some(common::adam()),
        eval_every: 4,
        checkpoint_every: 4,
        ..config(2, 40)
    };
    let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, Error::Exploded { step: 8, since: 5, .. }), "{text}");
    assert!(text.contains("lower the learning rate (lr)"), "{text}");
    let dir = run_dir(&out.0);
    assert!(!dir.join(dp_train::BEST).exists(), "a blown-up model was kept as the best");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(dp_train::SUMMARY)).unwrap()).unwrap();
    assert_eq!((summary["diverged_at"].as_u64(), summary["steps"].as_u64()), (Some(8), Some(8)));
    // The same settings at a sane learning rate train to the end.
    let c = TrainConfig { optimizer: Some(common::adam()), eval_every: 4, ..config(2, 40) };
    train(c, &RunOptions::new(out.0.join("sane")), &mut ()).unwrap();
}

#[test]
fn budgets_too_small_name_their_key_and_leave_no_run_directory() {
    let out = TempDir::new("faults-budget");
    // The default MLP's parameters alone are 2 MiB; 64 shuffled blocks of digits are more
    // than 1 MiB.
    let model = "mlp".to_string();
    let small_model = TrainConfig { model_budget: Some(ByteSize(1 << 20)), model, ..config(2, 4) };
    let small_data =
        TrainConfig { data_budget: ByteSize(1 << 20), shuffle_window: 64, ..config(2, 4) };
    for (key, c) in [("model_budget", small_model), ("data_budget", small_data)] {
        let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err();
        let text = error.to_string();
        assert!(matches!(&error, Error::Config { field, .. } if field == key), "{text}");
        assert!(text.contains(&format!("raise {key}")), "{text}");
        assert!(!text.contains("Tracker::") && !text.contains("Pool::"), "{text}");
    }
    let left: Vec<_> = std::fs::read_dir(&out.0).unwrap().collect();
    assert!(left.is_empty(), "a failed setup left {left:?}");
}

/// A CSV dataset of 200 records of 4 features, labels `i % 3` except `label` at record 137.
fn csv_with_label(dir: &Path, label: i64) -> std::path::PathBuf {
    let mut text = String::from("a,b,c,d,label\n");
    for i in 0..200 {
        let y = if i == 137 { label } else { i % 3 };
        text += &format!("{},{},{},{},{y}\n", i % 7, i % 5, i % 3, i % 11);
    }
    let csv = dir.join(format!("labels-{label}.csv"));
    std::fs::write(&csv, text).unwrap();
    let out = dir.join(format!("labels-{label}"));
    if out.exists() {
        return out;
    }
    let options = dp_data::CsvOptions { label: Some("label".into()), ..Default::default() };
    dp_data::import_csv(&csv, &out, &options, dp_data::WriterOptions::default()).unwrap();
    out
}

#[test]
fn a_bad_label_is_an_error_naming_it_its_record_and_the_limit() {
    let out = TempDir::new("faults-labels");
    let small = |data: std::path::PathBuf, classes: Option<usize>| TrainConfig {
        train_data: data,
        eval_data: None,
        model: "mlp:8".into(),
        classes,
        global_batch: 20,
        steps: Some(40),
        ..TrainConfig::default()
    };
    let cases = [
        (-1, None, "label -1 of record 137 is outside 0..3"),
        (-1, Some(3), "label -1 of record 137 is outside 0..3"),
        (7, Some(3), "label 7 of record 137 is outside 0..3"),
        (1 << 40, None, "label 1099511627776 of record 137 is outside 0..1048576"),
    ];
    for (label, classes, want) in cases {
        let data = csv_with_label(&out.0, label);
        // The dataset's manifest knows the bad label and its record, so the run refuses it
        // before its first step, however short the run: it never trains on it.
        let range = dp_data::Dataset::open(&data).unwrap().manifest().ranges["label"];
        let bad =
            if label < 0 { (range.min, range.min_record) } else { (range.max, range.max_record) };
        assert_eq!(bad, (label, 137));
        let runs = out.0.join("runs");
        for steps in [1, 40] {
            let c = TrainConfig { steps: Some(steps), ..small(data.clone(), classes) };
            let error = train(c, &RunOptions::new(&runs), &mut ()).unwrap_err();
            let text = error.to_string();
            assert!(text.contains(want), "label {label}, classes {classes:?}: {text}");
            assert!(!runs.exists(), "label {label}, classes {classes:?}: a run directory");
        }
    }
    // An evaluation label past the training data's classes fails at setup, not at the first
    // evaluation: no run directory is made.
    let runs = out.0.join("eval-runs");
    let c = TrainConfig {
        eval_data: Some(csv_with_label(&out.0, 9)),
        ..small(csv_with_label(&out.0, 2), None)
    };
    let error = train(c, &RunOptions::new(&runs), &mut ()).unwrap_err().to_string();
    assert!(error.contains("label 9 of record 137 is outside 0..3"), "{error}");
    assert!(!runs.exists());
}

/// Says why a test that needs a tmpfs cannot run here, or fails it where it must run
/// (`DP_REQUIRE_MOUNT`, which CI sets when it runs as root).
fn skip(why: &str) -> Option<Tmpfs> {
    assert!(std::env::var_os("DP_REQUIRE_MOUNT").is_none(), "{why}, and DP_REQUIRE_MOUNT is set");
    eprintln!("skipping: {why}");
    None
}

/// A small tmpfs mounted for a test (root only; `None`, with the reason printed, elsewhere),
/// unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(name: &str, kib: u64) -> Option<Tmpfs> {
        let dir = std::env::temp_dir().join(format!("dp-train-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let size = format!("size={kib}k");
        let mounted =
            Command::new("mount").args(["-t", "tmpfs", "-o", &size, "tmpfs"]).arg(&dir).output();
        match mounted {
            Ok(out) if out.status.success() => Some(Tmpfs(dir)),
            Ok(out) => {
                skip(&format!("cannot mount a tmpfs: {}", String::from_utf8_lossy(&out.stderr)))
            }
            Err(e) => skip(&format!("cannot run mount: {e}")),
        }
    }

    fn read_only(&self) {
        let status = Command::new("mount").args(["-o", "remount,ro"]).arg(&self.0).status();
        assert!(status.unwrap().success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect()
}

#[test]
fn a_full_disk_stops_the_run_where_its_record_does_and_it_resumes_elsewhere() {
    full_disk("full-disk", false);
}

#[test]
fn a_full_disk_under_background_saves_stops_the_run_and_it_resumes_elsewhere() {
    full_disk("full-disk-async", true);
}

/// The full-disk test, with checkpoints written in the background or not.
fn full_disk(name: &str, checkpoint_async: bool) {
    // A checkpoint of this model is about 190 KB and a metrics line 335 bytes: two
    // checkpoints (the old one and the one being written) and about 200 lines fill 448 KiB.
    let Some(disk) = Tmpfs::mount(name, 448) else { return };
    let c =
        || TrainConfig { checkpoint_every: 1, checkpoint_async, eval_data: None, ..config(1, 300) };
    let out = TempDir::new(&format!("faults-{name}"));
    train(c(), &RunOptions::new(&out.0), &mut ()).unwrap();
    let uninterrupted = train_losses(&run_dir(&out.0));

    let error = train(c(), &RunOptions::new(&disk.0), &mut ()).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("No space left on device"), "{text}");
    let dir = run_dir(&disk.0);
    assert_eq!(temporaries(&dir), Vec::<String>::new(), "a failed write left a temporary file");
    // The checkpoint is whole, and the metrics hold every step up to it.
    let checkpoint = dp_model::CheckpointReader::open(&dir.join(CHECKPOINT)).unwrap();
    let state: serde_json::Value = serde_json::from_str(checkpoint.header().extra()).unwrap();
    let at = state["step"].as_u64().unwrap();
    assert!(at > 0 && at < 300, "checkpoint at step {at}");
    let steps: Vec<u64> = train_losses(&dir).iter().map(|(s, _)| *s).collect();
    assert_eq!(steps[..at as usize], (1..=at).collect::<Vec<_>>()[..]);

    // Moved to a disk with room, it finishes as if nothing had happened.
    let moved = out.0.join("moved");
    std::fs::create_dir_all(&moved).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, moved.join(path.file_name().unwrap())).unwrap();
    }
    train(TrainConfig::default(), &resume_options(&moved), &mut ()).unwrap();
    let bits =
        |l: Vec<(u64, f64)>| l.into_iter().map(|(s, v)| (s, v.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(train_losses(&moved)), bits(uninterrupted));
}

#[test]
fn a_read_only_run_directory_is_an_error_naming_it_that_changes_nothing() {
    let Some(disk) = Tmpfs::mount("read-only", 4096) else { return };
    train(config(1, 4), &RunOptions::new(&disk.0), &mut ()).unwrap();
    let dir = run_dir(&disk.0);
    let before = snapshot(&dir);
    disk.read_only();
    let error = train(TrainConfig::default(), &resume_options(&dir), &mut ()).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("Read-only file system") && text.contains(&*dir.to_string_lossy()),
        "{text}"
    );
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn nan_data_is_refused_at_import_and_stops_training_when_allowed_in() {
    let out = TempDir::new("faults-nan");
    let mut text = String::from("a,b,label\n");
    for i in 0..400 {
        let a = if i == 77 { "nan".to_string() } else { format!("{}", i % 7) };
        text += &format!("{a},{},{}\n", i % 5, i % 2);
    }
    let csv = out.0.join("nan.csv");
    std::fs::write(&csv, text).unwrap();
    let options = dp_data::CsvOptions { label: Some("label".into()), ..Default::default() };
    let refused = out.0.join("refused");
    let error = dp_data::import_csv(&csv, &refused, &options, dp_data::WriterOptions::default())
        .unwrap_err();
    assert!(error.to_string().contains("record 77"), "{error}");
    assert!(!refused.exists());

    let mut allow = dp_data::WriterOptions::default();
    allow.allow_nonfinite = true;
    let kept = out.0.join("kept");
    dp_data::import_csv(&csv, &kept, &options, allow).unwrap();
    let c = TrainConfig {
        train_data: kept,
        eval_data: None,
        model: "mlp:8".into(),
        global_batch: 400,
        steps: Some(3),
        ..TrainConfig::default()
    };
    // Adapting the inputs' scaling meets the NaN before any step.
    let error = train(c.clone(), &RunOptions::new(out.0.join("runs")), &mut ()).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("`normalize`") && text.contains("NaN in record 77"), "{text}");
    let c = TrainConfig { normalize: dp_train::Normalization::None, ..c };
    let error = train(c, &RunOptions::new(out.0.join("runs")), &mut ()).unwrap_err();
    let text = error.to_string();
    // Debug builds name the input; release builds stop at the first non-finite loss or
    // parameter (ReLU passes a NaN input's gradient to the weights, not to the loss).
    assert!(
        text.contains("the input of record 77 (epoch 0) holds NaN")
            || text.contains("training diverged at step 1"),
        "{text}"
    );
}

#[test]
fn replicas_whose_parameters_drift_apart_stop_the_run_at_the_next_check() {
    let out = TempDir::new("faults-desync");
    // Replica 1's first parameter changes in its last bit before step 7; the checksums are
    // compared every 5 steps and checkpoints taken every 4. Replicas that share their
    // parameters cannot drift apart, so these hold their own, as processes do.
    let fault = Fault { rank: 1, step: 7, kind: FaultKind::Desync };
    let options = RunOptions { fault: Some(fault), ..RunOptions::new(&out.0) };
    let c = TrainConfig {
        checksum_every: 5,
        checkpoint_every: 4,
        share_params: false,
        ..config(2, 20)
    };
    let error = train(c, &options, &mut ()).unwrap_err();
    match &error {
        Error::Diverged { step: 10, differ, agreed: 5, checksums } => {
            assert_eq!((differ.as_slice(), checksums.len()), ([1].as_slice(), 2));
        }
        other => panic!("{other}"),
    }
    let text = error.to_string();
    assert!(text.contains("replica(s) [1] disagree with replica 0"), "{text}");
    // Nothing is saved past the check that found it: the last checkpoint is step 8's.
    let dir = run_dir(&out.0);
    assert_eq!(checkpoint_step(&dir), 8);
}
