//! Loading the CUDA libraries once, before any real model exists.

use dp_mem::{Pool, Tracker};

use super::CudaModel;
use crate::error::Result;
use crate::model::{Model, StepOptions};
use crate::ops::loss::Targets;

/// The CUDA libraries a GPU step uses, loaded and initialised on one device: the driver's
/// context, cuBLAS, the compiled kernels and whatever they set up on first use, through one
/// step of a small model. What they take from host memory (hundreds of MiB of driver state and
/// library code) is the process's before any real model exists; a run that holds this from
/// before it measures the process's starting memory counts it there.
#[derive(Debug)]
pub struct CudaRuntime {
    _warm: CudaModel,
}

impl CudaRuntime {
    /// Loads the libraries on GPU `device` and takes one step with them.
    pub fn load(device: usize) -> Result<Self> {
        let (tracker, pool) = (Tracker::new(), Pool::new(&Tracker::new()));
        let spec = crate::ModelSpec::mlp(64, &[64], 10);
        let cpu = Model::<f32>::new(&spec, &pool, crate::ModelOptions::new(8, 1))?;
        let mut warm = CudaModel::from_model(&cpu, device, &tracker, pool.tracker())?;
        let x = ndarray::Array2::<f32>::zeros((8, 64));
        warm.forward_backward(x.view(), Targets::Classes(&[0; 8]), &StepOptions::default())?;
        warm.sgd_step(None, 0.0, &crate::SgdConfig::default())?;
        warm.wait()?;
        Ok(Self { _warm: warm })
    }
}
