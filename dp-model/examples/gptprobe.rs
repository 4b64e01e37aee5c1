//! probe
use dp_model::{GptShape, Model, ModelOptions, ModelSpec, Recompute, StepOptions, Targets};
fn main() {
    let shape = GptShape { layers: 6, heads: 6, dim: 384, dropout: 0.2 };
    let spec = ModelSpec::gpt("gpt-mini", 65, 256, shape);
    let pool = dp_mem::Pool::new(&dp_mem::Tracker::new());
    let x = ndarray::Array2::from_shape_fn((8, 256), |(i, j)| ((i * 7 + j * 3) % 65) as f32);
    let y: Vec<i64> = (0..8 * 256).map(|i| ((i * 5) % 65) as i64).collect();
    let mut models: Vec<(String, Model<f32>)> =
        [Recompute::Off, Recompute::Auto, Recompute::Selective]
            .into_iter()
            .map(|r| {
                (
                    format!("{r:?}"),
                    Model::new(&spec, &pool, ModelOptions::new(8, 1).recompute(r)).unwrap(),
                )
            })
            .collect();
    let mut times = vec![vec![]; 3];
    for round in 0..6 {
        for (k, (_, m)) in models.iter_mut().enumerate() {
            let t = std::time::Instant::now();
            m.forward_backward(
                x.view(),
                Targets::Classes(&y),
                &StepOptions { step: round, ..Default::default() },
            )
            .unwrap();
            if round > 0 {
                times[k].push(t.elapsed().as_secs_f64());
            }
        }
    }
    for (k, (name, m)) in models.iter().enumerate() {
        times[k].sort_by(|a, b| a.partial_cmp(b).unwrap());
        let med = times[k][times[k].len() / 2];
        println!(
            "{name}: {:.1} ms, saved {:.1} MB",
            med * 1e3,
            m.memory().saved_activations as f64 / 1e6
        );
    }
}
