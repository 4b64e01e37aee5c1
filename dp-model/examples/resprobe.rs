//! probe
use dp_model::{Model, ModelOptions, ModelSpec, Precision, StepOptions, Targets};
fn main() {
    let spec = ModelSpec::builtin("resnet20", &[3, 32, 32], 10).unwrap();
    let prec = if std::env::var("BF16").is_ok() { Precision::Bf16 } else { Precision::F32 };
    let pool = dp_mem::Pool::new(&dp_mem::Tracker::new());
    let mut model: Model<f32> =
        Model::new(&spec, &pool, ModelOptions::new(128, 1).precision(prec)).unwrap();
    let x =
        ndarray::Array2::from_shape_fn((128, 3072), |(i, j)| ((i * 7 + j * 3) % 11) as f32 / 11.0);
    let y: Vec<i64> = (0..128).map(|i| (i % 10) as i64).collect();
    let steps: usize = std::env::var("STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let t = std::time::Instant::now();
    for s in 0..steps {
        let t0 = std::time::Instant::now();
        model
            .forward_backward(
                x.view(),
                Targets::Classes(&y),
                &StepOptions { step: s as u64, ..Default::default() },
            )
            .unwrap();
        eprintln!("step {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    }
    eprintln!("mean {:.1} ms", t.elapsed().as_secs_f64() * 1e3 / steps as f64);
}
