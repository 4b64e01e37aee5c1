//! `dp data bench` on a user's image dataset: one JSON line with the pipeline's rate beside
//! the decoder's; a dataset without encoded images is refused, saying why.

mod common;

use common::{dp, failed, scratch, small_digits, succeeded};

#[test]
fn data_bench_measures_an_image_dataset_and_refuses_one_without_images() {
    let scratch = scratch("data-bench");
    let dir = scratch.path();
    let mut photos = dp();
    photos.args(["data", "photos", "--classes", "2", "--per-class", "6", "--sides", "80,120"]);
    succeeded(&photos.arg("--out").arg(dir.join("photos")).output().unwrap());
    let mut import = dp();
    import.args(["data", "import", "--format", "images", "--out"]).arg(dir.join("data"));
    succeeded(&import.arg(dir.join("photos")).output().unwrap());

    let mut bench = dp();
    bench.args(["data", "bench", "--image-size", "64", "--batch", "4", "--workers", "1"]);
    let output = bench.arg(dir.join("data")).output().unwrap();
    succeeded(&output);
    let stdout = String::from_utf8(output.stdout).unwrap();
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!((line["images"].as_u64(), line["decoder_images"].as_u64()), (Some(12), Some(12)));
    assert_eq!((line["image_size"].as_u64(), line["workers"].as_u64()), (Some(64), Some(1)));
    assert_eq!(line["crop"], "pad:8", "the trainer's recipe for 64-pixel samples");
    assert_eq!(line["flip"], false, "small pictures train unflipped");
    for rate in ["images_per_s", "decoder_images_per_s", "parallel_sampler_images_per_s"] {
        let value = line[rate].as_f64().unwrap_or(f64::NAN);
        assert!(value.is_finite() && value > 0.0, "{rate}: {line}");
    }
    // The pipeline holds what its plan says, the cached dataset included, and no more than
    // the pool's size classes round it up.
    let (peak, planned) = (line["peak_bytes"].as_u64(), line["planned_bytes"].as_u64());
    assert!(peak.is_some_and(|b| b > 0), "{line}");
    assert!(peak.zip(planned).is_some_and(|(p, q)| p * 5 <= q * 6), "{line}");

    let mut zero = dp();
    let output = zero.args(["data", "bench", "--image-size", "0"]).arg(dir.join("data")).output();
    let stderr = failed(&output.unwrap());
    assert!(stderr.contains("--image-size 0"), "{stderr}");

    small_digits(&dir.join("digits"));
    let mut dense = dp();
    let output = dense.args(["data", "bench"]).arg(dir.join("digits/train")).output().unwrap();
    let stderr = failed(&output);
    assert!(stderr.contains("has no encoded image feature"), "{stderr}");
}
