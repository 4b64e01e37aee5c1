//! A language model's run: a token dataset's vocabulary as the classes, windows of
//! `context` tokens as the samples, and the recipe GPTs train with when the config leaves it
//! to the run.

use std::path::Path;

use dp_data::{DType, Dataset, TokenDataset, TokenInfo};
use dp_model::ModelSpec;

use super::input::Input;
use crate::config::{OptimizerConfig, TrainConfig};
use crate::error::{Error, Result};

/// The model a token dataset trains when the config names none.
const DEFAULT_MODEL: &str = "gpt-mini";

/// The token data of a run.
#[derive(Clone, Debug)]
pub(crate) struct Text {
    pub(crate) context: usize,
    pub(crate) info: TokenInfo,
    /// Training windows per epoch: what an epoch's steps are counted from.
    pub(crate) windows: u64,
}

impl Text {
    /// The token data of `config`'s training data `train` (`None`: it holds records), with
    /// the context the config or its model sets.
    pub(crate) fn resolve(train: &Dataset, config: &TrainConfig) -> Result<Option<Self>> {
        if !TokenDataset::holds_tokens(train) {
            return Ok(None);
        }
        let info = TokenDataset::open(&config.train_data)?.info().clone();
        let model = model_of(config);
        let from_file = Path::new(model).extension().is_some_and(|e| e == "toml" || e == "json");
        let context = match (config.context, from_file) {
            (Some(context), _) => context,
            (None, true) => match ModelSpec::from_file(Path::new(model))?.input[..] {
                [context] => context,
                ref other => {
                    return Err(Error::config(
                        "model",
                        format!("`{model}` takes inputs {other:?}, a language model [context]"),
                    ));
                }
            },
            (None, false) if model == "gpt2-small" => 1024,
            (None, false) => 256,
        };
        // The fewest windows an epoch has, at its largest shift (see `SequenceSampler`).
        let windows = info.tokens.saturating_sub(context as u64) / context as u64;
        Ok(Some(Text { context, info, windows }))
    }

    /// The input the model reads: `context` token ids.
    pub(crate) fn input(&self) -> Input {
        Input {
            feature: "tokens".into(),
            shape: vec![self.context],
            dtype: DType::I64,
            sparse: false,
            image: false,
        }
    }

    /// Refuses evaluation data that is not tokens of the same vocabulary; returns its bytes
    /// of text per token, what its losses per token are divided by to give them per byte
    /// (`None` when its import measured none: no tokens).
    pub(crate) fn check_eval(&self, eval: &Dataset, path: &Path) -> Result<Option<f64>> {
        let info = check_tokens(&self.info, eval, path, "eval_data", "the training data")?;
        Ok(Some(info.bytes_per_token).filter(|b| b.is_finite() && *b > 0.0))
    }

    /// Fills in what `config` leaves to a language model's run: `gpt-mini`, and nanoGPT's
    /// recipe for it (AdamW with betas 0.9 and 0.99, at 1e-3 by the default schedule, and weight decay 0.1 on matrices
    /// and the token embedding only, gradients clipped to norm 1).
    pub(crate) fn defaults(&self, mut config: TrainConfig) -> Result<TrainConfig> {
        if config.model == TrainConfig::default().model {
            config.model = DEFAULT_MODEL.into();
        }
        if config.normalize != TrainConfig::default().normalize
            || config.normalize_mean.is_some()
            || config.normalize_std.is_some()
        {
            return Err(Error::config("normalize", "token ids are not scaled"));
        }
        config.decay_bias_and_norm.get_or_insert(false);
        if config.optimizer.is_none() && config.lr.is_none() && config.schedule.is_none() {
            config.optimizer = Some(OptimizerConfig::Adam(dp_model::AdamConfig {
                betas: (0.9, 0.99),
                eps: 1e-8,
                weight_decay: 0.1,
                decoupled: true,
            }));
            config.clip_grad_norm.get_or_insert(1.0);
        }
        Ok(config)
    }
}

/// The model `config` names, or the default one.
fn model_of(config: &TrainConfig) -> &str {
    if config.model == TrainConfig::default().model { DEFAULT_MODEL } else { &config.model }
}

/// Refuses `data` (at `path`, given as `field`) unless it holds tokens of the tokenizer
/// `info` describes, that of `trained` (naming what it was trained on); returns the data's
/// token info.
pub(crate) fn check_tokens(
    info: &TokenInfo,
    data: &Dataset,
    path: &Path,
    field: &str,
    trained: &str,
) -> Result<TokenInfo> {
    if !TokenDataset::holds_tokens(data) {
        return Err(Error::config(
            field,
            format!("{} holds records; {trained} is tokens", path.display()),
        ));
    }
    let given = TokenDataset::open(path)?.info().clone();
    let same = (given.tokenizer, given.vocab_size, &given.tokenizer_json)
        == (info.tokenizer, info.vocab_size, &info.tokenizer_json);
    if !same {
        return Err(Error::config(
            field,
            format!(
                "{} is tokenized by a {} tokenizer of {} tokens, {trained} by a {} of {}: the same id would be another token",
                path.display(),
                given.tokenizer,
                given.vocab_size,
                info.tokenizer,
                info.vocab_size
            ),
        ));
    }
    Ok(given)
}
