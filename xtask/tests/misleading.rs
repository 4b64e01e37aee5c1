//! Commands that used to exit 0 with something other than what was asked: a run named out of
//! `--out`, `--skip-corrupt` on an import that cannot skip, a preview "to standard output"
//! written to a file named `-`.

mod common;

use common::{dp, entries, failed, small_digits, succeeded};

#[test]
fn a_run_name_is_one_directory_under_out() {
    let scratch = common::scratch("names");
    let dir = scratch.path();
    small_digits(&dir.join("data"));
    let runs = dir.join("nest/runs");
    let absolute = dir.join("elsewhere");
    for name in ["../escape", absolute.to_str().unwrap(), "", ".", ".."] {
        let mut train = dp();
        train.args(["train", "--steps", "1", "--replicas", "1", "--no-plot", "--name", name]);
        train.arg("--data").arg(dir.join("data/train")).arg("--out").arg(&runs);
        let stderr = failed(&train.output().unwrap());
        assert!(stderr.contains("one directory name under --out"), "{name:?}: {stderr}");
    }
    // Nothing was made, in --out or beside it.
    assert_eq!(entries(dir), ["data"]);
}

#[test]
fn skip_corrupt_is_refused_where_the_import_cannot_skip() {
    let scratch = common::scratch("skip");
    let dir = scratch.path();
    std::fs::write(dir.join("in.tfrecord"), b"").unwrap();
    let mut import = dp();
    import.args(["data", "import", "--format", "tfrecord", "--skip-corrupt", "--out"]);
    import.arg(dir.join("out")).arg(dir.join("in.tfrecord"));
    let stderr = failed(&import.output().unwrap());
    assert!(stderr.contains("--skip-corrupt is for --format images"), "{stderr}");
    assert!(stderr.contains("tfrecord import stops"), "{stderr}");
    assert!(!dir.join("out").exists());
}

#[test]
fn a_preview_to_dash_goes_to_standard_output() {
    let scratch = common::scratch("preview");
    let dir = scratch.path();
    let mut photos = dp();
    photos.args(["data", "photos", "--classes", "2", "--per-class", "3", "--sides", "40,60"]);
    succeeded(&photos.arg("--out").arg(dir.join("photos")).output().unwrap());
    let mut import = dp();
    import.args(["data", "import", "--format", "images", "--out"]).arg(dir.join("data"));
    succeeded(&import.arg(dir.join("photos")).output().unwrap());
    let mut preview = dp();
    preview.current_dir(dir).args(["data", "preview", "data", "--count", "4", "--out", "-"]);
    let output = preview.output().unwrap();
    succeeded(&output);
    assert!(output.stdout.starts_with(b"\x89PNG\r\n"), "{:?}", &output.stdout[..16]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("standard output"), "{stderr}");
    assert_eq!(entries(dir), ["data", "photos"], "no file named `-`");
    // The grid says how its samples were made: the trainer's recipe for 32-pixel samples,
    // or the policy asked for.
    assert!(stderr.contains("crop pad:4 (the whole image shifted by up to 4 px"), "{stderr}");
    preview.args(["--crop", "resized:0.5", "--augment", "flip-h"]);
    let output = preview.output().unwrap();
    succeeded(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("crop resized:0.5 (random resized crops of 50-100%"), "{stderr}");
    assert!(stderr.contains("; flip-h)"), "{stderr}");
}
