//! Models that share one parameter buffer (the replicas of one process) read the same values
//! as a model with its own, see each other's shard updates, and refuse what does not fit.

mod support;

use dp_mem::{Pool, Tracker};
use dp_model::{
    CheckpointReader, CheckpointWriter, Error, Model, ModelOptions, ModelSpec, SharedParams,
};
use support::Rng;

#[test]
fn models_sharing_parameters_compute_as_one_with_its_own_and_see_each_others_updates() {
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::mlp(6, &[5], 3);
    let options = || ModelOptions::new(4, 7);
    let mut own = Model::<f32>::new(&spec, &pool, options()).unwrap();
    let shared = SharedParams::<f32>::new(&spec, 7, &pool).unwrap();
    // SAFETY: one thread; the models' accesses never overlap in time.
    let (mut a, mut b) = unsafe {
        (
            Model::with_shared_params(&spec, &pool, options(), shared.clone()).unwrap(),
            Model::with_shared_params(&spec, &pool, options(), shared.clone()).unwrap(),
        )
    };
    assert_eq!(a.params(), own.params(), "initialized from the seed as Model::new does");
    assert_eq!(a.memory().params, 0, "the shared buffer is not the model's to count");
    let x = Rng::new(1).array::<f32>(4, 6);
    let expected = own.forward_eval(x.view()).unwrap().to_owned();
    assert_eq!(a.forward_eval(x.view()).unwrap(), expected);

    // Each writes its half; both see the whole.
    let len = a.params().len();
    a.params_range_mut(0..len / 2).fill(0.5);
    b.params_range_mut(len / 2..len).fill(-0.5);
    let both: Vec<f32> = (0..len).map(|i| if i < len / 2 { 0.5 } else { -0.5 }).collect();
    assert_eq!(a.params(), &both[..]);
    assert_eq!(b.params(), &both[..]);
    own.params_mut().copy_from_slice(&both);
    let expected = own.forward_eval(x.view()).unwrap().to_owned();
    assert_eq!(b.forward_eval(x.view()).unwrap(), expected);

    // Another spec's parameters are refused.
    let other = ModelSpec::mlp(6, &[4], 3);
    // SAFETY: refused before any access.
    let refused = unsafe { Model::with_shared_params(&other, &pool, options(), shared.clone()) };
    assert!(matches!(refused, Err(Error::Spec { .. })));

    // A checkpoint restores into shared parameters only while no model holds them.
    let dir = std::env::temp_dir().join(format!("dp-model-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.ckpt");
    own.params_mut().fill(0.25);
    CheckpointWriter::new(&own).save(&path).unwrap();
    let mut fresh = SharedParams::<f32>::new(&spec, 8, &pool).unwrap();
    let held = fresh.clone();
    let error = CheckpointReader::open(&path).unwrap().restore_shared(&spec, &mut fresh);
    assert!(error.unwrap_err().to_string().contains("in use"));
    drop(held);
    CheckpointReader::open(&path).unwrap().restore_shared(&spec, &mut fresh).unwrap();
    assert!(fresh.get_mut().unwrap().iter().all(|&p| p == 0.25));
    std::fs::remove_dir_all(&dir).unwrap();
}
