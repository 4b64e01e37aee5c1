//! The optimizer a run updates with, and the pruning it applies.

use dp_model::{AdamConfig, SgdConfig};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The optimizer and its settings: dp-model's own settings of the optimizer it builds (and
/// the GPU path runs), written in a config as `[optimizer]` with a `type` and the settings by
/// name (`beta1`, `beta2`); a setting left out is the preset's (`sgd`: momentum 0.9,
/// Nesterov; `adam`: 0.9, 0.999, 1e-8), not PyTorch's constructor defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "Written", into = "Written")]
pub enum OptimizerConfig {
    /// SGD with momentum.
    Sgd(SgdConfig),
    /// Adam, or AdamW with `decoupled`.
    Adam(AdamConfig),
}

impl OptimizerConfig {
    /// The presets the command line names: `sgd` (momentum 0.9, Nesterov), `adam` (0.9,
    /// 0.999, 1e-8) and `adamw` (Adam with decoupled weight decay 0.01). A config file's
    /// `type = "sgd"` or `type = "adam"` with no other field is the same optimizer.
    pub fn preset(name: &str) -> Result<Self> {
        let adam = |weight_decay, decoupled| {
            OptimizerConfig::Adam(AdamConfig {
                betas: (default_beta1(), default_beta2()),
                eps: default_eps(),
                weight_decay,
                decoupled,
            })
        };
        match name {
            "sgd" => Ok(OptimizerConfig::Sgd(SgdConfig {
                momentum: default_momentum(),
                nesterov: true,
                weight_decay: 0.0,
            })),
            "adam" => Ok(adam(0.0, false)),
            "adamw" => Ok(adam(0.01, true)),
            other => Err(Error::config(
                "optimizer",
                format!("`{other}` is not a preset (sgd, adam or adamw)"),
            )),
        }
    }
}

/// An optimizer as a config writes it.
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Written {
    Sgd {
        /// Momentum (0 for none).
        #[serde(default = "default_momentum")]
        momentum: f64,
        /// Nesterov momentum (on by default, as in the `sgd` preset).
        #[serde(default = "yes")]
        nesterov: bool,
        /// L2 weight decay.
        #[serde(default)]
        weight_decay: f64,
    },
    Adam {
        /// First-moment decay.
        #[serde(default = "default_beta1")]
        beta1: f64,
        /// Second-moment decay.
        #[serde(default = "default_beta2")]
        beta2: f64,
        /// Denominator term.
        #[serde(default = "default_eps")]
        eps: f64,
        /// Weight decay.
        #[serde(default)]
        weight_decay: f64,
        /// AdamW's decoupled weight decay.
        #[serde(default)]
        decoupled: bool,
    },
}

impl From<Written> for OptimizerConfig {
    fn from(written: Written) -> Self {
        match written {
            Written::Sgd { momentum, nesterov, weight_decay } => {
                OptimizerConfig::Sgd(SgdConfig { momentum, nesterov, weight_decay })
            }
            Written::Adam { beta1, beta2, eps, weight_decay, decoupled } => {
                OptimizerConfig::Adam(AdamConfig {
                    betas: (beta1, beta2),
                    eps,
                    weight_decay,
                    decoupled,
                })
            }
        }
    }
}

impl From<OptimizerConfig> for Written {
    fn from(config: OptimizerConfig) -> Self {
        match config {
            OptimizerConfig::Sgd(SgdConfig { momentum, nesterov, weight_decay }) => {
                Written::Sgd { momentum, nesterov, weight_decay }
            }
            OptimizerConfig::Adam(AdamConfig {
                betas: (beta1, beta2),
                eps,
                weight_decay,
                decoupled,
            }) => Written::Adam { beta1, beta2, eps, weight_decay, decoupled },
        }
    }
}

fn default_momentum() -> f64 {
    0.9
}
fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_eps() -> f64 {
    1e-8
}

/// Magnitude pruning settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneConfig {
    /// Final fraction of weights pruned.
    pub sparsity: f64,
    /// Rank weights over the whole model (`true`) or per layer.
    #[serde(default = "yes")]
    pub global: bool,
    /// Step at which pruning starts.
    #[serde(default)]
    pub start: u64,
    /// Step at which the target is reached (default: two thirds of the run).
    pub end: Option<u64>,
    /// Steps between mask updates.
    #[serde(default = "default_prune_every")]
    pub every: u64,
}

fn yes() -> bool {
    true
}
fn default_prune_every() -> u64 {
    50
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TrainConfig;

    #[test]
    fn a_config_files_optimizer_type_is_the_preset_of_that_name() {
        for name in ["sgd", "adam"] {
            let file: TrainConfig =
                toml::from_str(&format!("[optimizer]\ntype = \"{name}\"\n")).unwrap();
            assert_eq!(file.optimizer, Some(OptimizerConfig::preset(name).unwrap()), "{name}");
        }
        let adamw = OptimizerConfig::preset("adamw").unwrap();
        let file: TrainConfig =
            toml::from_str("[optimizer]\ntype = \"adam\"\ndecoupled = true\nweight_decay = 0.01\n")
                .unwrap();
        assert_eq!(file.optimizer, Some(adamw));
        // No `[optimizer]` is none given (the run chooses), and stays so through the TOML.
        let file: TrainConfig = toml::from_str("seed = 3\n").unwrap();
        assert_eq!((file.optimizer, TrainConfig::default().optimizer), (None, None));
        let text = TrainConfig::default().to_toml();
        assert!(!text.contains("[optimizer"), "{text}");
        assert_eq!(toml::from_str::<TrainConfig>(&text).unwrap(), TrainConfig::default());
        let chosen = TrainConfig {
            optimizer: Some(OptimizerConfig::preset("sgd").unwrap()),
            ..TrainConfig::default()
        };
        assert_eq!(toml::from_str::<TrainConfig>(&chosen.to_toml()).unwrap(), chosen);
        // Written as configs have always written it (dp-model's `betas` as beta1 and beta2),
        // so saved runs and config files read the same.
        let adamw = TrainConfig {
            optimizer: OptimizerConfig::preset("adamw").ok(),
            ..TrainConfig::default()
        };
        let text = adamw.to_toml();
        for line in ["type = \"adam\"", "beta1 = 0.9", "beta2 = 0.999", "decoupled = true"] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert_eq!(toml::from_str::<TrainConfig>(&text).unwrap(), adamw);
        let error = OptimizerConfig::preset("lbfgs").unwrap_err().to_string();
        assert!(error.contains("`lbfgs` is not a preset"), "{error}");
    }
}
