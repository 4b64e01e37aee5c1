//! The tokenizer of a token dataset: bytes as they are, or a byte-level BPE from the Hugging
//! Face `tokenizers` crate (loaded from a `tokenizer.json`, or trained on the input).

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{Error, Result};

/// The most bytes of text one word (and so one token) of a trained BPE spans: see
/// [`Tokenizer::train_bpe`]. Far longer than the tokens a BPE of ordinary text learns, and
/// short enough that every word, at most 2 bytes a character after ByteLevel's mapping, is
/// kept in the BPE's cache of encoded words (which takes words below 256 bytes): at 256, a
/// long run of one byte was encoded from scratch word by word, about 3 times slower.
pub(crate) const MAX_WORD_BYTES: usize = 127;

/// How text became tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// Each byte of the text is a token (vocabulary 256): any bytes, UTF-8 or not.
    Bytes,
    /// A BPE (or any model a `tokenizer.json` describes) of the `tokenizers` crate.
    Bpe,
}

impl fmt::Display for TokenizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TokenizerKind::Bytes => "bytes",
            TokenizerKind::Bpe => "bpe",
        })
    }
}

/// Turns text into token ids and back: [`Tokenizer::bytes`], or a BPE loaded from a
/// `tokenizer.json` ([`Tokenizer::from_file`]; a [`TokenDataset`](crate::TokenDataset) holds
/// the one it was made with).
#[derive(Clone)]
pub struct Tokenizer {
    model: Model,
    bytes_per_token: Option<f64>,
}

#[derive(Clone)]
enum Model {
    Bytes,
    // Boxed: several hundred bytes of configuration against the unit variant.
    Bpe(Box<tokenizers::Tokenizer>),
}

/// A tokenizer error's text as this crate's error.
fn tokenizer_error(what: &str, e: impl fmt::Display) -> Error {
    Error::Config { field: "tokenizer", what: format!("{what}: {e}") }
}

impl Tokenizer {
    /// The byte-level tokenizer: token `b` is byte `b`, 256 of them.
    pub fn bytes() -> Self {
        Tokenizer { model: Model::Bytes, bytes_per_token: Some(1.0) }
    }

    /// A tokenizer from the text of a `tokenizer.json` (as `tokenizers` and Python's
    /// `transformers` save them); `origin` names it in errors.
    pub fn from_json(json: &str, origin: &Path) -> Result<Self> {
        let tokenizer = tokenizers::Tokenizer::from_str(json).map_err(|e| {
            Error::corrupt(
                origin,
                0,
                format!("not a tokenizer.json the tokenizers crate loads: {e}"),
            )
        })?;
        if tokenizer.get_vocab_size(true) == 0 {
            return Err(Error::corrupt(origin, 0, "a tokenizer.json with an empty vocabulary"));
        }
        Ok(Tokenizer { model: Model::Bpe(Box::new(tokenizer)), bytes_per_token: None })
    }

    /// A tokenizer from a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let json = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
        let json = String::from_utf8(json).map_err(|e| {
            Error::corrupt(
                path,
                e.utf8_error().valid_up_to() as u64,
                "a tokenizer.json must be UTF-8",
            )
        })?;
        Self::from_json(&json, path)
    }

    /// Trains a GPT-2-style byte-level BPE of `vocab_size` tokens (at most: a small text may
    /// give fewer merges) on `texts`: the ByteLevel pre-tokenizer (GPT-2's split pattern, no
    /// prefix space) and decoder, the 256 byte symbols as the initial alphabet, so that every
    /// text encodes. Pieces of text cut where a pre-token ends train exactly as the whole.
    ///
    /// A pre-token is then cut into pieces of at most [`MAX_WORD_BYTES`] bytes. GPT-2's
    /// pattern makes a whole run of letters, digits, punctuation or spaces one word (a file of
    /// one repeated byte is one word as long as the file), and the trainer's merge rewrites a
    /// word by inserting and removing in a vector, quadratic in the word's length on each
    /// merge: 300 KB of one byte took 29 s and 600 KB 141 s, and then every piece was one
    /// token. Cut, such a run becomes many equal words that the trainer counts once, and no
    /// token is longer than the cap, so a text of `n` bytes has at least `n / MAX_WORD_BYTES`
    /// tokens. The cut is part of the saved tokenizer (a `Split` after the `ByteLevel`
    /// pre-tokenizer, which Python's `tokenizers` loads too), so encoding cuts the same way.
    pub(crate) fn train_bpe<I>(vocab_size: usize, texts: I) -> Result<Self>
    where
        I: Iterator<Item = String> + Send,
    {
        let byte_level = ByteLevel::default().add_prefix_space(false).trim_offsets(false);
        // After ByteLevel every byte is one character, none of them a line break, so `.`
        // takes any byte and a match is at most MAX_WORD_BYTES bytes of the text.
        let pattern = SplitPattern::Regex(format!(".{{1,{MAX_WORD_BYTES}}}"));
        let cut = Split::new(pattern, SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| tokenizer_error("cannot build the word cap", e))?;
        let pre_tokenizer = Sequence::new(vec![
            PreTokenizerWrapper::ByteLevel(byte_level),
            PreTokenizerWrapper::Split(cut),
        ]);
        let mut tokenizer = tokenizers::Tokenizer::new(BPE::default());
        tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
        tokenizer.with_decoder(Some(byte_level));
        let trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(0)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        let mut trainer = TrainerWrapper::BpeTrainer(trainer);
        tokenizer
            .train(&mut trainer, texts)
            .map_err(|e| tokenizer_error("training the BPE failed", e))?;
        Ok(Tokenizer { model: Model::Bpe(Box::new(tokenizer)), bytes_per_token: None })
    }

    /// Bytes or BPE.
    pub fn kind(&self) -> TokenizerKind {
        match self.model {
            Model::Bytes => TokenizerKind::Bytes,
            Model::Bpe(_) => TokenizerKind::Bpe,
        }
    }

    /// Token ids are below this (added tokens included).
    pub fn vocab_size(&self) -> usize {
        match &self.model {
            Model::Bytes => 256,
            Model::Bpe(tokenizer) => tokenizer.get_vocab_size(true),
        }
    }

    /// Bytes of text per token over the import that made the dataset this tokenizer came
    /// from, so that a loss per token converts to bits per byte (`nats / ln 2 / this`): 1 for
    /// bytes; `None` for a BPE not from a dataset.
    pub fn bytes_per_token(&self) -> Option<f64> {
        self.bytes_per_token
    }

    pub(crate) fn with_bytes_per_token(mut self, bytes_per_token: f64) -> Self {
        self.bytes_per_token = Some(bytes_per_token);
        self
    }

    /// The `tokenizer.json` text of a BPE (`None` for bytes).
    pub fn to_json(&self) -> Result<Option<String>> {
        match &self.model {
            Model::Bytes => Ok(None),
            Model::Bpe(tokenizer) => tokenizer
                .to_string(false)
                .map(Some)
                .map_err(|e| tokenizer_error("cannot write the tokenizer.json", e)),
        }
    }

    /// The ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.model {
            Model::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Model::Bpe(tokenizer) => tokenizer
                .encode_fast(text, false)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(|e| tokenizer_error("cannot encode", e)),
        }
    }

    /// The ids of each text, encoded on the `tokenizers` crate's threads (BPE only; bytes are
    /// not worth a thread).
    pub(crate) fn encode_many(&self, texts: &[String]) -> Result<Vec<Vec<u32>>> {
        match &self.model {
            Model::Bytes => Ok(texts.iter().map(|t| t.bytes().map(u32::from).collect()).collect()),
            Model::Bpe(tokenizer) => {
                let inputs: Vec<&str> = texts.iter().map(String::as_str).collect();
                let encodings = tokenizer
                    .encode_batch_fast(inputs, false)
                    .map_err(|e| tokenizer_error("cannot encode", e))?;
                Ok(encodings.into_iter().map(|e| e.get_ids().to_vec()).collect())
            }
        }
    }

    /// The text of `tokens`. For bytes, the bytes read as UTF-8 with invalid sequences
    /// replaced by U+FFFD (a window may start or end inside a character); for BPE, through
    /// the tokenizer's decoder, which does the same for byte-level vocabularies. An id outside
    /// the vocabulary is an error naming its position.
    pub fn decode(&self, tokens: &[u32]) -> Result<String> {
        let vocab = self.vocab_size();
        if let Some(at) = tokens.iter().position(|&t| t as usize >= vocab) {
            return Err(Error::Config {
                field: "tokens",
                what: format!(
                    "token {} at position {at} is outside the vocabulary of {vocab}",
                    tokens[at]
                ),
            });
        }
        match &self.model {
            Model::Bytes => {
                let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Model::Bpe(tokenizer) => {
                tokenizer.decode(tokens, false).map_err(|e| tokenizer_error("cannot decode", e))
            }
        }
    }
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind())
            .field("vocab_size", &self.vocab_size())
            .field("bytes_per_token", &self.bytes_per_token)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_any_text_and_refuse_ids_past_255() {
        let tokenizer = Tokenizer::bytes();
        let text = "naïve café, 日本語 🦀";
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(ids.len(), text.len());
        assert_eq!(tokenizer.decode(&ids).unwrap(), text);
        // Half a character decodes to a replacement character, not an error.
        assert_eq!(
            tokenizer.decode(&ids[..ids.len() - 1]).unwrap().chars().last(),
            Some('\u{fffd}')
        );
        let error = tokenizer.decode(&[65, 256]).unwrap_err().to_string();
        assert!(error.contains("token 256 at position 1"), "{error}");
    }

    #[test]
    fn a_file_that_is_not_a_tokenizer_names_itself() {
        let error = Tokenizer::from_json("{\"x\": 1}", Path::new("my/tokenizer.json")).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("my/tokenizer.json") && text.contains("not a tokenizer.json"),
            "{text}"
        );
    }
}
