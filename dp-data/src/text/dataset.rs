//! Reading a token dataset: its info, its tokenizer and its tokens.

use std::path::{Path, PathBuf};

use crate::dataset::{Dataset, ReadOptions};
use crate::error::{Error, Result};

use super::tokens::{TokenWidth, Tokens};
use super::{INFO_FEATURE, TOKENS_FEATURE, TokenInfo, Tokenizer, token_schema};

/// A token dataset (its layout is described on [`TokenInfo`](crate::TokenInfo)): a split
/// that [`import_text`](crate::import_text) wrote, with its tokenizer.
///
/// ```no_run
/// use std::path::Path;
/// use dp_data::TokenDataset;
///
/// let train = TokenDataset::open(Path::new("data/shakespeare/train"))?;
/// let tokens = train.load()?;                   // 2 or 4 bytes a token, CRC32C checked
/// let text = train.tokenizer().decode(&tokens.to_vec()[..100])?;
/// # Ok::<(), dp_data::Error>(())
/// ```
#[derive(Debug)]
pub struct TokenDataset {
    dataset: Dataset,
    info: TokenInfo,
    tokenizer: Tokenizer,
}

impl TokenDataset {
    /// Whether `dataset` is a token dataset (by its schema; [`TokenDataset::open`] checks
    /// the rest).
    pub fn holds_tokens(dataset: &Dataset) -> bool {
        *dataset.schema() == token_schema()
    }

    /// Opens the token dataset in `dir`; an error if it is not one (a dataset of another
    /// schema, or a token info that does not match its records).
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, ReadOptions::default())
    }

    /// [`TokenDataset::open`] with read options (the pool decompression buffers and
    /// [`TokenDataset::load`] take memory from).
    pub fn open_with(dir: &Path, options: ReadOptions) -> Result<Self> {
        let dataset = Dataset::open_with(dir, options)?;
        if *dataset.schema() != token_schema() {
            return Err(Error::Schema(format!(
                "{} is not a token dataset: its schema is `{}`, a token dataset's is `{}` \
                 (made by import_text, `data import --format text`)",
                dir.display(),
                dataset.schema(),
                token_schema()
            )));
        }
        let first_shard = dataset.manifest().shards.first().map(|s| dir.join(&s.file));
        let shard = first_shard.unwrap_or_else(|| dir.to_path_buf());
        let bad =
            |what: String| Error::corrupt(&shard, 0, format!("record 0, `{INFO_FEATURE}`: {what}"));
        if dataset.is_empty() {
            return Err(bad("the dataset has no records, so no token info".into()));
        }
        let record = dataset.get(0)?;
        let info = TokenInfo::parse(record.bytes(INFO_FEATURE)?, &bad)?;
        if info.records() != dataset.len() {
            return Err(bad(format!(
                "{} tokens make {} records of {}, but the dataset has {}",
                info.tokens,
                info.records(),
                info.record_tokens,
                dataset.len()
            )));
        }
        let tokenizer = info.tokenizer(&shard)?;
        Ok(TokenDataset { dataset, info, tokenizer })
    }

    /// Tokens in the dataset.
    pub fn len(&self) -> u64 {
        self.info.tokens
    }

    /// Whether it holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token ids are below this.
    pub fn vocab_size(&self) -> usize {
        self.info.vocab_size
    }

    /// How tokens are stored (and held by [`TokenDataset::load`]).
    pub fn width(&self) -> TokenWidth {
        self.info.width
    }

    /// The tokenizer the tokens were made with, carrying the import's bytes per token.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Everything the dataset says about itself.
    pub fn info(&self) -> &TokenInfo {
        &self.info
    }

    /// The dataset underneath (its manifest, `verify`, the pool).
    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }

    /// The whole stream as `u32`, every block's CRC32C checked.
    pub fn read_all(&self) -> Result<Vec<u32>> {
        let len = self.memory_len()?;
        let mut out = Vec::new();
        out.try_reserve_exact(len)
            .map_err(|_| Error::Memory(no_memory(len * 4, self.dataset.dir())))?;
        let width = self.info.width;
        self.for_each_record(|bytes| {
            match width {
                TokenWidth::U16 => out.extend(
                    bytes.chunks_exact(2).map(|t| u32::from(u16::from_le_bytes([t[0], t[1]]))),
                ),
                TokenWidth::U32 => out.extend(
                    bytes.chunks_exact(4).map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]])),
                ),
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The whole stream at its stored width (`len * 2` or `len * 4` bytes), in one buffer from
    /// the dataset's pool under the `Data` tag (so budgets and memory reports count it), every
    /// block's CRC32C checked. Wrap it in an `Arc` to share it between samplers.
    pub fn load(&self) -> Result<Tokens> {
        let len = self.memory_len()?;
        let mut tokens = Tokens::with_len(self.dataset.pool(), self.info.width, len)?;
        let bytes = tokens.bytes_mut();
        let mut at = 0;
        self.for_each_record(|record| {
            bytes[at..at + record.len()].copy_from_slice(record);
            at += record.len();
            Ok(())
        })?;
        Ok(tokens)
    }

    /// The token count as a memory length.
    fn memory_len(&self) -> Result<usize> {
        usize::try_from(self.info.tokens)
            .ok()
            .filter(|n| n.checked_mul(4).is_some())
            .ok_or_else(|| Error::Memory(no_memory(usize::MAX, self.dataset.dir())))
    }

    /// Calls `f` with each record's token bytes in order, after checking that every record
    /// but the last holds `record_tokens` tokens and the last the rest: an error names the
    /// shard file and the record otherwise.
    fn for_each_record(&self, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let width = self.info.width.bytes();
        let full = self.info.record_tokens * width;
        let total = self.info.tokens;
        let mut seen = 0u64;
        for block in self.dataset.blocks() {
            let block = block?;
            for row in 0..block.len() {
                let record = block.first_record() + row as u64;
                let bytes = block.bytes(TOKENS_FEATURE, row)?;
                let left = (total - seen) * width as u64;
                let expected = left.min(full as u64) as usize;
                if bytes.len() != expected {
                    return Err(Error::corrupt(
                        self.shard_of(record),
                        0,
                        format!(
                            "record {record} holds {} bytes of tokens, expected {expected} \
                             ({} tokens of {width} bytes; {seen} of {total} tokens read before it)",
                            bytes.len(),
                            expected / width
                        ),
                    ));
                }
                f(bytes)?;
                seen += (bytes.len() / width) as u64;
            }
        }
        Ok(())
    }

    /// The shard file holding `record`.
    fn shard_of(&self, record: u64) -> PathBuf {
        let mut start = 0;
        for shard in &self.dataset.manifest().shards {
            if record < start + shard.records {
                return self.dataset.dir().join(&shard.file);
            }
            start += shard.records;
        }
        self.dataset.dir().to_path_buf()
    }
}

fn no_memory(bytes: usize, dir: &Path) -> dp_mem::Error {
    dp_mem::Error::Backend {
        backend: "system",
        bytes,
        message: format!("no memory for the tokens of {}", dir.display()).into(),
        tag: Some(dp_mem::Tag::Data),
    }
}
