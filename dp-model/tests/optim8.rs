//! 8-bit optimizer state: what it costs (predicted before building and measured after), that
//! it tracks the unquantised optimizer, that pieces of whole blocks make exactly one step and
//! others are refused, and that checkpoints store and restore it exactly, refusing another
//! precision.

use dp_mem::{Pool, Tracker};
use dp_model::{
    Adam, AdamConfig, CheckpointReader, CheckpointWriter, Error, Model, ModelOptions, ModelSpec,
    Optimizer, STATE_BLOCK, Sgd, SgdConfig, ShardFile, StatePrecision, save_optimizer_shard,
};

use StatePrecision::{F32, Int8};

/// A fixed-seed generator of uniform values in [-1, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn adamw() -> AdamConfig {
    AdamConfig { weight_decay: 0.01, decoupled: true, ..AdamConfig::default() }
}

fn momentum() -> SgdConfig {
    SgdConfig { momentum: 0.9, nesterov: true, weight_decay: 1e-3 }
}

#[test]
fn state_bytes_for_predicts_state_bytes() {
    let pool = Pool::new(&Tracker::new());
    for len in [0, 1, 2047, 2048, 2049, 10_000] {
        for precision in [F32, Int8] {
            let adam = Adam::<f32>::with_precision(len, adamw(), precision, &pool).unwrap();
            assert_eq!(adam.state_bytes(), Adam::<f32>::state_bytes_for(len, precision));
            let adam = Adam::<f64>::with_precision(len, adamw(), precision, &pool).unwrap();
            assert_eq!(adam.state_bytes(), Adam::<f64>::state_bytes_for(len, precision));
            for config in [momentum(), SgdConfig::default()] {
                let sgd = Sgd::<f32>::with_precision(len, config, precision, &pool).unwrap();
                let predicted = Sgd::<f32>::state_bytes_for(len, config.momentum > 0.0, precision);
                assert_eq!(sgd.state_bytes(), predicted, "sgd {len} {precision:?}");
            }
        }
    }
    // Adam's 8 bytes per parameter become 2, plus 8 per block of 2,048.
    assert_eq!(Adam::<f32>::state_bytes_for(10_000, F32), 80_000);
    assert_eq!(Adam::<f32>::state_bytes_for(10_000, Int8), 20_000 + 2 * 5 * 4);
    assert_eq!(Sgd::<f32>::state_bytes_for(10_000, true, Int8), 10_000 + 5 * 4);
    // And the pool's accounting under OptState agrees.
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let adam = Adam::<f32>::with_precision(10_000, adamw(), Int8, &pool).unwrap();
    assert_eq!(tracker.snapshot().tags[&dp_mem::Tag::OptState].current, adam.state_bytes());
}

/// Makes an optimizer over `len` values at `precision`.
type Make = fn(usize, StatePrecision, &Pool) -> Box<dyn Optimizer<f32>>;

const MAKERS: [(&str, Make); 2] = [
    ("adam", |len, precision, pool| {
        let mut adam = Adam::with_precision(len, adamw(), precision, pool).unwrap();
        // Decay that starts and stops inside blocks.
        adam.decay_only(vec![100..3000, 4500..len]);
        Box::new(adam)
    }),
    ("sgd", |len, precision, pool| {
        let mut sgd = Sgd::with_precision(len, momentum(), precision, pool).unwrap();
        sgd.decay_only(vec![100..3000, 4500..len]);
        Box::new(sgd)
    }),
];

#[test]
fn pieces_of_whole_blocks_are_one_step_bitwise() {
    let pool = Pool::new(&Tracker::new());
    let len = 3 * STATE_BLOCK + 123;
    let mut rng = Lcg(11);
    let init = rng.vec(len);
    let grads: Vec<Vec<f32>> = (0..5).map(|_| rng.vec(len)).collect();
    for (name, make) in MAKERS {
        let (mut whole, mut pieces) = (make(len, Int8, &pool), make(len, Int8, &pool));
        let (mut p1, mut p2) = (init.clone(), init.clone());
        let bounds = [0, STATE_BLOCK, 3 * STATE_BLOCK, len];
        for g in &grads {
            whole.step(&mut p1, g, 0.01).unwrap();
            for (k, w) in bounds.windows(2).enumerate() {
                let (a, b) = (w[0], w[1]);
                pieces.step_part(&mut p2[a..b], &g[a..b], a, 0.01, k == 0).unwrap();
            }
        }
        assert_eq!(p1, p2, "{name}");
        assert_eq!(whole.state(), pieces.state(), "{name}");
        // The state did change, and is quantised.
        let state = whole.state();
        assert!(state.buffers.is_empty() && state.quantized[0].codes.iter().any(|&c| c != 0));
    }
}

#[test]
fn pieces_that_split_a_block_are_refused() {
    let pool = Pool::new(&Tracker::new());
    let len = 2 * STATE_BLOCK + 10;
    for (name, make) in MAKERS {
        let mut opt = make(len, Int8, &pool);
        let mut p = vec![0.5f32; len];
        let g = vec![0.1f32; len];
        // Starts inside a block.
        let err = opt.step_part(&mut p[100..STATE_BLOCK], &g[100..STATE_BLOCK], 100, 0.1, true);
        assert!(matches!(err, Err(Error::Optimizer { field: "piece", .. })), "{name}: {err:?}");
        // Ends inside a block that is not the last.
        let err = opt.step_part(&mut p[..STATE_BLOCK + 1], &g[..STATE_BLOCK + 1], 0, 0.1, true);
        assert!(matches!(err, Err(Error::Optimizer { field: "piece", .. })), "{name}: {err:?}");
        // Nothing was touched by the refusals.
        assert!(p.iter().all(|&v| v == 0.5));
        // The last, short block may end at the range's end; unquantised state takes any piece.
        let a = 2 * STATE_BLOCK;
        opt.step_part(&mut p[a..], &g[a..], a, 0.1, true).unwrap();
        let mut plain = make(len, F32, &pool);
        plain.step_part(&mut p[100..200], &g[100..200], 100, 0.1, true).unwrap();
    }
}

/// Minimises `sum_i a_i (x_i - t_i)^2 / 2` with curvatures `a_i` spread over four decades
/// (so the second moments in a block span eight), from one start, at `precision`; returns the
/// loss after each of `steps` steps.
fn quadratic(make: Make, precision: StatePrecision, steps: usize, lr: f64) -> Vec<f64> {
    let pool = Pool::new(&Tracker::new());
    let len = 5 * STATE_BLOCK;
    let mut rng = Lcg(3);
    let a: Vec<f32> = (0..len).map(|_| 10f32.powf(2.0 * rng.next() - 1.0)).collect();
    let t = rng.vec(len);
    let mut x = rng.vec(len);
    let mut opt = make(len, precision, &pool);
    let mut g = vec![0f32; len];
    let mut losses = Vec::new();
    for _ in 0..steps {
        for i in 0..len {
            g[i] = a[i] * (x[i] - t[i]);
        }
        opt.step(&mut x, &g, lr).unwrap();
        let loss: f64 =
            (0..len).map(|i| 0.5 * f64::from(a[i]) * f64::from(x[i] - t[i]).powi(2)).sum();
        losses.push(loss / len as f64);
    }
    losses
}

#[test]
fn eight_bit_state_tracks_unquantised_state_on_a_quadratic() {
    // Both reduce the loss by orders of magnitude, and 8-bit's loss stays within 10% of the
    // unquantised one's (plus a floor of 1e-3 of the start) at every tenth step: the
    // tolerance the rounding of the moments costs, without being able to hide divergence.
    for (name, make) in MAKERS {
        let exact = quadratic(make, F32, 300, 0.02);
        let eight = quadratic(make, Int8, 300, 0.02);
        let start = exact[0];
        assert!(exact[299] < start * 1e-2, "{name}: f32 went {start} -> {}", exact[299]);
        assert!(eight[299] < start * 1e-2, "{name}: int8 went {start} -> {}", eight[299]);
        for step in (0..300).step_by(10) {
            let (e, q) = (exact[step], eight[step]);
            assert!(
                (e - q).abs() <= 0.1 * e + 1e-3 * start,
                "{name} step {step}: f32 loss {e}, 8-bit {q}"
            );
        }
        // Quantisation does change the trajectory (this test compares two different things).
        assert_ne!(exact, eight, "{name}");
    }
}

#[test]
fn checkpoints_restore_eight_bit_state_exactly_and_refuse_another_precision() {
    let dir = std::env::temp_dir().join(format!("dp-model-optim8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::mlp(64, &[80], 10);
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 1)).unwrap();
    let len = model.params().len();
    assert!(len > 2 * STATE_BLOCK, "{len}");
    let mut rng = Lcg(5);
    let mut adam = Adam::<f32>::with_precision(len, adamw(), Int8, &pool).unwrap();
    for _ in 0..3 {
        adam.step(model.params_mut(), &rng.vec(len), 0.01).unwrap();
    }
    // Whole, in the checkpoint.
    let path = dir.join("whole.ckpt");
    CheckpointWriter::new(&model).with_optimizer(&adam).save(&path).unwrap();
    let mut reader = CheckpointReader::open(&path).unwrap();
    assert_eq!(reader.header().optimizer().unwrap().bits(), 8);
    let mut resumed = Adam::<f32>::with_precision(len, adamw(), Int8, &pool).unwrap();
    reader.restore_optimizer(&mut resumed, 0..len).unwrap();
    assert_eq!(resumed.state(), adam.state());
    // A part of whole blocks, as a replica's shard reads it.
    let mut reader = CheckpointReader::open(&path).unwrap();
    let tail = STATE_BLOCK..len;
    let mut part = Adam::<f32>::with_precision(tail.len(), adamw(), Int8, &pool).unwrap();
    reader.restore_optimizer(&mut part, tail.clone()).unwrap();
    let (got, want) = (part.state(), adam.state());
    assert_eq!(got.quantized[1].codes, &want.quantized[1].codes[tail.clone()]);
    assert_eq!(got.quantized[1].scales, &want.quantized[1].scales[1..]);
    // A part that splits a block is refused.
    let mut reader = CheckpointReader::open(&path).unwrap();
    let mut odd = Adam::<f32>::with_precision(len - 10, adamw(), Int8, &pool).unwrap();
    let err = reader.restore_optimizer(&mut odd, 10..len).unwrap_err();
    assert!(err.to_string().contains("whole blocks"), "{err}");
    // Another precision is refused, naming the setting.
    let mut reader = CheckpointReader::open(&path).unwrap();
    let mut other = Adam::<f32>::with_precision(len, adamw(), F32, &pool).unwrap();
    let err = reader.restore_optimizer(&mut other, 0..len).unwrap_err();
    assert!(err.to_string().contains("optimizer_bits = 8"), "{err}");
    assert!(other.state().buffers.iter().all(|b| b.iter().all(|&v| v == 0.0)));
    let f32_path = dir.join("f32.ckpt");
    let plain = Adam::<f32>::with_precision(len, adamw(), F32, &pool).unwrap();
    CheckpointWriter::new(&model).with_optimizer(&plain).save(&f32_path).unwrap();
    let mut reader = CheckpointReader::open(&f32_path).unwrap();
    let mut eight = Adam::<f32>::with_precision(len, adamw(), Int8, &pool).unwrap();
    let err = reader.restore_optimizer(&mut eight, 0..len).unwrap_err();
    assert!(err.to_string().contains("optimizer_bits = 32"), "{err}");

    // In shard files of two replicas (a block-aligned split), read back by one and by three.
    let split = STATE_BLOCK;
    let mut shards = Vec::new();
    for (i, range) in [0..split, split..len].into_iter().enumerate() {
        let mut shard = Adam::<f32>::with_precision(range.len(), adamw(), Int8, &pool).unwrap();
        let mut p = model.params().to_vec();
        let g = rng.vec(len);
        shard.step(&mut p[range.clone()], &g[range.clone()], 0.01).unwrap();
        let name = format!("shard{i}");
        save_optimizer_shard(&dir.join(&name), &shard, range.clone(), model.params()).unwrap();
        shards.push((ShardFile { name, start: range.start, end: range.end }, shard));
    }
    let files: Vec<ShardFile> = shards.iter().map(|(f, _)| f.clone()).collect();
    let path = dir.join("sharded.ckpt");
    CheckpointWriter::new(&model).with_optimizer_shards(&shards[0].1, files).save(&path).unwrap();
    let mut reader = CheckpointReader::open(&path).unwrap();
    let mut all = Adam::<f32>::with_precision(len, adamw(), Int8, &pool).unwrap();
    reader.restore_optimizer(&mut all, 0..len).unwrap();
    for buffer in 0..2 {
        let state = all.state();
        let (first, second) = (shards[0].1.state(), shards[1].1.state());
        let joined: Vec<u8> =
            [first.quantized[buffer].codes, second.quantized[buffer].codes].concat();
        let scales: Vec<f32> =
            [first.quantized[buffer].scales, second.quantized[buffer].scales].concat();
        assert_eq!(state.quantized[buffer].codes, &joined[..]);
        assert_eq!(state.quantized[buffer].scales, &scales[..]);
    }
    let mut reader = CheckpointReader::open(&path).unwrap();
    let mut middle = Adam::<f32>::with_precision(STATE_BLOCK, adamw(), Int8, &pool).unwrap();
    reader.restore_optimizer(&mut middle, STATE_BLOCK..2 * STATE_BLOCK).unwrap();
    assert_eq!(
        middle.state().quantized[0].codes,
        &shards[1].1.state().quantized[0].codes[..STATE_BLOCK]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
