//! `dp data import` and `data gen` killed with SIGKILL while writing shards: the
//! output path holds no dataset (only `OUT.partial` is left), `data verify` says so, and the
//! same command run again replaces the killed write's leftovers and gives a sound dataset
//! with nothing in its directory that its manifest does not name.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{dp, entries};

/// Shard files in `dir` (none while it does not exist).
fn shards(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("shard-"))
            .count()
    })
}

/// `dir` with `.partial` appended: where a write bound for `dir` puts its shards.
fn partial(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap().to_os_string();
    name.push(".partial");
    dir.with_file_name(name)
}

/// Starts `command`, waits until it has written `at_least` shards into `dir.partial`, and
/// kills it with SIGKILL.
fn kill_while_writing(mut command: Command, dir: &Path, at_least: usize) {
    let mut child: Child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    while shards(&partial(dir)) < at_least {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("finished before it was killed ({status}): make the input larger");
        }
        assert!(started.elapsed() < Duration::from_secs(300), "no shard was written");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

fn verify(dir: &Path) -> Output {
    dp().args(["data", "verify"]).arg(dir).output().unwrap()
}

fn succeeded(output: Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// Checks that `dir` is a sound dataset holding exactly its manifest and shards.
fn sound_and_alone(dir: &Path) {
    let verified = succeeded(verify(dir));
    assert!(verified.contains(": sound ("), "{verified}");
    let manifest = dp_data::Dataset::open(dir).unwrap().manifest().clone();
    let mut expected: Vec<String> = manifest.shards.iter().map(|s| s.file.clone()).collect();
    expected.push(dp_data::MANIFEST_FILE.into());
    expected.sort();
    assert_eq!(entries(dir), expected);
    assert!(!partial(dir).exists());
}

#[test]
fn a_killed_import_leaves_no_dataset_and_the_next_import_replaces_its_leftovers() {
    let scratch = common::scratch("import-killed");
    let dir = scratch.path();
    // 100,000 lines of ten non-zeros (about 7 MB), from a fixed stream.
    let input = dir.join("big.svm");
    let mut rng = dp_data::Rng::new(7);
    let mut text = String::new();
    for _ in 0..100_000 {
        text += if rng.below(2) == 1 { "+1" } else { "-1" };
        let mut index = 0;
        for _ in 0..10 {
            index += 1 + rng.below(100);
            text += &format!(" {index}:{:.3}", rng.next_f32());
        }
        text.push('\n');
    }
    std::fs::write(&input, text).unwrap();
    let out = dir.join("data");
    let import = |small_shards: bool| {
        let mut command = dp();
        command.args(["data", "import", "--format", "svmlight", "--threads", "1"]);
        if small_shards {
            command.args(["--block-size", "4096", "--shard-size", "4096"]);
        }
        command.arg("--out").arg(&out).arg(&input);
        command
    };

    kill_while_writing(import(true), &out, 20);
    assert!(!out.exists(), "a killed import left {}", out.display());
    let refused = verify(&out);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("no manifest.json"), "{message}");

    // Run again (with other options), it removes the killed import's shards.
    let imported = succeeded(import(false).output().unwrap());
    assert!(imported.contains("100000 records"), "{imported}");
    sound_and_alone(&out);

    // A shard the manifest does not name, as a killed import's next to a finished one's,
    // makes verify fail naming it.
    let orphan = out.join("shard-00019.dps");
    std::fs::write(&orphan, b"left by someone").unwrap();
    let found = verify(&out);
    let message = String::from_utf8_lossy(&found.stderr);
    assert!(!found.status.success(), "{message}");
    assert!(
        message.contains(&format!("{}: not part of the dataset", orphan.display())),
        "{message}"
    );

    // A directory of the user's is refused by name and left as it was.
    let mine = dir.join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), b"mine").unwrap();
    let mut command = dp();
    command.args(["data", "import", "--format", "svmlight", "--out"]).arg(&mine).arg(&input);
    let refused = command.output().unwrap();
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{message}");
    assert!(
        message.contains(&format!("{} is a directory that is not a dataset", mine.display())),
        "{message}"
    );
    assert_eq!(entries(&mine), ["notes.txt"]);
}

#[test]
fn a_killed_gen_is_replaced_by_the_next_one() {
    let scratch = common::scratch("gen-killed");
    let out = scratch.path().join("digits");
    let generate = |records: &str| {
        let mut command = dp();
        command.args(["data", "gen", "--threads", "1", "--records", records]);
        command.args(["--eval-records", "64", "--block-size", "4096", "--shard-size", "4096"]);
        command.arg("--out").arg(&out);
        command
    };
    kill_while_writing(generate("1000000"), &out.join("train"), 5);
    assert!(!out.join("train").exists());
    succeeded(generate("512").output().unwrap());
    sound_and_alone(&out.join("train"));
    sound_and_alone(&out.join("eval"));
}
