//! The settings that pick one of a few ways: where replicas compute, how inputs are scaled,
//! how gradients are compressed.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where replicas compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// Threads on the CPU's cores.
    #[default]
    Cpu,
    /// One GPU per process (needs the `cuda` feature), for models of linear layers,
    /// activations and dropout.
    Cuda,
}

/// How a run scales its inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Normalization {
    /// `u8` inputs (pixels) divided by 255; any other input standardized per feature.
    #[default]
    Auto,
    /// Each input element to zero mean and unit variance, with statistics adapted from the
    /// training data (scikit-learn's `StandardScaler`, Keras' `Normalization.adapt`) unless
    /// `normalize_mean` and `normalize_std` give them.
    Standard,
    /// Each input element to `[0, 1]` over the range the training data spans.
    Minmax,
    /// Inputs as stored.
    None,
}

impl Normalization {
    /// The name a config file and the command line use.
    pub fn name(self) -> &'static str {
        match self {
            Normalization::Auto => "auto",
            Normalization::Standard => "standard",
            Normalization::Minmax => "minmax",
            Normalization::None => "none",
        }
    }
}

impl std::str::FromStr for Device {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            other => Err(Error::config("device", format!("`{other}` is not cpu or cuda"))),
        }
    }
}

impl std::str::FromStr for Normalization {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "auto" => Ok(Normalization::Auto),
            "standard" => Ok(Normalization::Standard),
            "minmax" => Ok(Normalization::Minmax),
            "none" => Ok(Normalization::None),
            other => Err(Error::config(
                "normalize",
                format!("`{other}` is not auto, standard, minmax or none"),
            )),
        }
    }
}

/// How gradients travel between replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GradCompression {
    /// As computed.
    #[default]
    None,
    /// Rounded to bf16, the rounding error carried into the next step's gradients.
    Bf16,
    /// Quantized to int8 with a scale per chunk, the error carried over likewise.
    Int8,
}

impl GradCompression {
    /// The name a config file and the command line use.
    pub fn name(self) -> &'static str {
        match self {
            GradCompression::None => "none",
            GradCompression::Bf16 => "bf16",
            GradCompression::Int8 => "int8",
        }
    }

    /// The collectives' setting for it (with error feedback).
    pub(crate) fn comm(self) -> dp_comm::Compression {
        match self {
            GradCompression::None => dp_comm::Compression::None,
            GradCompression::Bf16 => dp_comm::Compression::Bf16 { error_feedback: true },
            GradCompression::Int8 => dp_comm::Compression::Int8 { error_feedback: true },
        }
    }
}

impl std::str::FromStr for GradCompression {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "none" => Ok(GradCompression::None),
            "bf16" => Ok(GradCompression::Bf16),
            "int8" => Ok(GradCompression::Int8),
            other => {
                Err(Error::config("compression", format!("`{other}` is not none, bf16 or int8")))
            }
        }
    }
}

/// Which activations backward computes again instead of keeping them from forward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecomputePolicy {
    /// Keep every activation backward reads.
    #[default]
    Off,
    /// Keep the products' outputs (linear layers, convolutions, attention) and recompute
    /// the norms, activations and dropout between them: a few percent more time for what
    /// those ops kept (a third of a GPT block's activations, none of LeNet's).
    Selective,
    /// One segment per parameterized layer (per residual block in a ResNet and a GPT), of
    /// which only the output is kept: the most memory saved, for the block's products
    /// computed twice (1.17x gpt-mini's step measured, 1.23x ResNet-20's).
    Full,
}

impl RecomputePolicy {
    /// The name a config file and the command line use.
    pub fn name(self) -> &'static str {
        match self {
            RecomputePolicy::Off => "off",
            RecomputePolicy::Selective => "selective",
            RecomputePolicy::Full => "full",
        }
    }

    /// The model's recomputation for it.
    pub fn model(self) -> dp_model::Recompute {
        match self {
            RecomputePolicy::Off => dp_model::Recompute::Off,
            RecomputePolicy::Selective => dp_model::Recompute::Selective,
            RecomputePolicy::Full => dp_model::Recompute::Auto,
        }
    }
}

impl std::str::FromStr for RecomputePolicy {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "off" | "false" => Ok(RecomputePolicy::Off),
            "selective" => Ok(RecomputePolicy::Selective),
            "full" | "true" => Ok(RecomputePolicy::Full),
            other => {
                Err(Error::config("recompute", format!("`{other}` is not off, selective or full")))
            }
        }
    }
}

/// A config says `recompute = true` (full) or `false` as well as a policy's name.
impl<'de> Deserialize<'de> for RecomputePolicy {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Flag(bool),
            Name(String),
        }
        match Given::deserialize(deserializer)? {
            Given::Flag(true) => Ok(RecomputePolicy::Full),
            Given::Flag(false) => Ok(RecomputePolicy::Off),
            Given::Name(name) => name.parse().map_err(|e: Error| serde::de::Error::custom(e)),
        }
    }
}
