//! Pruning, int8 quantization and checkpoints: the bytes drop by what the technique
//! promises, and what comes back is what went in.

mod support;

use std::path::PathBuf;

use dp_mem::{Pool, Tracker};
use dp_model::{
    Adam, CheckpointHeader, CheckpointReader, CheckpointWriter, Error, Model, ModelOptions,
    ModelSpec, Optimizer, PruneSchedule, Pruner, QuantizedModel, Sgd, ShardFile, Sparsity,
    StepOptions, Targets, save_optimizer_shard,
};
use ndarray::s;
use support::{Rng, blobs};

/// A scratch directory for one test (`.0` is its path), removed when dropped, also when the
/// test fails.
// The second field is held for its drop, which removes the directory.
struct TempDir(PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = tempfile::Builder::new().prefix(&format!("dp-model-{name}-")).tempdir().unwrap();
        TempDir(dir.path().to_path_buf(), dir)
    }
}

/// Trains an MLP for `steps` on the generated task, calling `after_step` after each update.
fn train(
    model: &mut Model<f32>,
    pool: &Pool,
    steps: u64,
    mut after_step: impl FnMut(u64, &mut [f32]),
) {
    let (x, y) = blobs(2048, model.input_len(), model.outputs(), 1.6, 3, 0);
    let mut opt = Sgd::new(
        model.params().len(),
        dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        pool,
    )
    .unwrap();
    for step in 0..steps {
        let start = (step as usize * 64) % 2048;
        let opts = StepOptions { step, ..Default::default() };
        model
            .forward_backward(
                x.slice(s![start..start + 64, ..]),
                Targets::Classes(&y[start..start + 64]),
                &opts,
            )
            .unwrap();
        let (params, grads) = model.params_and_grads();
        opt.step(params, grads, 0.05).unwrap();
        after_step(step, model.params_mut());
    }
}

fn accuracy(model: &mut Model<f32>) -> f64 {
    let (x, y) = blobs(512, model.input_len(), model.outputs(), 1.6, 3, 1);
    model.evaluate(x.view(), Targets::Classes(&y)).unwrap().accuracy()
}

#[test]
fn gradual_global_pruning_reaches_its_target_and_pruned_weights_stay_zero() {
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::mlp(64, &[128, 64], 10);
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(512, 1)).unwrap();
    let schedule = PruneSchedule { start: 50, end: 250, every: 25 };
    let mut pruner = Pruner::new(model.layout(), Sparsity::Global(0.8), schedule).unwrap();
    let mut sparsities = Vec::new();
    train(&mut model, &pool, 400, |step, params| {
        pruner.update(step, params);
        sparsities.push(pruner.sparsity());
    });
    assert_eq!(sparsities[49], 0.0);
    assert!(sparsities.windows(2).all(|w| w[1] >= w[0]), "sparsity never falls");
    assert!((pruner.sparsity() - 0.8).abs() < 1e-4, "{}", pruner.sparsity());
    let weights: Vec<_> = model.layout().weights().map(|t| t.range()).collect();
    let total: usize = weights.iter().map(|r| r.len()).sum();
    let zeros =
        weights.iter().flat_map(|r| r.clone()).filter(|&i| model.params()[i] == 0.0).count();
    assert_eq!(zeros, (0.8 * total as f64).round() as usize);
    for i in weights.iter().flat_map(|r| r.clone()) {
        assert_eq!(pruner.is_pruned(i), model.params()[i] == 0.0);
    }
    let biases_untouched = model
        .layout()
        .tensors()
        .iter()
        .filter(|t| t.role == dp_model::ParamRole::Bias)
        .all(|t| !t.range().any(|i| pruner.is_pruned(i)));
    assert!(biases_untouched);
    let acc = accuracy(&mut model);
    println!("accuracy at 80% sparsity: {acc:.3}");
    assert!(acc > 0.9, "{acc}");

    // A resumed pruner rebuilds the same mask from the zeros.
    let mut resumed = Pruner::new(model.layout(), Sparsity::Global(0.8), schedule).unwrap();
    resumed.resume(model.params());
    assert_eq!(resumed.sparsity(), pruner.sparsity());
}

#[test]
fn growing_the_mask_after_pruned_weights_moved_keeps_the_count_exact() {
    let pool = Pool::new(&Tracker::new());
    let mut model =
        Model::<f32>::new(&ModelSpec::mlp(20, &[30], 5), &pool, ModelOptions::new(8, 2)).unwrap();
    let schedule = PruneSchedule { start: 0, end: 10, every: 5 };
    let mut pruner = Pruner::new(model.layout(), Sparsity::Global(0.5), schedule).unwrap();
    let total: usize = model.layout().weights().map(|t| t.len()).sum();
    pruner.update(5, model.params_mut());
    let first = pruner.sparsity();
    assert!(first > 0.0 && first < 0.5, "{first}");
    // An optimizer step moves every weight, pruned ones included, before the next update.
    let mut rng = Rng::new(9);
    model.params_mut().iter_mut().for_each(|p| *p += 0.5 * rng.uniform() as f32);
    pruner.update(10, model.params_mut());
    let zeros = model
        .layout()
        .weights()
        .flat_map(|t| t.range())
        .filter(|&i| model.params()[i] == 0.0)
        .count();
    assert_eq!(zeros, total / 2);
    assert_eq!(pruner.sparsity(), 0.5);
}

#[test]
fn per_layer_pruning_prunes_each_layer_to_the_fraction() {
    let pool = Pool::new(&Tracker::new());
    let mut model =
        Model::<f32>::new(&ModelSpec::mlp(20, &[30], 5), &pool, ModelOptions::new(8, 2)).unwrap();
    let mut pruner =
        Pruner::new(model.layout(), Sparsity::PerLayer(0.5), PruneSchedule::one_shot()).unwrap();
    let before = model.params().to_vec();
    assert!(pruner.update(0, model.params_mut()));
    let layout = model.layout().clone();
    for t in layout.weights() {
        let values = &model.params()[t.range()];
        let zeros = values.iter().filter(|v| **v == 0.0).count();
        assert_eq!(zeros, t.len() / 2, "{}", t.name);
        let kept_min =
            values.iter().filter(|v| **v != 0.0).map(|v| v.abs()).fold(f32::MAX, f32::min);
        let pruned_max =
            t.range().filter(|&i| pruner.is_pruned(i)).map(|i| before[i].abs()).fold(0.0, f32::max);
        assert!(pruned_max <= kept_min, "{}: pruned {pruned_max} > kept {kept_min}", t.name);
    }
    assert!(Pruner::new(model.layout(), Sparsity::Global(1.0), PruneSchedule::one_shot()).is_err());
    let backwards = PruneSchedule { start: 10, end: 5, every: 1 };
    assert!(Pruner::new(model.layout(), Sparsity::Global(0.5), backwards).is_err());
}

#[test]
fn checkpoints_round_trip_and_pruned_ones_shrink() {
    let dir = TempDir::new("ckpt");
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::mlp(784, &[512, 256], 10);
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(64, 5)).unwrap();
    let mut opt = Sgd::<f32>::new(
        model.params().len(),
        dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        &pool,
    )
    .unwrap();
    let mut rng = Rng::new(1);
    let x = rng.array::<f32>(64, 784);
    let y = rng.labels(64, 10);
    model.forward_backward(x.view(), Targets::Classes(&y), &StepOptions::default()).unwrap();
    let (p, g) = model.params_and_grads();
    opt.step(p, g, 0.1).unwrap();

    let dense_path = dir.0.join("dense.ckpt");
    let dense_bytes = CheckpointWriter::new(&model)
        .with_optimizer(&opt)
        .with_extra("{\"step\":1}")
        .save(&dense_path)
        .unwrap();
    let mut other = Model::<f32>::new(&spec, &pool, ModelOptions::new(64, 99)).unwrap();
    assert_ne!(other.params(), model.params());
    let mut reader = CheckpointReader::open(&dense_path).unwrap();
    reader.restore_params(&mut other).unwrap();
    assert_eq!(other.params(), model.params());
    assert_eq!(reader.header().extra(), "{\"step\":1}");
    let mut opt2 = Sgd::<f32>::new(
        model.params().len(),
        dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        &pool,
    )
    .unwrap();
    reader.restore_optimizer(&mut opt2, 0..model.params().len()).unwrap();
    assert_eq!(opt2.state(), opt.state());

    let mut pruner =
        Pruner::new(model.layout(), Sparsity::Global(0.8), PruneSchedule::one_shot()).unwrap();
    pruner.update(0, model.params_mut());
    let pruned_path = dir.0.join("pruned.ckpt");
    let dense_params_only =
        CheckpointWriter::new(&other).save(&dir.0.join("dense-params.ckpt")).unwrap();
    let pruned_bytes = CheckpointWriter::new(&model).save(&pruned_path).unwrap();
    let ratio = pruned_bytes as f64 / dense_params_only as f64;
    println!(
        "dense {dense_params_only} B, pruned at 80% {pruned_bytes} B: {ratio:.3}x (with optimizer state: {dense_bytes} B)"
    );
    assert!(ratio <= 0.35, "{ratio}");
    let info = CheckpointHeader::read(&pruned_path).unwrap().info();
    assert_eq!(info.sparse_tensors, 3);
    CheckpointReader::load_into(&pruned_path, &mut other).unwrap();
    assert_eq!(other.params(), model.params());
    assert!(
        std::fs::read_dir(&dir.0).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".tmp"))
    );
}

/// Replicas that each hold a shard of the optimizer (ZeRO) write a shard file each; the
/// checkpoint names them, and a run resumed on another number of replicas takes any range.
#[test]
fn optimizer_shards_are_read_back_on_any_number_of_replicas() {
    let dir = TempDir::new("ckpt-shards");
    let pool = Pool::new(&Tracker::new());
    let model =
        Model::<f32>::new(&ModelSpec::mlp(8, &[8], 4), &pool, ModelOptions::new(4, 1)).unwrap();
    let len = model.params().len();
    let adam = |n| {
        Adam::<f32>::new(
            n,
            dp_model::AdamConfig {
                betas: (0.9, 0.99),
                eps: 1e-8,
                weight_decay: 0.0,
                decoupled: false,
            },
            &pool,
        )
        .unwrap()
    };
    let mut rng = Rng::new(9);
    let mut whole = adam(len);
    let cuts = [0, 40, 70, len];
    let mut shards: Vec<_> = cuts.windows(2).map(|c| adam(c[1] - c[0])).collect();
    let mut params = model.params().to_vec();
    for _ in 0..3 {
        let grads: Vec<f32> = (0..len).map(|_| rng.uniform() as f32 - 0.5).collect();
        whole.step(&mut params.clone(), &grads, 0.01).unwrap();
        for (shard, c) in shards.iter_mut().zip(cuts.windows(2)) {
            shard.step(&mut params[c[0]..c[1]], &grads[c[0]..c[1]], 0.01).unwrap();
        }
    }
    let mut files = Vec::new();
    for (k, (shard, c)) in shards.iter().zip(cuts.windows(2)).enumerate() {
        let name = format!("optimizer-{k}.ckpt");
        save_optimizer_shard(&dir.0.join(&name), shard, c[0]..c[1], model.params()).unwrap();
        files.push(ShardFile { name, start: c[0], end: c[1] });
    }
    let path = dir.0.join("model.ckpt");
    CheckpointWriter::new(&model)
        .with_optimizer_shards(&shards[0], files.clone())
        .save(&path)
        .unwrap();

    // Two replicas now: their ranges cut across the saved shards.
    for (start, end) in [(0, 50), (50, len), (0, len), (45, 46)] {
        let mut resumed = adam(end - start);
        let mut reader = CheckpointReader::open(&path).unwrap();
        reader.restore_optimizer(&mut resumed, start..end).unwrap();
        let (got, want) = (resumed.state(), whole.state());
        assert_eq!(got.steps, 3);
        for (g, w) in got.buffers.iter().zip(&want.buffers) {
            assert_eq!(*g, &w[start..end], "range {start}..{end}");
        }
    }

    // The wrong optimizer, a shard from another checkpoint, a damaged or a missing shard.
    let mut reader = CheckpointReader::open(&path).unwrap();
    let mut sgd = Sgd::<f32>::new(
        len,
        dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        &pool,
    )
    .unwrap();
    let error = reader.restore_optimizer(&mut sgd, 0..len).unwrap_err();
    assert!(error.to_string().contains("adam") && error.to_string().contains("sgd"), "{error}");
    let shard_path = dir.0.join(&files[1].name);
    let saved = std::fs::read(&shard_path).unwrap();
    save_optimizer_shard(&shard_path, &adam(30), 40..70, model.params()).unwrap();
    let error = reader.restore_optimizer(&mut adam(len), 0..len).unwrap_err();
    assert!(error.to_string().contains("optimizer-1.ckpt"), "{error}");
    // The same kind, range and step count, saved with other parameters: another run's shard.
    let mut other_params = model.params().to_vec();
    other_params[0] += 1.0;
    save_optimizer_shard(&shard_path, &shards[1], 40..70, &other_params).unwrap();
    let error = reader.restore_optimizer(&mut adam(len), 0..len).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("optimizer-1.ckpt") && text.contains("another run"), "{text}");
    let mut damaged = saved.clone();
    let n = damaged.len();
    damaged[n - 9] ^= 0x10;
    std::fs::write(&shard_path, &damaged).unwrap();
    let mut untouched = adam(len);
    let error = reader.restore_optimizer(&mut untouched, 0..len).unwrap_err();
    assert!(matches!(&error, Error::Checkpoint { path, .. } if *path == shard_path), "{error}");
    assert!(
        untouched.state().buffers.iter().all(|b| b.iter().all(|&v| v == 0.0)),
        "a damaged shard changed the optimizer"
    );
    std::fs::remove_file(&shard_path).unwrap();
    let error = reader.restore_optimizer(&mut adam(len), 0..len).unwrap_err();
    assert!(matches!(&error, Error::Io { path, .. } if *path == shard_path), "{error}");

    // SGD with momentum over an empty shard (more replicas than a small model fills) still
    // has its one buffer, so its shard reads back like the others.
    let sgd = |n| {
        Sgd::<f32>::new(
            n,
            dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
            &pool,
        )
        .unwrap()
    };
    let (full, empty) = (sgd(len), sgd(0));
    let names = ["sgd-0.ckpt", "sgd-1.ckpt"];
    save_optimizer_shard(&dir.0.join(names[0]), &full, 0..len, model.params()).unwrap();
    save_optimizer_shard(&dir.0.join(names[1]), &empty, len..len, model.params()).unwrap();
    let sgd_files = vec![
        ShardFile { name: names[0].into(), start: 0, end: len },
        ShardFile { name: names[1].into(), start: len, end: len },
    ];
    CheckpointWriter::new(&model).with_optimizer_shards(&full, sgd_files).save(&path).unwrap();
    let mut reader = CheckpointReader::open(&path).unwrap();
    reader.restore_optimizer(&mut sgd(0), len..len).unwrap();
    reader.restore_optimizer(&mut sgd(len), 0..len).unwrap();

    // Shards that do not cover the model are refused when saving.
    let gap = vec![files[0].clone(), files[2].clone()];
    let error = CheckpointWriter::new(&model).with_optimizer_shards(&shards[0], gap).save(&path);
    assert!(error.unwrap_err().to_string().contains("starting at 40"));
}

#[test]
fn damaged_or_mismatched_checkpoints_are_clear_errors() {
    let dir = TempDir::new("ckpt-bad");
    let pool = Pool::new(&Tracker::new());
    let mut model =
        Model::<f32>::new(&ModelSpec::mlp(8, &[16], 4), &pool, ModelOptions::new(4, 1)).unwrap();
    let path = dir.0.join("model.ckpt");
    CheckpointWriter::new(&model).save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();

    let mut wrong =
        Model::<f32>::new(&ModelSpec::mlp(8, &[17], 4), &pool, ModelOptions::new(4, 1)).unwrap();
    let err = CheckpointReader::load_into(&path, &mut wrong).unwrap_err();
    assert!(matches!(&err, Error::Checkpoint { path: p, .. } if *p == path), "{err}");
    assert!(
        err.to_string().contains("mlp-8-16-4") && err.to_string().contains("mlp-8-17-4"),
        "{err}"
    );
    let mut wide =
        Model::<f64>::new(&ModelSpec::mlp(8, &[16], 4), &pool, ModelOptions::new(4, 1)).unwrap();
    assert!(
        CheckpointReader::load_into(&path, &mut wide).unwrap_err().to_string().contains("bytes")
    );

    let cases: [(&str, Vec<u8>); 5] = [
        ("magic", {
            let mut b = bytes.clone();
            b[0] ^= 1;
            b
        }),
        ("version", {
            let mut b = bytes.clone();
            b[8] = 9;
            b
        }),
        ("flipped", {
            let mut b = bytes.clone();
            let n = b.len();
            b[n / 2] ^= 0x40;
            b
        }),
        ("truncated", bytes[..bytes.len() - 7].to_vec()),
        ("appended", [&bytes[..], b"more"].concat()),
    ];
    for (what, damaged) in cases {
        std::fs::write(&path, &damaged).unwrap();
        let before = model.params().to_vec();
        let err = CheckpointReader::load_into(&path, &mut model).unwrap_err();
        assert!(matches!(&err, Error::Checkpoint { .. }), "{what}: {err}");
        assert_eq!(model.params(), &before[..], "{what}: a failed load changed the model");
    }
    assert!(matches!(CheckpointReader::open(&dir.0.join("missing")), Err(Error::Io { .. })));
}

#[test]
fn int8_weights_are_a_quarter_of_the_bytes_and_keep_the_accuracy() {
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::mlp(64, &[128, 64], 10);
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(512, 1)).unwrap();
    train(&mut model, &pool, 300, |_, _| {});
    let f32_accuracy = accuracy(&mut model);
    let mut quantized = QuantizedModel::quantize(&model, &pool).unwrap();
    let (x, y) = blobs(512, 64, 10, 1.6, 3, 1);
    let int8_accuracy = quantized.evaluate(x.view(), Targets::Classes(&y)).unwrap().accuracy();
    let ratio = quantized.bytes() as f64 / quantized.f32_bytes() as f64;
    println!("accuracy f32 {f32_accuracy:.4} int8 {int8_accuracy:.4}; bytes {ratio:.4}x");
    assert!((f32_accuracy - int8_accuracy).abs() <= 0.01);
    // Scales and biases weigh more in a model this small; the target is for the real ones below.
    assert!(ratio <= 0.28, "{ratio}");

    // The outputs match to the rounding of the weights.
    let reference = model.forward_eval(x.slice(s![..8, ..])).unwrap().to_owned();
    let outputs = quantized.forward(x.slice(s![..8, ..])).unwrap();
    let worst = (&outputs - &reference).iter().fold(0f32, |m, d| m.max(d.abs()));
    let scale = reference.iter().fold(0f32, |m, d| m.max(d.abs()));
    assert!(worst < 0.02 * scale, "worst difference {worst} against outputs up to {scale}");

    for spec in [ModelSpec::mlp(784, &[512, 256], 10), ModelSpec::lenet([1, 28, 28], 10)] {
        let model = Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 1)).unwrap();
        let q = QuantizedModel::quantize(&model, &pool).unwrap();
        let ratio = q.bytes() as f64 / q.f32_bytes() as f64;
        println!("{}: int8 {} B vs f32 {} B = {ratio:.4}x", spec.name, q.bytes(), q.f32_bytes());
        assert!(ratio <= 0.27, "{}: {ratio}", spec.name);
    }
}

#[test]
fn quantized_lenet_runs_the_convolution_path() {
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::lenet([1, 28, 28], 10);
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 3)).unwrap();
    let x = Rng::new(2).array::<f32>(4, 784);
    let reference = model.forward_eval(x.view()).unwrap().to_owned();
    let mut q = QuantizedModel::quantize(&model, &pool).unwrap();
    let out = q.forward(x.view()).unwrap();
    let worst = (&out - &reference).iter().fold(0f32, |m, d| m.max(d.abs()));
    let scale = reference.iter().fold(0f32, |m, d| m.max(d.abs()));
    assert!(worst < 0.03 * scale, "{worst} vs {scale}");
    assert!(q.forward(Rng::new(2).array::<f32>(5, 784).view()).is_err());
}

#[test]
fn the_target_is_reached_at_the_end_step_whatever_the_interval() {
    let pool = Pool::new(&Tracker::new());
    let mut model =
        Model::<f32>::new(&ModelSpec::mlp(20, &[30], 5), &pool, ModelOptions::new(8, 2)).unwrap();
    // An interval longer than the schedule (a short run with the default 50): only steps 0
    // and 20 update the mask, and step 20 is the end.
    let schedule = PruneSchedule { start: 0, end: 20, every: 50 };
    let mut pruner = Pruner::new(model.layout(), Sparsity::Global(0.9), schedule).unwrap();
    let mut sparsities = Vec::new();
    for step in 0..30 {
        pruner.update(step, model.params_mut());
        sparsities.push(pruner.sparsity());
    }
    assert_eq!(sparsities[19], 0.0, "no update between the start and the end");
    let total: usize = model.layout().weights().map(|t| t.len()).sum();
    assert_eq!(pruner.sparsity(), (0.9 * total as f64).round() / total as f64);
    assert_eq!(sparsities[20], sparsities[29], "nothing after the end");
    // An end the interval does not divide is an update too.
    let schedule = PruneSchedule { start: 5, end: 17, every: 5 };
    let mut pruner = Pruner::new(model.layout(), Sparsity::Global(0.5), schedule).unwrap();
    for step in 0..=17 {
        pruner.update(step, model.params_mut());
    }
    assert_eq!(pruner.sparsity(), 0.5);
}
