//! Text files as token streams: [`import_text`].
//!
//! The files are read in pieces (plain or gzip, never whole), tokenized, and written as two
//! token datasets, `OUT/train` (the head of the stream) and `OUT/eval` (its last
//! `eval_fraction`), in the layout of [`TokenInfo`](crate::TokenInfo).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::mpsc;
use std::time::Instant;

use super::Source;
use crate::error::{Error, Result};
use crate::synthetic::Split;
use crate::text::{
    INFO_FORMAT, INFO_VERSION, RECORD_TOKENS, TokenInfo, TokenWidth, Tokenizer, TokenizerKind,
    token_schema,
};
use crate::{DatasetWriter, Manifest, Value, WriterOptions};

/// Which tokenizer [`import_text`] uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextTokenizer {
    /// Every byte is a token (vocabulary 256); any bytes are accepted.
    Bytes,
    /// A GPT-2-style byte-level BPE of (at most) this many tokens, trained on the input first.
    TrainBpe {
        /// The vocabulary size to train to, 257 to 16,777,216.
        vocab_size: usize,
    },
    /// The tokenizer of a `tokenizer.json` file (Hugging Face `tokenizers` format).
    File(PathBuf),
}

impl FromStr for TextTokenizer {
    type Err = Error;

    /// `bytes`, `bpe:VOCAB_SIZE` or the path of a `tokenizer.json`.
    fn from_str(text: &str) -> Result<Self> {
        if text == "bytes" {
            return Ok(TextTokenizer::Bytes);
        }
        if let Some(size) = text.strip_prefix("bpe:") {
            let vocab_size = size.parse().map_err(|_| Error::Config {
                field: "tokenizer",
                what: format!("`{text}`: expected bpe:VOCAB_SIZE with a whole number"),
            })?;
            return Ok(TextTokenizer::TrainBpe { vocab_size });
        }
        Ok(TextTokenizer::File(PathBuf::from(text)))
    }
}

/// How [`import_text`] tokenizes and splits.
#[derive(Debug, Clone, PartialEq)]
pub struct TextOptions {
    /// The tokenizer (default: bytes).
    pub tokenizer: TextTokenizer,
    /// The share of the token stream held out as `OUT/eval`, its tail (0 to below 1;
    /// default 0.1).
    pub eval_fraction: f64,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions { tokenizer: TextTokenizer::Bytes, eval_fraction: 0.1 }
    }
}

/// What [`import_text`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TextReport {
    /// Input files.
    pub files: usize,
    /// Bytes of text read (decompressed).
    pub text_bytes: u64,
    /// Tokens made, both splits.
    pub tokens: u64,
    /// The tokenizer used.
    pub tokenizer: TokenizerKind,
    /// Its vocabulary.
    pub vocab_size: usize,
    /// How tokens are stored.
    pub width: TokenWidth,
    /// `text_bytes / tokens`.
    pub bytes_per_token: f64,
    /// Tokens in `OUT/train`.
    pub train_tokens: u64,
    /// Tokens in `OUT/eval`.
    pub eval_tokens: u64,
    /// The manifests of `OUT/train` and `OUT/eval`.
    pub train: Manifest,
    /// See `train`.
    pub eval: Manifest,
    /// `OUT/tokenizer.json`, the copy of a BPE's vocabulary for other tools.
    pub tokenizer_json: Option<PathBuf>,
    /// Seconds spent training a BPE (0 otherwise).
    pub train_seconds: f64,
    /// Seconds of the whole import.
    pub seconds: f64,
}

/// Where a text import has got to: what [`import_text_with_progress`] hands its `progress`
/// now and then (after each piece of text, a few times a megabyte), so that a long import can
/// say how far it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TextProgress {
    /// What the import is doing.
    pub stage: TextStage,
    /// How much of it is done: bytes of text read by [`TextStage::TrainBpe`] and
    /// [`TextStage::Encode`], tokens written by [`TextStage::Write`].
    pub done: u64,
    /// How much there is: the files' bytes of text, or the tokens to write.
    pub total: u64,
}

/// The stages of a text import, in order (a bytes import has no training and no encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum TextStage {
    /// Counting the words a BPE is trained on (the merges that follow report nothing, and
    /// are bounded by the distinct words).
    TrainBpe,
    /// Encoding the text into tokens.
    Encode,
    /// Writing the splits.
    Write,
}

/// Bytes of text read at a time, and the least a piece to encode holds.
const CHUNK: usize = 256 << 10;

/// The most a piece may grow while no cut point is found in it (then it is cut at a character
/// boundary).
const MAX_PIECE: usize = 4 * CHUNK;

/// The largest vocabulary a BPE may be trained to.
const MAX_VOCAB: usize = 1 << 24;

/// The file a BPE's `tokenizer.json` is copied to, next to the splits.
const TOKENIZER_FILE: &str = "tokenizer.json";

/// Imports text files as token datasets: `out/train` holds the head of the token stream
/// (`floor(tokens * (1 - eval_fraction))` tokens, as nanoGPT's `int(n * 0.9)`) and `out/eval`
/// the tail, both with the tokenizer inside (see [`TokenInfo`](crate::TokenInfo)); a BPE's
/// `tokenizer.json` is also written to `out/tokenizer.json`. The files' texts follow one
/// another in the stream with nothing between them.
///
/// * **bytes**: each byte is a token, any bytes accepted (`decode` of all tokens is the files'
///   concatenation, as UTF-8 where they are).
/// * **BPE** (trained or loaded): the text must be UTF-8 (an error names the file and the byte
///   offset of the first invalid byte). It is encoded in pieces of at least 256 KiB cut just
///   before a whitespace character followed by a non-whitespace one (a place where GPT-2's
///   pre-tokenizer always splits, so a byte-level BPE gives exactly the tokens of encoding each
///   file whole); a piece that reaches 1 MiB without such a place is cut at a character
///   boundary. Tokenizers that add something at the start of every input (a prefix space, a
///   Metaspace prefix) add it at every piece; special tokens are never added. Training reads the
///   text once more, in the same pieces, and its word counts grow with the distinct words of
///   the text.
///
/// Memory stays bounded: a few pieces of text, and the writer's blocks. A BPE's tokens are
/// kept in a temporary file in `out` until the stream's length (and so the split) is known;
/// bytes need none (their count is the files' length). An import that fails leaves nothing:
/// no split, no temporary file, and no `out` if it did not exist before. `out` must be
/// missing or an empty directory (what a killed import left there aside: its temporary file
/// is removed; and the input files themselves may lie there); a dataset, a file or a
/// directory holding anything else is refused, naming it.
///
/// ```no_run
/// use std::path::Path;
/// use dp_data::{TextOptions, WriterOptions, import_text};
///
/// let options = TextOptions { tokenizer: "bpe:4096".parse()?, ..TextOptions::default() };
/// let report = import_text(&[Path::new("input.txt")], Path::new("data/text"), &options,
///     WriterOptions::default())?;
/// println!("{} tokens, {:.2} bytes per token", report.tokens, report.bytes_per_token);
/// # Ok::<(), dp_data::Error>(())
/// ```
pub fn import_text(
    files: &[&Path],
    out: &Path,
    options: &TextOptions,
    writer: WriterOptions,
) -> Result<TextReport> {
    import_text_with_progress(files, out, options, writer, &|_| {})
}

/// [`import_text`], telling `progress` how far it is (see [`TextProgress`]); `progress` may
/// be called from the threads of the `tokenizers` crate while a BPE trains.
pub fn import_text_with_progress(
    files: &[&Path],
    out: &Path,
    options: &TextOptions,
    writer: WriterOptions,
    progress: &(dyn Fn(TextProgress) + Sync),
) -> Result<TextReport> {
    let started = Instant::now();
    let (tokenizer_path, total) = prepare_import(files, out, options)?;
    let fraction = options.eval_fraction;

    // What this call makes in `out`, removed if it fails: `out` itself when it is new, and a
    // split written before a later step failed.
    let mut cleanup = Cleanup { out, created: !out.exists(), written: Vec::new() };
    let (tokenizer, train_seconds) = tokenizer_for(files, options, total, progress)?;
    let vocab_size = tokenizer.vocab_size();
    let width = TokenWidth::for_vocab(vocab_size);

    let (text_bytes, mut stream) = match tokenizer.kind() {
        TokenizerKind::Bytes => (total, TokenStream::bytes(files, total)),
        TokenizerKind::Bpe => {
            std::fs::create_dir_all(out).map_err(|e| Error::io(out, "create", e))?;
            let report = |done| progress(TextProgress { stage: TextStage::Encode, done, total });
            spill(files, &tokenizer, width, out, &report)?
        }
    };
    let tokens = stream.tokens;
    let train_tokens = train_tokens_of(files, options, tokens, text_bytes)?;
    let eval_tokens = tokens - train_tokens;
    let bytes_per_token = text_bytes as f64 / tokens as f64;
    let info = |split: Split, count: u64| TokenInfo {
        format: INFO_FORMAT.into(),
        version: INFO_VERSION,
        split: split.name().into(),
        tokenizer: tokenizer.kind(),
        vocab_size,
        width,
        record_tokens: RECORD_TOKENS,
        tokens: count,
        files: files.len() as u64,
        text_bytes,
        import_tokens: tokens,
        bytes_per_token,
        eval_fraction: fraction,
        tokenizer_json: None,
    };
    let json = tokenizer.to_json()?;
    let mut train_info = info(Split::Train, train_tokens);
    train_info.tokenizer_json.clone_from(&json);
    let mut eval_info = info(Split::Eval, eval_tokens);
    eval_info.tokenizer_json.clone_from(&json);
    let train_dir = out.join(Split::Train.name());
    let report = |done| progress(TextProgress { stage: TextStage::Write, done, total: tokens });
    let train =
        write_split(&train_dir, &train_info, &mut stream, writer.clone(), &|done| report(done))?;
    cleanup.written.push(train_dir);
    let eval_dir = out.join(Split::Eval.name());
    let eval = write_split(&eval_dir, &eval_info, &mut stream, writer, &|done| {
        report(train_tokens + done)
    })?;
    cleanup.written.push(eval_dir);
    stream.expect_end()?;
    let tokenizer_json = match json {
        Some(json) => {
            crate::write_file(&tokenizer_path, json.as_bytes())?;
            Some(tokenizer_path)
        }
        None => None,
    };
    cleanup.disarm();
    Ok(TextReport {
        files: files.len(),
        text_bytes,
        tokens,
        tokenizer: tokenizer.kind(),
        vocab_size,
        width,
        bytes_per_token,
        train_tokens,
        eval_tokens,
        train,
        eval,
        tokenizer_json,
        train_seconds,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Checks the options and the inputs, and prepares `out`; returns where a tokenizer is
/// written and the files' text length.
fn prepare_import(files: &[&Path], out: &Path, options: &TextOptions) -> Result<(PathBuf, u64)> {
    if files.is_empty() {
        return Err(Error::Config { field: "files", what: "no input files".into() });
    }
    let fraction = options.eval_fraction;
    if !(0.0..1.0).contains(&fraction) {
        return Err(Error::Config {
            field: "eval_fraction",
            what: format!("{fraction} is outside 0 to below 1"),
        });
    }
    // `out` itself first: never a dataset, nor a directory of someone else's files.
    super::text_out::prepare(out, TOKENIZER_FILE, files)?;
    for split in [Split::Train, Split::Eval] {
        crate::staging::check_target(&out.join(split.name()))?;
    }
    let tokenizer_path = out.join(TOKENIZER_FILE);
    if options.tokenizer != TextTokenizer::Bytes {
        crate::check_output_file(&tokenizer_path)?;
    }
    // Every file opens before any work, and its text's length is known (what a gzip file
    // holds costs a pass of decompression, little next to tokenizing it).
    let mut total = 0u64;
    for path in files {
        Source::open(path, None)?;
        total += file_length(path)?;
    }
    Ok((tokenizer_path, total))
}

/// The tokenizer `options` name: bytes, loaded, or trained on `files` (`total` bytes of
/// text), and the seconds training took.
fn tokenizer_for(
    files: &[&Path],
    options: &TextOptions,
    total: u64,
    progress: &(dyn Fn(TextProgress) + Sync),
) -> Result<(Tokenizer, f64)> {
    let fraction = options.eval_fraction;
    match &options.tokenizer {
        TextTokenizer::Bytes => Ok((Tokenizer::bytes(), 0.0)),
        TextTokenizer::File(path) => Ok((Tokenizer::from_file(path)?, 0.0)),
        TextTokenizer::TrainBpe { vocab_size } => {
            if !(257..=MAX_VOCAB).contains(vocab_size) {
                return Err(Error::Config {
                    field: "tokenizer",
                    what: format!(
                        "bpe:{vocab_size}: a byte-level BPE has 256 byte tokens and merges \
                         above them: give 257 to {MAX_VOCAB} (or `bytes` for 256)"
                    ),
                });
            }
            // A byte-level BPE's tokens are a byte or more each, so the text has at most
            // `total` tokens: when even that leaves none for training, say so before the
            // training rather than after it.
            if train_share(total, fraction) == 0 {
                return Err(Error::Config {
                    field: "files",
                    what: format!(
                        "the {} file(s) hold {total} bytes of text, at most {total} tokens, and \
                         an eval_fraction of {fraction} leaves none of them for training",
                        files.len()
                    ),
                });
            }
            let start = Instant::now();
            let read = std::sync::atomic::AtomicU64::new(0);
            let trained = with_pieces(files, |pieces| {
                let counted = pieces.inspect(|piece| {
                    let len = piece.len() as u64;
                    let done = read.fetch_add(len, std::sync::atomic::Ordering::Relaxed) + len;
                    progress(TextProgress { stage: TextStage::TrainBpe, done, total });
                });
                Tokenizer::train_bpe(*vocab_size, counted)
            })?;
            Ok((trained, start.elapsed().as_secs_f64()))
        }
    }
}

/// The tokens of the train split, of `tokens` in all (encoded from `text_bytes` bytes); an
/// error when there are none, or none for training.
fn train_tokens_of(
    files: &[&Path],
    options: &TextOptions,
    tokens: u64,
    text_bytes: u64,
) -> Result<u64> {
    let fraction = options.eval_fraction;
    if tokens == 0 {
        return Err(Error::Config {
            field: "files",
            what: format!("the {} file(s) hold no text", files.len()),
        });
    }
    let train_tokens = train_share(tokens, fraction);
    if train_tokens == 0 {
        let smaller = match &options.tokenizer {
            TextTokenizer::TrainBpe { .. } => {
                format!(
                    " (the BPE packed {text_bytes} bytes into them: a smaller vocabulary packs less)"
                )
            }
            _ => String::new(),
        };
        return Err(Error::Config {
            field: "eval_fraction",
            what: format!("{fraction} of {tokens} tokens leaves none for training{smaller}"),
        });
    }
    Ok(train_tokens)
}

/// Removes, when dropped armed (an import that failed), the splits it wrote and the output
/// directory if the import created it (only if empty: nothing else is ever removed).
struct Cleanup<'a> {
    out: &'a Path,
    created: bool,
    written: Vec<PathBuf>,
}

impl Cleanup<'_> {
    fn disarm(&mut self) {
        self.created = false;
        self.written.clear();
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for dir in self.written.drain(..) {
            let _ = std::fs::remove_dir_all(dir);
        }
        if self.created {
            let _ = std::fs::remove_dir(self.out);
        }
    }
}

/// The tokens of `tokens` that a split holding out `fraction` keeps for training.
fn train_share(tokens: u64, fraction: f64) -> u64 {
    (tokens as f64 * (1.0 - fraction)).floor() as u64
}

/// Tokens written between two calls of a split writer's `progress`.
const WRITE_REPORT_TOKENS: u64 = 1 << 20;

/// Writes the next `info.tokens` tokens of `stream` as a token dataset at `dir`, telling
/// `progress` the tokens written now and then.
fn write_split(
    dir: &Path,
    info: &TokenInfo,
    stream: &mut TokenStream<'_>,
    options: WriterOptions,
    progress: &dyn Fn(u64),
) -> Result<Manifest> {
    let info_json = serde_json::to_vec(info)
        .map_err(|e| Error::Schema(format!("cannot serialize the token info: {e}")))?;
    let mut writer = DatasetWriter::create(dir, token_schema(), options)?;
    let width = info.width.bytes();
    let mut record = vec![0u8; RECORD_TOKENS * width];
    let mut left = info.tokens;
    let mut first = true;
    while first || left > 0 {
        let count = left.min(RECORD_TOKENS as u64) as usize;
        let bytes = &mut record[..count * width];
        stream.fill(bytes, width)?;
        let meta: &[u8] = if first { &info_json } else { &[] };
        writer.append(&[Value::Bytes(&*bytes), Value::Bytes(meta)])?;
        left -= count as u64;
        first = false;
        let done = info.tokens - left;
        if done % WRITE_REPORT_TOKENS < count as u64 || left == 0 {
            progress(done);
        }
    }
    writer.finish()
}

/// The length of `path`'s text: its size, or for gzip what it decompresses to.
fn file_length(path: &Path) -> Result<u64> {
    let mut source = Source::open(path, None)?;
    if let Some(length) = source.remaining() {
        return Ok(length);
    }
    let mut buf = vec![0u8; CHUNK];
    while source.fill(&mut buf, "text")? > 0 {}
    Ok(source.offset())
}

/// The tokens being written, read again from where they are: the input files (bytes) or the
/// temporary file a BPE's tokens were spilled to.
struct TokenStream<'a> {
    tokens: u64,
    kind: StreamKind<'a>,
}

enum StreamKind<'a> {
    /// The files' bytes, each widened to a `u16` token.
    Bytes { files: &'a [&'a Path], next: usize, source: Option<Source>, buf: Vec<u8> },
    /// Tokens at their stored width, little-endian.
    Spill { file: BufReader<File>, path: PathBuf, _temp: tempfile::TempPath },
}

impl<'a> TokenStream<'a> {
    fn bytes(files: &'a [&'a Path], tokens: u64) -> Self {
        let kind = StreamKind::Bytes { files, next: 0, source: None, buf: vec![0; RECORD_TOKENS] };
        TokenStream { tokens, kind }
    }

    /// Fills `out` with the next `out.len() / width` tokens.
    fn fill(&mut self, out: &mut [u8], width: usize) -> Result<()> {
        match &mut self.kind {
            StreamKind::Spill { file, path, .. } => {
                file.read_exact(out).map_err(|e| Error::io(&*path, "read", e))
            }
            StreamKind::Bytes { files, next, source, buf } => {
                debug_assert_eq!(width, 2);
                let mut at = 0;
                while at < out.len() {
                    let Some(current) = source else {
                        let Some(path) = files.get(*next) else {
                            return Err(changed(files.last().copied(), "shorter"));
                        };
                        *source = Some(Source::open(path, None)?);
                        *next += 1;
                        continue;
                    };
                    let want = ((out.len() - at) / 2).min(buf.len());
                    let got = current.fill(&mut buf[..want], "text")?;
                    if got == 0 {
                        *source = None;
                        continue;
                    }
                    for (pair, &b) in out[at..at + 2 * got].chunks_exact_mut(2).zip(&buf[..got]) {
                        pair.copy_from_slice(&[b, 0]);
                    }
                    at += 2 * got;
                }
                Ok(())
            }
        }
    }

    /// Checks that the stream holds no more than was counted.
    fn expect_end(&mut self) -> Result<()> {
        match &mut self.kind {
            StreamKind::Spill { .. } => Ok(()),
            StreamKind::Bytes { files, next, source, .. } => loop {
                if let Some(current) = source
                    && !current.at_end()?
                {
                    return Err(changed(Some(current.path()), "longer"));
                }
                let Some(path) = files.get(*next) else { return Ok(()) };
                *source = Some(Source::open(path, None)?);
                *next += 1;
            },
        }
    }
}

/// A file that changed length between the count and the read.
fn changed(path: Option<&Path>, how: &str) -> Error {
    Error::Config {
        field: "files",
        what: format!(
            "{} is {how} than when the import counted its bytes: it changed while it was \
             imported; import files that are not being written",
            path.map_or("an input".into(), |p| p.display().to_string())
        ),
    }
}

/// Encodes the files' pieces with `tokenizer` into a temporary file in `dir`, at `width`;
/// returns the text's bytes and the stream of its tokens.
fn spill<'a>(
    files: &'a [&'a Path],
    tokenizer: &Tokenizer,
    width: TokenWidth,
    dir: &Path,
    progress: &dyn Fn(u64),
) -> Result<(u64, TokenStream<'a>)> {
    let (file, temp, path) = super::text_out::spill_file(dir)?;
    let mut writer = BufWriter::with_capacity(1 << 20, file);
    let batch = 2 * std::thread::available_parallelism().map_or(1, |n| n.get());
    let (text_bytes, tokens) = with_pieces(files, |mut pieces| {
        let (mut text_bytes, mut tokens) = (0u64, 0u64);
        let mut encoded = Vec::new();
        let mut texts = Vec::with_capacity(batch);
        loop {
            texts.clear();
            texts.extend(pieces.by_ref().take(batch));
            if texts.is_empty() {
                return Ok((text_bytes, tokens));
            }
            for (text, ids) in texts.iter().zip(tokenizer.encode_many(&texts)?) {
                text_bytes += text.len() as u64;
                tokens += ids.len() as u64;
                encoded.clear();
                width.encode(&ids, &mut encoded);
                writer.write_all(&encoded).map_err(|e| Error::io(&path, "write", e))?;
            }
            progress(text_bytes);
        }
    })?;
    let file = writer.into_inner().map_err(|e| Error::io(&path, "write", e.into_error()))?;
    let mut file = file;
    std::io::Seek::rewind(&mut file).map_err(|e| Error::io(&path, "seek", e))?;
    let kind =
        StreamKind::Spill { file: BufReader::with_capacity(1 << 20, file), path, _temp: temp };
    Ok((text_bytes, TokenStream { tokens, kind }))
}

/// Runs `work` on the files' text pieces, read on a thread of their own (reading overlaps
/// tokenizing); an error reading stops both and is returned.
fn with_pieces<T>(
    files: &[&Path],
    work: impl FnOnce(mpsc::IntoIter<String>) -> Result<T>,
) -> Result<T> {
    // A channel's receiver: the `Send` iterator the tokenizers crate's trainer asks for.
    let (sender, receiver) = mpsc::sync_channel::<String>(4);
    std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name("dp-data-text".into())
            .spawn_scoped(scope, move || read_pieces(files, &sender))
            .map_err(|e| Error::Config {
                field: "threads",
                what: format!(
                    "cannot start the text reader thread ({e}): {}",
                    dp_mem::THREAD_REFUSED
                ),
            })?;
        // Consumed and dropped by `work`: a reader still sending then sees the end and stops.
        let result = work(receiver.into_iter());
        let read = reader
            .join()
            .unwrap_or_else(|_| Err(Error::Stopped("the text reader thread panicked".into())));
        read?;
        result
    })
}

/// Sends the pieces of every file in order; stops quietly when the receiver is gone.
fn read_pieces(files: &[&Path], sender: &mpsc::SyncSender<String>) -> Result<()> {
    for path in files {
        let mut source = Source::open(path, None)?;
        let mut pieces = Pieces::new();
        while let Some(piece) = pieces.next(&mut source)? {
            if sender.send(piece).is_err() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Cuts one file's text into UTF-8 pieces.
struct Pieces {
    buf: Vec<u8>,
    /// The file offset of `buf[0]`.
    start: u64,
    done: bool,
}

/// Whitespace as GPT-2's pattern's `\s` sees it, among ASCII bytes.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

impl Pieces {
    fn new() -> Self {
        Pieces { buf: Vec::with_capacity(MAX_PIECE + CHUNK), start: 0, done: false }
    }

    /// The next piece of `source`'s text, `None` at its end.
    fn next(&mut self, source: &mut Source) -> Result<Option<String>> {
        loop {
            if !self.done && self.buf.len() < CHUNK {
                self.read(source)?;
                continue;
            }
            let valid = match std::str::from_utf8(&self.buf) {
                Ok(_) => self.buf.len(),
                Err(e) => match e.error_len() {
                    // An invalid sequence, or a file that ends inside a character.
                    Some(_) => return Err(self.invalid(source, e.valid_up_to(), "an invalid")),
                    None if self.done => {
                        return Err(self.invalid(source, e.valid_up_to(), "an unfinished"));
                    }
                    None => e.valid_up_to(),
                },
            };
            if self.done && valid == self.buf.len() {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(self.take(valid)));
            }
            // Just before the last whitespace that precedes a non-whitespace character.
            let cut = (1..valid.saturating_sub(1)).rev().find(|&p| {
                is_space(self.buf[p]) && self.buf[p + 1].is_ascii() && !is_space(self.buf[p + 1])
            });
            match cut {
                Some(p) if p >= CHUNK / 2 || self.done => return Ok(Some(self.take(p))),
                _ if self.buf.len() >= MAX_PIECE => return Ok(Some(self.take(valid))),
                _ if self.done => return Ok(Some(self.take(valid))),
                _ => self.read(source)?,
            }
        }
    }

    /// Appends up to [`CHUNK`] more bytes; marks the end of the file.
    fn read(&mut self, source: &mut Source) -> Result<()> {
        let old = self.buf.len();
        self.buf.resize(old + CHUNK, 0);
        let got = source.fill(&mut self.buf[old..], "text")?;
        self.buf.truncate(old + got);
        if got == 0 {
            self.done = true;
        }
        Ok(())
    }

    /// The first `len` bytes (valid UTF-8) as a piece.
    fn take(&mut self, len: usize) -> String {
        let rest = self.buf.split_off(len);
        let piece = std::mem::replace(&mut self.buf, rest);
        self.start += len as u64;
        String::from_utf8(piece)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    fn invalid(&self, source: &Source, at: usize, what: &str) -> Error {
        let offset = self.start + at as u64;
        let end = (at + 4).min(self.buf.len());
        source.corrupt(
            offset,
            format!(
                "{what} UTF-8 sequence (bytes {}): a BPE reads UTF-8 text; `--tokenizer bytes` \
                 takes any bytes",
                super::quote(&self.buf[at..end])
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces_of(bytes: &[u8]) -> Result<Vec<String>> {
        let mut source = Source::from_bytes(bytes.to_vec(), false);
        let mut pieces = Pieces::new();
        let mut out = Vec::new();
        while let Some(piece) = pieces.next(&mut source)? {
            out.push(piece);
        }
        Ok(out)
    }

    #[test]
    fn pieces_cover_the_text_and_cut_before_a_space_that_precedes_a_word() {
        let mut text = String::new();
        let mut i = 0u64;
        while text.len() < 3 * MAX_PIECE {
            text.push_str(["word", " ", "é日", "\n", "  ", "x"][(i * 7 % 6) as usize]);
            i += 1;
        }
        let pieces = pieces_of(text.as_bytes()).unwrap();
        assert!(pieces.len() > 3, "{} pieces", pieces.len());
        assert_eq!(pieces.concat(), text);
        for piece in &pieces[1..] {
            let bytes = piece.as_bytes();
            assert!(is_space(bytes[0]) && !is_space(bytes[1]), "{:?}", &piece[..8]);
        }
        // No place to cut: pieces of at most MAX_PIECE at character boundaries.
        let dense = "日本".repeat(MAX_PIECE);
        let pieces = pieces_of(dense.as_bytes()).unwrap();
        assert!(pieces.iter().all(|p| p.len() <= MAX_PIECE + CHUNK));
        assert_eq!(pieces.concat(), dense);
        assert_eq!(pieces_of(b"").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn invalid_utf8_is_an_error_at_its_offset() {
        let mut bytes = "a".repeat(CHUNK + 100).into_bytes();
        bytes[CHUNK + 10] = 0xff;
        let error = pieces_of(&bytes).unwrap_err().to_string();
        assert!(error.contains(&format!("corrupt at byte {}", CHUNK + 10)), "{error}");
        assert!(error.contains("invalid UTF-8"), "{error}");
        let error = pieces_of("ab日".as_bytes().split_last().unwrap().1).unwrap_err().to_string();
        assert!(error.contains("at byte 2") && error.contains("unfinished UTF-8"), "{error}");
    }

    #[test]
    fn tokenizer_specs_parse() {
        assert_eq!("bytes".parse::<TextTokenizer>().unwrap(), TextTokenizer::Bytes);
        assert_eq!(
            "bpe:1024".parse::<TextTokenizer>().unwrap(),
            TextTokenizer::TrainBpe { vocab_size: 1024 }
        );
        assert_eq!(
            "t/tokenizer.json".parse::<TextTokenizer>().unwrap(),
            TextTokenizer::File("t/tokenizer.json".into())
        );
        assert!(
            "bpe:many".parse::<TextTokenizer>().unwrap_err().to_string().contains("VOCAB_SIZE")
        );
    }
}
