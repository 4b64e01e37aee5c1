//! The device memory prediction against the device: models built on the emulated device,
//! with their optimizer state taken as dp-train takes it, hold to the byte what
//! [`GpuMemory::predict`](crate::GpuMemory::predict) says, by tag, in total, and in blocks.

use dp_mem::{Pool, SystemBackend, Tag, Tracker};

use super::emulator::Emulator;
use super::{Device, GpuModel, Parts};
use crate::cuda::device_memory::{GpuState, predict_spec};
use crate::model::{Model, ModelOptions, Recompute, SavedPrecision};
use crate::ops::gemm::Precision;
use crate::optim::{StateCodebook, StatePrecision};
use crate::spec::{LayerSpec, ModelSpec};

/// An MLP, a ResNet-8 and a small GPT, each with its batch and the state its optimizer
/// keeps: SGD's momentum; Adam's moments for a ZeRO-1 shard of half the parameters; Adam's
/// moments in 8 bits.
fn models() -> Vec<(ModelSpec, usize, GpuState)> {
    let mlp = ModelSpec {
        name: "mlp".into(),
        input: vec![20],
        layers: vec![
            LayerSpec::Linear { out: 16 },
            LayerSpec::Gelu,
            LayerSpec::Dropout { p: 0.25 },
            LayerSpec::Linear { out: 10 },
        ],
    };
    let resnet = ModelSpec::resnet_cifar(8, [3, 8, 8], 10).expect("a ResNet depth");
    let shape = crate::zoo::GptShape { layers: 2, heads: 2, dim: 16, dropout: 0.1 };
    let gpt = ModelSpec::gpt("gpt", 23, 9, shape);
    let adam = GpuState { buffers: 2, ..GpuState::default() };
    let half = Some(resnet.layout().expect("a layout").len() / 2);
    vec![
        (mlp, 9, GpuState { buffers: 1, ..adam }),
        (resnet, 6, GpuState { shard: half, ..adam }),
        (gpt, 3, GpuState { precision: StatePrecision::Int8, ..adam }),
    ]
}

#[test]
fn the_device_holds_what_the_prediction_says() {
    type Variant = (Precision, fn(ModelOptions) -> ModelOptions);
    let variants: [Variant; 5] = [
        (Precision::F32, |o| o),
        (Precision::Bf16, |o| o),
        (Precision::F32, |o| o.recompute(Recompute::Auto)),
        (Precision::F32, |o| o.recompute(Recompute::Selective)),
        (Precision::F32, |o| o.saved(SavedPrecision::Bf16)),
    ];
    for (spec, rows, state) in models() {
        for (variant, (precision, saver)) in variants.iter().enumerate() {
            let Some(device) = super::emulator::tests::emulator() else { return };
            let options = saver(ModelOptions::new(rows, 3));
            let cpu = Model::<f32>::new(&spec, &Pool::new(&Tracker::new()), options.clone())
                .expect("a CPU model");
            let (tracker, host) = (Tracker::new(), Tracker::new());
            let parts = Parts {
                device,
                memory: SystemBackend,
                free: u64::MAX,
                staging: SystemBackend,
                trackers: (&tracker, &host),
                precision: *precision,
            };
            let mut gpu = GpuModel::build(&cpu, parts).expect("the model on the emulated device");
            // The state as dp-train's GPU step takes it, and on the MLP, decay on some
            // parameters only and a pruning mask.
            if let Some(len) = state.shard {
                gpu.set_update_range(0..len).unwrap();
            }
            let f32s: Vec<_> = match state.precision {
                StatePrecision::F32 => {
                    (0..state.buffers).map(|_| gpu.state_buffer().unwrap()).collect()
                }
                StatePrecision::Int8 => Vec::new(),
            };
            let int8s: Vec<_> = match state.precision {
                StatePrecision::F32 => Vec::new(),
                StatePrecision::Int8 => [StateCodebook::Signed, StateCodebook::Unsigned]
                    .map(|book| gpu.quantized_state(book).unwrap())
                    .into(),
            };
            let pruned = spec.name == "mlp";
            let decayed = pruned.then(|| cpu.layout().decayed_ranges());
            if let Some(ranges) = &decayed {
                gpu.decay_only(ranges).unwrap();
                gpu.set_prune_mask(&vec![u64::MAX; cpu.params().len().div_ceil(64)]).unwrap();
            }
            let state = GpuState { decayed_ranges: decayed.map(|r| r.len()), pruned, ..state };
            let want = predict_spec(&spec, &options, *precision, state, Emulator::CHUNK_VALUES)
                .expect("a prediction");
            let held = tracker.snapshot();
            let case = format!("{} variant {variant}", spec.name);
            for (tag, bytes) in want.by_tag().iter() {
                assert_eq!(held.tag(tag).current, *bytes, "{case}: {tag:?}");
            }
            assert_eq!(held.total.current, want.total(), "{case}");
            assert_eq!((held.total.reserved, held.held), (want.blocks, want.blocks), "{case}");
            assert_eq!(
                held.tag(Tag::Activation).current,
                want.saved_activations + want.activation_grads
            );
            drop((f32s, int8s));
        }
    }
}
