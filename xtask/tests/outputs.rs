//! What the commands write at a path a user names: a regular file or nothing else. A
//! symbolic link, a FIFO or a directory at that path is refused before any work, and left as
//! it was; `predict --out -` writes to standard output.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use common::{dp, failed, small_digits, succeeded};

/// A FIFO at `path`.
fn fifo(path: &Path) {
    let name = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path it is given.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0);
}

#[test]
fn outputs_replace_only_regular_files() {
    let scratch = common::scratch("outputs");
    let dir = scratch.path();
    small_digits(&dir.join("data"));
    let mut train = dp();
    train.args(["train", "--steps", "4", "--replicas", "1", "--no-plot", "--name", "run"]);
    train.arg("--data").arg(dir.join("data/train")).arg("--out").arg(dir.join("runs"));
    succeeded(&train.output().unwrap());
    let run = dir.join("runs/run");
    let eval = dir.join("data/eval");

    // Things a rename would have replaced with a regular file, at predict's output and at
    // the file `data export` writes into its output directory.
    let precious = dir.join("precious.txt");
    std::fs::write(&precious, "keep me").unwrap();
    let link = |path: &Path| std::os::unix::fs::symlink(&precious, path).unwrap();
    let directory = |path: &Path| std::fs::create_dir(path).unwrap();
    type Make<'a> = &'a dyn Fn(&Path);
    let cases: [(&str, Make<'_>, &str); 3] = [
        ("link", &link, "is a symbolic link"),
        ("pipe", &fifo, "is not a regular file"),
        ("directory", &directory, "is a directory"),
    ];
    for (name, make, says) in cases {
        let out = dir.join(format!("{name}.npy"));
        make(&out);
        let mut predict = dp();
        predict.arg("predict").arg(&run).arg("--data").arg(&eval).arg("--out").arg(&out);
        let stderr = failed(&predict.output().unwrap());
        assert!(stderr.contains(says) && stderr.contains(out.to_str().unwrap()), "{stderr}");
        let exported = dir.join(format!("export-{name}"));
        std::fs::create_dir(&exported).unwrap();
        make(&exported.join("label.npy"));
        let mut export = dp();
        export.args(["data", "export", "--format", "npy", "--features", "label", "--out"]);
        let stderr = failed(&export.arg(&exported).arg(&eval).output().unwrap());
        assert!(stderr.contains("label.npy") && stderr.contains(says), "{stderr}");
        for path in [out, exported.join("label.npy")] {
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            assert!(kind.is_symlink() || kind.is_fifo() || kind.is_dir(), "{path:?} replaced");
        }
    }
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");

    // A link in a run directory where a plot goes is not replaced either.
    let plot = run.join("loss.png");
    let _ = std::fs::remove_file(&plot);
    std::os::unix::fs::symlink(&precious, &plot).unwrap();
    let stderr = failed(&dp().arg("plot").arg(&run).output().unwrap());
    assert!(stderr.contains("loss.png") && stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");

    // `-` is standard output: the npy bytes, 256 records of 10 probabilities.
    let mut predict = dp();
    predict.arg("predict").arg(&run).arg("--data").arg(&eval).args(["--out", "-"]);
    let output = predict.output().unwrap();
    succeeded(&output);
    assert!(output.stdout.starts_with(b"\x93NUMPY"), "{:?}", &output.stdout[..16]);
    let header = String::from_utf8_lossy(&output.stdout[..128]);
    assert!(header.contains("'shape': (256, 10)"), "{header}");
    // A regular file is replaced, as asked.
    let file = dir.join("predictions.npy");
    std::fs::write(&file, "old").unwrap();
    let mut predict = dp();
    predict.arg("predict").arg(&run).arg("--data").arg(&eval).arg("--out").arg(&file);
    succeeded(&predict.output().unwrap());
    assert_eq!(std::fs::read(&file).unwrap()[..], output.stdout[..]);
}

#[test]
fn absurd_counts_are_refused_before_anything_starts() {
    let scratch = common::scratch("counts");
    let out = scratch.path().join("runs");
    let stderr =
        failed(&dp().args(["train", "--epochs", "0"]).arg("--out").arg(&out).output().unwrap());
    assert!(stderr.contains("give a positive number, or auto"), "{stderr}");
    // More processes than the per-core bound allows: refused before mpirun or any build.
    let stderr =
        failed(&dp().args(["train", "--procs", "100000"]).arg("--out").arg(&out).output().unwrap());
    assert!(stderr.contains("--oversubscribe") && stderr.contains("per-core"), "{stderr}");
    assert!(!out.exists());
}
