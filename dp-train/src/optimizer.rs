//! The optimizer a config names, as the model crate builds it: checked when the run is
//! planned, so a setting the optimizer refuses (Nesterov without momentum) is a config error
//! naming it before any replica starts, not a replica's failure.

use dp_mem::Pool;
use dp_model::{Adam, Optimizer, Sgd, StatePrecision};

use crate::config::OptimizerConfig;
use crate::error::{Error, Result};

/// The optimizer of `len` parameters, its state fresh and stored at `precision`.
pub(crate) fn build_optimizer(
    config: &OptimizerConfig,
    len: usize,
    precision: StatePrecision,
    pool: &Pool,
) -> Result<Box<dyn Optimizer<f32>>> {
    Ok(match *config {
        OptimizerConfig::Sgd(sgd) => Box::new(Sgd::with_precision(len, sgd, precision, pool)?),
        OptimizerConfig::Adam(adam) => Box::new(Adam::with_precision(len, adam, precision, pool)?),
    })
}

/// Refuses optimizer settings the optimizer would refuse, when the run is planned (naming
/// the setting as a config names it, `optimizer.nesterov`) instead of in every replica.
pub(crate) fn check_optimizer(config: &OptimizerConfig) -> Result<()> {
    let checked = match config {
        OptimizerConfig::Sgd(sgd) => sgd.check(),
        OptimizerConfig::Adam(adam) => adam.check(),
    };
    checked.map_err(|error| match error {
        dp_model::Error::Optimizer { field, what } => {
            Error::config(format!("optimizer.{field}"), what)
        }
        other => other.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_the_optimizer_refuses_are_config_errors_naming_them() {
        let nesterov = OptimizerConfig::Sgd(dp_model::SgdConfig {
            momentum: 0.0,
            nesterov: true,
            weight_decay: 0.0,
        });
        let error = check_optimizer(&nesterov).unwrap_err().to_string();
        assert!(error.contains("`optimizer.nesterov`: needs momentum > 0"), "{error}");
        let plain = OptimizerConfig::Sgd(dp_model::SgdConfig {
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        });
        check_optimizer(&plain).unwrap();
        let adam = OptimizerConfig::Adam(dp_model::AdamConfig {
            betas: (1.5, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
        });
        let error = check_optimizer(&adam).unwrap_err().to_string();
        assert!(error.contains("`optimizer.beta1`"), "{error}");
    }
}
