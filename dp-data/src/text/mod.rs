//! Text as token streams: a token dataset's layout and metadata ([`TokenInfo`]), its reader
//! ([`TokenDataset`]), the [`Tokenizer`] that made it, the tokens held in memory ([`Tokens`])
//! and the windows a language model trains on ([`SequenceSampler`]). The importer is
//! [`import_text`](crate::import_text).
//!
//! The layout is described on [`TokenInfo`].

mod dataset;
mod pipeline;
mod sampler;
mod tokenizer;
mod tokens;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::schema::{Feature, Schema};

pub use dataset::TokenDataset;
pub use pipeline::TokenPipeline;
pub use sampler::{SequenceBatch, SequenceConfig, SequenceSampler, SequenceState};
pub use tokenizer::{Tokenizer, TokenizerKind};
pub use tokens::{TokenWidth, Tokens};

/// The feature holding the token stream.
pub(crate) const TOKENS_FEATURE: &str = "tokens";

/// The feature whose record-0 value holds the [`TokenInfo`].
pub(crate) const INFO_FEATURE: &str = "tokenizer";

/// Tokens per record: 8 KiB of `u16` tokens, 32 records to a default 256 KiB block.
pub(crate) const RECORD_TOKENS: usize = 4096;

/// The value of [`TokenInfo::format`].
pub(crate) const INFO_FORMAT: &str = "dp-tokens";

/// The version of [`TokenInfo`] this crate writes and reads.
pub(crate) const INFO_VERSION: u32 = 1;

/// The schema of every token dataset: `tokens: bytes, tokenizer: bytes`.
pub(crate) fn token_schema() -> Schema {
    Schema::new(vec![Feature::bytes(TOKENS_FEATURE), Feature::bytes(INFO_FEATURE)])
        .unwrap_or_else(|_| unreachable!("a fixed, valid schema"))
}

/// What a token dataset says about itself, and where it says it.
///
/// A token dataset is an ordinary dataset (same shards, blocks, CRC32C and manifest) with the
/// schema `tokens: bytes, tokenizer: bytes`:
///
/// * `tokens`: the stream cut into records of [`TokenInfo::record_tokens`] tokens (4096), each
///   stored as little-endian `u16` when the vocabulary has at most 65,536 entries and `u32`
///   otherwise ([`TokenWidth`]); every record is full but the last, which holds exactly what
///   is left (never padding), so the dataset holds the stream's exact token count.
/// * `tokenizer`: empty in every record but record 0, whose value is this info as JSON: the
///   tokenizer (`bytes`, or `bpe` with its whole `tokenizer.json`), the vocabulary size, the
///   token width, the counts and the bytes per token of the import.
///
/// Keeping the vocabulary inside the records (rather than in a file beside the shards) makes
/// it part of what the manifest binds and the CRC32C checks, lands it with the dataset
/// atomically, and keeps [`Dataset::verify`](crate::Dataset::verify) free of files the
/// manifest does not list. [`import_text`](crate::import_text) also writes a copy of a BPE's
/// `tokenizer.json` next to the splits, for other tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TokenInfo {
    /// Always `"dp-tokens"`.
    pub format: String,
    /// The version of this record, 1.
    pub version: u32,
    /// The split: `train` or `eval`.
    pub split: String,
    /// How text became tokens.
    pub tokenizer: TokenizerKind,
    /// Token ids are below this (with added tokens).
    pub vocab_size: usize,
    /// How each token is stored.
    pub width: TokenWidth,
    /// Tokens per record (all records are full but the last).
    pub record_tokens: usize,
    /// Tokens in this dataset.
    pub tokens: u64,
    /// Input files of the import.
    pub files: u64,
    /// Bytes of text the import read (both splits).
    pub text_bytes: u64,
    /// Tokens the import made (both splits).
    pub import_tokens: u64,
    /// `text_bytes / import_tokens`: what a loss per token is divided by to give one per byte
    /// (bits per byte = nats per token / ln 2 / bytes per token). 1 for `bytes`.
    pub bytes_per_token: f64,
    /// The share of the import's tokens held out as the `eval` split (its tail).
    pub eval_fraction: f64,
    /// The tokenizer's `tokenizer.json` (BPE only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_json: Option<String>,
}

impl TokenInfo {
    /// Records a dataset of `tokens` tokens has: one per started [`RECORD_TOKENS`], and one
    /// (holding only the info) when there are none.
    pub(crate) fn records(&self) -> u64 {
        self.tokens.div_ceil(self.record_tokens as u64).max(1)
    }

    /// The info saved as `json` (by a dataset, or beside a run's model), checked; `origin`
    /// names where it came from in errors.
    pub fn from_json(json: &[u8], origin: &Path) -> Result<Self> {
        Self::parse(json, &|what| Error::corrupt(origin, 0, format!("token info: {what}")))
    }

    /// The info in `json`, its fields checked against each other; `bad` makes the error.
    pub(crate) fn parse(json: &[u8], bad: &dyn Fn(String) -> Error) -> Result<Self> {
        let info: TokenInfo =
            serde_json::from_slice(json).map_err(|e| bad(format!("not a token info: {e}")))?;
        info.check(bad)?;
        Ok(info)
    }

    /// The tokenizer the info describes (its `tokenizer.json` for a BPE), with its bytes per
    /// token; `origin` names where the info came from in errors.
    pub fn tokenizer(&self, origin: &Path) -> Result<Tokenizer> {
        let tokenizer = match (&self.tokenizer, &self.tokenizer_json) {
            (TokenizerKind::Bpe, Some(json)) => {
                let tokenizer = Tokenizer::from_json(json, origin)?;
                if tokenizer.vocab_size() != self.vocab_size {
                    return Err(Error::corrupt(
                        origin,
                        0,
                        format!(
                            "token info: the tokenizer.json has {} tokens, the info says {}",
                            tokenizer.vocab_size(),
                            self.vocab_size
                        ),
                    ));
                }
                tokenizer
            }
            _ => Tokenizer::bytes(),
        };
        Ok(tokenizer.with_bytes_per_token(self.bytes_per_token))
    }

    /// Checks the fields against each other; `bad` makes the error (it names the file).
    fn check(&self, bad: &dyn Fn(String) -> Error) -> Result<()> {
        if self.format != INFO_FORMAT || self.version != INFO_VERSION {
            return Err(bad(format!(
                "token info of format `{}` version {}, expected `{INFO_FORMAT}` version \
                 {INFO_VERSION}",
                self.format, self.version
            )));
        }
        if !(1..=1 << 20).contains(&self.record_tokens) {
            return Err(bad(format!(
                "{} tokens per record is outside 1..=1048576",
                self.record_tokens
            )));
        }
        if self.vocab_size == 0 || self.width != TokenWidth::for_vocab(self.vocab_size) {
            return Err(bad(format!(
                "a vocabulary of {} stored as {} (expected {})",
                self.vocab_size,
                self.width,
                TokenWidth::for_vocab(self.vocab_size.max(1))
            )));
        }
        let bpe = self.tokenizer == TokenizerKind::Bpe;
        if bpe != self.tokenizer_json.is_some() || (!bpe && self.vocab_size != 256) {
            return Err(bad(format!(
                "a `{}` tokenizer with a vocabulary of {}, {} a tokenizer.json",
                self.tokenizer,
                self.vocab_size,
                if self.tokenizer_json.is_some() { "with" } else { "without" }
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_info_round_trips_and_inconsistent_info_is_refused() {
        let info = TokenInfo {
            format: INFO_FORMAT.into(),
            version: INFO_VERSION,
            split: "train".into(),
            tokenizer: TokenizerKind::Bytes,
            vocab_size: 256,
            width: TokenWidth::U16,
            record_tokens: RECORD_TOKENS,
            tokens: 10_000,
            files: 2,
            text_bytes: 11_000,
            import_tokens: 11_000,
            bytes_per_token: 1.0,
            eval_fraction: 0.1,
            tokenizer_json: None,
        };
        let json = serde_json::to_string(&info).unwrap();
        assert!(json.contains(r#""tokenizer":"bytes""#) && json.contains(r#""width":"u16""#));
        assert_eq!(serde_json::from_str::<TokenInfo>(&json).unwrap(), info);
        assert_eq!(info.records(), 3);
        let bad = |what: String| Error::Schema(what);
        info.check(&bad).unwrap();
        let mut wide = info.clone();
        wide.width = TokenWidth::U32;
        assert!(wide.check(&bad).unwrap_err().to_string().contains("stored as u32"));
        let mut bpe = info.clone();
        bpe.tokenizer = TokenizerKind::Bpe;
        assert!(bpe.check(&bad).unwrap_err().to_string().contains("without a tokenizer.json"));
        let empty = TokenInfo { tokens: 0, ..info };
        assert_eq!(empty.records(), 1);
    }
}
