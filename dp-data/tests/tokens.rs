//! Text as token streams through the public API: `import_text` (bytes and BPE, trained or
//! loaded), `TokenDataset`, `Tokenizer` and `SequenceSampler`, on small generated corpora with
//! fixed seeds.

#[path = "support/temp_dir.rs"]
#[allow(dead_code)]
mod temp_dir;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dp_data::{
    Dataset, DatasetWriter, Error, Feature, Rng, Schema, SequenceConfig, SequenceSampler,
    SequenceState, TextOptions, TextProgress, TextReport, TextStage, TextTokenizer, TokenDataset,
    TokenWidth, TokenizerKind, Tokens, Value, WriterOptions, import_text,
    import_text_with_progress,
};
use dp_mem::{CountingAlloc, Pool, Tracker};
use temp_dir::{TempDir, gzip};

// Counts allocations per thread, so that the other tests of this binary running meanwhile do
// not disturb the one that counts.
#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

/// Words of a small language: frequent short ones, rare long ones, and multi-byte UTF-8.
const WORDS: [&str; 24] = [
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "it",
    "that",
    "was",
    "naïve",
    "café",
    "Ωmega",
    "日本語",
    "🦀",
    "straße",
    "data",
    "parallel",
    "training",
    "token",
    "stream",
    "window",
    "epoch",
    "gradient",
];

/// `bytes` bytes (about) of text: sentences of words drawn with a skew towards the first ones,
/// lines of a few sentences; the same for the same seed.
fn corpus(seed: u64, bytes: usize) -> String {
    let mut rng = Rng::new(seed);
    let mut text = String::new();
    while text.len() < bytes {
        let words = 4 + rng.below(12);
        for i in 0..words {
            // The minimum of two draws favours the frequent words.
            let w = rng.below(WORDS.len() as u64).min(rng.below(WORDS.len() as u64));
            if i > 0 {
                text.push(' ');
            }
            text.push_str(WORDS[w as usize]);
        }
        text.push_str(if rng.below(3) == 0 { ".\n" } else { ". " });
    }
    text
}

fn small_blocks() -> WriterOptions {
    let mut options = WriterOptions::default();
    options.block_size = 4 << 10; // a record of 4096 tokens fills a block: many blocks
    options.threads = 2;
    options
}

fn import(files: &[PathBuf], out: &Path, tokenizer: TextTokenizer, fraction: f64) -> TextReport {
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let options = TextOptions { tokenizer, eval_fraction: fraction };
    import_text(&paths, out, &options, small_blocks()).unwrap()
}

/// Both splits' tokens, checked to be sound datasets with nothing unlisted beside them.
fn read_splits(out: &Path) -> (TokenDataset, Vec<u32>, TokenDataset, Vec<u32>) {
    let train = TokenDataset::open(&out.join("train")).unwrap();
    let eval = TokenDataset::open(&out.join("eval")).unwrap();
    for split in [&train, &eval] {
        let problems = split.dataset().verify();
        assert!(problems.is_empty(), "{problems:?}");
    }
    let (a, b) = (train.read_all().unwrap(), eval.read_all().unwrap());
    (train, a, eval, b)
}

#[test]
fn bytes_import_round_trips_several_files_and_holds_out_the_exact_tail() {
    let dir = TempDir::new("tokens-bytes");
    let text = corpus(1, 30_000);
    // Cut the text inside a multi-byte character, so that one spans two files, and gzip one.
    let cut = text.find("日本語").unwrap() + 1;
    let (first, rest) = text.as_bytes().split_at(cut);
    let (second, third) = rest.split_at(rest.len() / 2);
    let files = vec![
        dir.write("a.txt", first),
        dir.write("b.txt.gz", &gzip(second)),
        dir.write("c.txt", third),
        dir.write("empty.txt", b""),
    ];
    let out = dir.out();
    let report = import(&files, &out, TextTokenizer::Bytes, 0.1);
    let n = text.len() as u64;
    assert_eq!((report.files, report.text_bytes, report.tokens), (4, n, n));
    assert_eq!(
        (report.vocab_size, report.width, report.bytes_per_token),
        (256, TokenWidth::U16, 1.0)
    );
    assert_eq!(report.train_tokens, (n as f64 * 0.9) as u64);
    assert_eq!(report.train_tokens + report.eval_tokens, n);
    assert!(report.tokenizer_json.is_none());

    let (train, head, eval, tail) = read_splits(&out);
    assert_eq!((train.len(), eval.len()), (report.train_tokens, report.eval_tokens));
    assert_eq!((train.vocab_size(), train.width()), (256, TokenWidth::U16));
    assert_eq!(train.tokenizer().kind(), TokenizerKind::Bytes);
    assert_eq!(train.tokenizer().bytes_per_token(), Some(1.0));
    assert_eq!((train.info().split.as_str(), eval.info().split.as_str()), ("train", "eval"));
    // More records than one block holds: the stream is read across blocks in order.
    assert!(train.dataset().block_count() > 3, "{} blocks", train.dataset().block_count());
    let all: Vec<u32> = head.iter().chain(&tail).copied().collect();
    assert_eq!(train.tokenizer().decode(&all).unwrap(), text);
    // The eval split is the tail of the stream, byte for byte.
    let bytes = text.as_bytes();
    let split = report.train_tokens as usize;
    assert!(tail.iter().zip(&bytes[split..]).all(|(&t, &b)| t == u32::from(b)));
    assert_eq!(tail.len(), bytes.len() - split);
    // In memory at the stored width, the same.
    let tokens = eval.load().unwrap();
    assert_eq!((tokens.width(), tokens.to_vec()), (TokenWidth::U16, tail));

    // Bytes accepts any bytes, UTF-8 or not; no held-out split is an empty eval dataset.
    let binary = dir.write("binary.bin", &[0xff, 0x00, 0xfe, b'a', 0x80]);
    let out = dir.out();
    let report = import(&[binary], &out, TextTokenizer::Bytes, 0.0);
    assert_eq!((report.train_tokens, report.eval_tokens), (5, 0));
    let (_, head, eval, tail) = read_splits(&out);
    assert_eq!((head, tail.len(), eval.is_empty()), (vec![0xff, 0, 0xfe, 97, 0x80], 0, true));
}

#[test]
fn import_settings_and_inputs_that_cannot_work_are_refused_by_name() {
    let dir = TempDir::new("tokens-refused");
    let text = dir.write("t.txt", b"some text");
    let paths = [text.as_path()];
    let attempt = |options: TextOptions| {
        import_text(&paths, &dir.out(), &options, small_blocks()).unwrap_err().to_string()
    };
    let fraction = attempt(TextOptions { eval_fraction: 1.0, ..TextOptions::default() });
    assert!(fraction.contains("eval_fraction"), "{fraction}");
    let small = attempt(TextOptions {
        tokenizer: TextTokenizer::TrainBpe { vocab_size: 256 },
        ..TextOptions::default()
    });
    assert!(small.contains("bpe:256") && small.contains("257"), "{small}");
    let missing = attempt(TextOptions {
        tokenizer: TextTokenizer::File(dir.path("nope.json")),
        ..TextOptions::default()
    });
    assert!(missing.contains("nope.json"), "{missing}");
    let empty = dir.write("empty.txt", b"");
    let none = import_text(&[empty.as_path()], &dir.out(), &TextOptions::default(), small_blocks());
    assert!(none.unwrap_err().to_string().contains("hold no text"));

    // A BPE reads UTF-8: an invalid byte is named with its file and offset.
    let mut bytes = corpus(2, 5_000).into_bytes();
    bytes[3_000] = 0xff;
    let broken = dir.write("broken.txt", &bytes);
    let options = TextOptions { tokenizer: "bpe:300".parse().unwrap(), ..TextOptions::default() };
    let out = dir.out();
    let error = import_text(&[broken.as_path()], &out, &options, small_blocks()).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("broken.txt") && text.contains("corrupt at byte 3000"), "{text}");
    assert!(matches!(error, Error::Corrupt { offset: 3000, .. }));
    // Nothing is left: no split, no temporary file, not even the directory it made.
    assert!(!out.exists());
}

#[test]
fn one_repeated_byte_trains_a_bpe_of_bounded_words_and_the_import_reports_progress() {
    let dir = TempDir::new("tokens-run");
    // 300 KB of one byte was one 300 KB word: 29 s of merges, then one token for the whole.
    let bytes = 300_000;
    let file = dir.write("a.txt", &vec![b'a'; bytes]);
    let out = dir.out();
    let options = TextOptions { tokenizer: "bpe:512".parse().unwrap(), ..TextOptions::default() };
    let seen = std::sync::Mutex::new(Vec::new());
    let report =
        import_text_with_progress(&[file.as_path()], &out, &options, small_blocks(), &|p| {
            seen.lock().unwrap().push(p)
        })
        .unwrap();
    // No token spans more than 127 bytes.
    assert!(report.tokens >= (bytes / 127) as u64, "{} tokens", report.tokens);
    let (train, head, _, tail) = read_splits(&out);
    let all: Vec<u32> = head.iter().chain(&tail).copied().collect();
    assert_eq!(train.tokenizer().decode(&all).unwrap(), "a".repeat(bytes));

    // Progress: the stages in order, each counting up to its whole.
    let seen = seen.into_inner().unwrap();
    let stages: Vec<TextStage> = seen.iter().map(|p| p.stage).collect();
    assert!(stages.is_sorted(), "{stages:?}");
    for (stage, total) in [
        (TextStage::TrainBpe, bytes as u64),
        (TextStage::Encode, bytes as u64),
        (TextStage::Write, report.tokens),
    ] {
        let of: Vec<&TextProgress> = seen.iter().filter(|p| p.stage == stage).collect();
        assert!(!of.is_empty(), "no {stage:?} in {seen:?}");
        assert!(of.iter().all(|p| p.total == total && p.done <= total), "{of:?}");
        assert_eq!(of.iter().map(|p| p.done).max(), Some(total), "{of:?}");
    }

    // A text too short for the split whatever the vocabulary is refused before training.
    let tiny = dir.write("tiny.txt", b"a");
    let options = TextOptions { eval_fraction: 0.5, ..options };
    let seen = std::sync::Mutex::new(Vec::new());
    let error =
        import_text_with_progress(&[tiny.as_path()], &dir.out(), &options, small_blocks(), &|p| {
            seen.lock().unwrap().push(p)
        })
        .unwrap_err()
        .to_string();
    assert!(error.contains("at most 1 tokens") && error.contains("none of them"), "{error}");
    assert_eq!(seen.into_inner().unwrap(), []);
}

#[test]
fn text_is_imported_only_into_a_new_or_empty_directory() {
    let dir = TempDir::new("tokens-out");
    let text = dir.write("t.txt", corpus(5, 3_000).as_bytes());
    let files = [text.clone()];
    let attempt = |out: &Path| {
        import_text(&[text.as_path()], out, &TextOptions::default(), small_blocks())
            .unwrap_err()
            .to_string()
    };
    let names = |out: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    // Into a dataset: refused, and the dataset keeps its files alone.
    import(&files, &dir.path("first"), TextTokenizer::Bytes, 0.1);
    let dataset = dir.path("first/train");
    let before = names(&dataset);
    let error = attempt(&dataset);
    assert!(error.contains("first/train") && error.contains("is a dataset"), "{error}");
    assert_eq!(names(&dataset), before);
    assert!(Dataset::open(&dataset).unwrap().verify().is_empty());
    // Into a directory of someone's files: refused, naming one; the text itself may lie there.
    let beside = dir.path("beside");
    std::fs::create_dir(&beside).unwrap();
    let corpus = beside.join("corpus.txt");
    std::fs::copy(&text, &corpus).unwrap();
    import(&[corpus], &beside, TextTokenizer::Bytes, 0.1);
    assert_eq!(names(&beside), ["corpus.txt", "eval", "train"]);
    let busy = dir.path("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let error = attempt(&busy);
    assert!(error.contains("not empty") && error.contains("notes.txt"), "{error}");
    assert_eq!(names(&busy), ["notes.txt"]);
    // A file.
    let error = attempt(&text);
    assert!(error.contains("is a file"), "{error}");

    // A killed import's spill file is removed by the next import, not kept beside the splits.
    let again = dir.path("again");
    std::fs::create_dir(&again).unwrap();
    std::fs::write(again.join(".tokens.Xy12Zw.tmp"), [0u8; 64]).unwrap();
    import(&files, &again, "bpe:300".parse().unwrap(), 0.1);
    assert_eq!(names(&again), ["eval", "tokenizer.json", "train"]);
}

#[test]
fn bpe_trains_on_the_corpus_round_trips_and_packs_more_than_a_byte_per_token() {
    let dir = TempDir::new("tokens-bpe");
    let text = corpus(3, 120_000);
    // A file boundary inside a word ("caf" | "é"): a BPE's files are each valid UTF-8.
    let cut = text.find("café").unwrap() + 3;
    let files = vec![
        dir.write("one.txt", &text.as_bytes()[..cut]),
        dir.write("two.txt", &text.as_bytes()[cut..]),
    ];
    let out = dir.out();
    let report = import(&files, &out, "bpe:600".parse().unwrap(), 0.1);
    assert_eq!(report.tokenizer, TokenizerKind::Bpe);
    assert!(report.vocab_size > 256 && report.vocab_size <= 600, "{}", report.vocab_size);
    assert_eq!(report.width, TokenWidth::U16);
    assert!(report.bytes_per_token > 1.5, "{} bytes per token", report.bytes_per_token);
    assert_eq!(report.text_bytes, text.len() as u64);
    let (train, head, eval, tail) = read_splits(&out);
    assert_eq!(train.tokenizer().kind(), TokenizerKind::Bpe);
    assert_eq!(train.tokenizer().bytes_per_token(), Some(report.bytes_per_token));
    assert_eq!(eval.vocab_size(), report.vocab_size);
    assert_eq!(head.len() as u64, (report.tokens as f64 * 0.9) as u64);
    let all: Vec<u32> = head.iter().chain(&tail).copied().collect();
    assert_eq!(train.tokenizer().decode(&all).unwrap(), text);
    // Each file is encoded as the tokenizer encodes it whole.
    let tokenizer = train.tokenizer();
    let one = tokenizer.encode(&text[..cut]).unwrap();
    let two = tokenizer.encode(&text[cut..]).unwrap();
    assert_eq!([one, two].concat(), all);
    assert!(all.iter().all(|&t| (t as usize) < report.vocab_size));
    // The vocabulary is also next to the splits for other tools, the same tokenizer.
    let copy = report.tokenizer_json.unwrap();
    assert_eq!(copy, out.join("tokenizer.json"));
    let loaded = dp_data::Tokenizer::from_file(&copy).unwrap();
    assert_eq!(
        loaded.encode("the naïve café").unwrap(),
        tokenizer.encode("the naïve café").unwrap()
    );
}

#[test]
fn a_provided_tokenizer_json_is_used_as_it_is_and_a_large_one_stores_u32() {
    let dir = TempDir::new("tokens-provided");
    // A tokenizer.json written by a trained tokenizer.
    let trained = dir.out();
    let source = dir.write("train.txt", corpus(4, 40_000).as_bytes());
    let vocab = import(&[source], &trained, "bpe:400".parse().unwrap(), 0.1).vocab_size;
    let json_path = trained.join("tokenizer.json");
    let json = std::fs::read_to_string(&json_path).unwrap();

    // More than one piece of text (256 KiB each): the tokens are those of the whole file.
    let text = corpus(5, 600_000);
    let input = dir.write("other.txt", text.as_bytes());
    let out = dir.out();
    let report = import(&[input], &out, TextTokenizer::File(json_path), 0.2);
    assert_eq!((report.vocab_size, report.width), (vocab, TokenWidth::U16));
    let (train, head, _, tail) = read_splits(&out);
    let all: Vec<u32> = head.iter().chain(&tail).copied().collect();
    assert_eq!(train.tokenizer().encode(&text).unwrap(), all);
    assert_eq!(train.tokenizer().decode(&all).unwrap(), text);
    assert_eq!(tail.len() as u64, report.tokens - (report.tokens as f64 * 0.8) as u64);

    // The same model with 70,000 more (unused) vocabulary entries: ids no longer fit u16.
    let mut value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let vocab = value["model"]["vocab"].as_object_mut().unwrap();
    let base = vocab.len();
    for i in 0..70_000 {
        vocab.insert(format!("<extra_{i}>"), serde_json::Value::from(base + i));
    }
    let large = dir.write("large.json", value.to_string().as_bytes());
    let out = dir.out();
    let small = dir.write("small.txt", corpus(6, 20_000).as_bytes());
    let report = import(&[small], &out, TextTokenizer::File(large), 0.1);
    assert_eq!((report.vocab_size, report.width), (base + 70_000, TokenWidth::U32));
    let (train, head, eval, tail) = read_splits(&out);
    assert_eq!((train.width(), eval.width()), (TokenWidth::U32, TokenWidth::U32));
    let all: Vec<u32> = head.iter().chain(&tail).copied().collect();
    assert_eq!(train.tokenizer().decode(&all).unwrap(), corpus(6, 20_000));
    let tokens = train.load().unwrap();
    assert_eq!((tokens.width(), tokens.memory_bytes()), (TokenWidth::U32, 4 * head.len()));
}

#[test]
fn a_corrupt_block_or_another_kind_of_dataset_is_an_error_naming_it() {
    let dir = TempDir::new("tokens-corrupt");
    let out = dir.out();
    import(&[dir.write("t.txt", corpus(7, 60_000).as_bytes())], &out, TextTokenizer::Bytes, 0.1);
    let shard = out.join("train").join("shard-00000.dps");
    let mut bytes = std::fs::read(&shard).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&shard, &bytes).unwrap();
    let error = TokenDataset::open(&out.join("train")).and_then(|t| t.read_all()).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("shard-00000.dps") && text.contains("corrupt"), "{text}");

    let other = dir.out();
    let schema = Schema::new(vec![Feature::bytes("text")]).unwrap();
    let mut writer = DatasetWriter::create(&other, schema, WriterOptions::default()).unwrap();
    writer.append(&[Value::Bytes(b"hello")]).unwrap();
    writer.finish().unwrap();
    let error = TokenDataset::open(&other).unwrap_err().to_string();
    assert!(error.contains("is not a token dataset") && error.contains("text: bytes"), "{error}");
    assert!(Dataset::open(&other).is_ok());
}

// ---------------------------------------------------------------------------------------------
// The sampler, on streams whose token `i` is `i`, so that a window tells where it starts.

fn counting(n: u32) -> Arc<Tokens> {
    let tokens: Vec<u32> = (0..n).collect();
    Arc::new(Tokens::from_u32(&Pool::new(&Tracker::new()), &tokens).unwrap())
}

fn config(context: usize, batch: usize, seed: u64, rank: usize, ranks: usize) -> SequenceConfig {
    let mut config = SequenceConfig::new(context, batch);
    config.seed = seed;
    config.rank = rank;
    config.ranks = ranks;
    config
}

/// The first token of each window of the next `batches` batches (which must be full).
fn starts(sampler: &mut SequenceSampler, batches: u64) -> Vec<u32> {
    let context = sampler.config().context;
    let mut out = vec![0; sampler.batch_len()];
    let mut starts = Vec::new();
    for _ in 0..batches {
        let batch = sampler.next_batch(&mut out).unwrap();
        assert_eq!((batch.windows, batch.last_targets), (sampler.config().batch, context));
        for window in out.chunks_exact(context + 1) {
            // Contiguous: the targets are the inputs shifted by one.
            assert!(window.windows(2).all(|w| w[1] == w[0] + 1), "{window:?}");
            starts.push(window[0]);
        }
    }
    starts
}

#[test]
fn an_epoch_visits_its_windows_once_at_one_alignment_and_ranks_share_it_equally() {
    let (n, context, batch, ranks) = (10_007u32, 16usize, 4usize, 3usize);
    let tokens = counting(n);
    let mut samplers: Vec<SequenceSampler> = (0..ranks)
        .map(|r| {
            SequenceSampler::new(Arc::clone(&tokens), config(context, batch, 9, r, ranks)).unwrap()
        })
        .collect();
    let mut whole =
        SequenceSampler::new(Arc::clone(&tokens), config(context, batch * ranks, 9, 0, 1)).unwrap();
    let batches = samplers[0].batches_per_epoch();
    // The fewest windows any shift leaves, in whole global batches.
    assert_eq!(batches, ((n as u64 - context as u64) / context as u64) / (batch * ranks) as u64);
    assert!(samplers.iter().all(|s| s.batches_per_epoch() == batches));
    assert_eq!(whole.batches_per_epoch(), batches);
    let mut shifts = BTreeSet::new();
    for epoch in 0..4 {
        let per_rank: Vec<Vec<u32>> = samplers.iter_mut().map(|s| starts(s, batches)).collect();
        let global = starts(&mut whole, batches);
        // Rank r's batch b is the r-th slice of global batch b.
        for b in 0..batches as usize {
            let joined: Vec<u32> = per_rank
                .iter()
                .flat_map(|r| r[b * batch..(b + 1) * batch].iter().copied())
                .collect();
            assert_eq!(joined, global[b * batch * ranks..(b + 1) * batch * ranks]);
        }
        // Distinct windows at one alignment, all inside the stream.
        let shift = global[0] as usize % context;
        shifts.insert(shift);
        let set: BTreeSet<u32> = global.iter().copied().collect();
        assert_eq!(set.len(), global.len(), "epoch {epoch}: a window came twice");
        assert!(
            global
                .iter()
                .all(|&s| s as usize % context == shift && s as usize + context < n as usize)
        );
        // Fewer than one global batch (and the shift's spare window) left out.
        let available = (n as usize - 1 - shift) / context;
        assert!(available - global.len() <= batch * ranks, "epoch {epoch}");
        assert_eq!(samplers[0].state().epoch, epoch);
    }
    assert!(shifts.len() > 1, "every epoch at one alignment: {shifts:?}");
}

#[test]
fn the_order_is_a_function_of_seed_and_epoch_and_resuming_changes_nothing() {
    let tokens = counting(5_000);
    let make = |seed| SequenceSampler::new(Arc::clone(&tokens), config(8, 5, seed, 1, 2)).unwrap();
    let mut run = make(3);
    let batches = run.batches_per_epoch();
    let uninterrupted = starts(&mut run, 3 * batches);
    assert_eq!(starts(&mut make(3), 3 * batches), uninterrupted);
    let per_epoch = (batches * 5) as usize;
    let (epoch0, epoch1) = (&uninterrupted[..per_epoch], &uninterrupted[per_epoch..2 * per_epoch]);
    assert_ne!(epoch0, epoch1, "two epochs in one order");
    assert_ne!(starts(&mut make(4), batches), epoch0, "two seeds in one order");

    for k in [0, 1, 7, batches, batches + 3, 2 * batches] {
        let mut first = make(3);
        let _ = starts(&mut first, k);
        let saved = first.state().to_bytes();
        drop(first);
        let mut resumed = make(3);
        resumed.seek(SequenceState::from_bytes(&saved).unwrap()).unwrap();
        let rest = starts(&mut resumed, 3 * batches - k);
        assert_eq!(rest, uninterrupted[(k * 5) as usize..], "resumed after {k} batches");
    }
    // A state of another stream is refused.
    let state = make(3).state();
    let mut other = make(5);
    let error = other.seek(state).unwrap_err().to_string();
    assert!(error.contains("another stream"), "{error}");
}

#[test]
fn u16_and_u32_streams_give_the_same_windows() {
    let values: Vec<u16> = (0..20_000u32).map(|i| (i * 7 % 65_521) as u16).collect();
    let pool = Pool::new(&Tracker::new());
    let narrow = Arc::new(Tokens::from_u16(&pool, &values).unwrap());
    let wide: Vec<u32> = values.iter().map(|&v| u32::from(v)).collect();
    let wide = Arc::new(Tokens::from_u32(&pool, &wide).unwrap());
    let mut a = SequenceSampler::new(narrow, config(32, 3, 1, 0, 1)).unwrap();
    let mut b = SequenceSampler::new(wide, config(32, 3, 1, 0, 1)).unwrap();
    let (mut x, mut y) = (vec![0; a.batch_len()], vec![0; b.batch_len()]);
    for _ in 0..2 * a.batches_per_epoch() {
        assert_eq!(a.next_batch(&mut x).unwrap(), b.next_batch(&mut y).unwrap());
        assert_eq!(x, y);
    }
}

#[test]
fn evaluation_predicts_every_token_once_over_all_ranks() {
    let (n, context, batch, ranks) = (1_000u32, 16usize, 3usize, 2usize);
    let tokens = counting(n);
    let mut predicted = Vec::new();
    let mut batch_counts = BTreeSet::new();
    for rank in 0..ranks {
        let mut sampler = SequenceSampler::evaluation(
            Arc::clone(&tokens),
            config(context, batch, 0, rank, ranks),
        )
        .unwrap();
        batch_counts.insert(sampler.batches_per_epoch());
        assert_eq!(sampler.windows_per_epoch(), (n as u64 - 1).div_ceil(context as u64));
        let mut out = vec![0; sampler.batch_len()];
        for index in 0..sampler.batches_per_epoch() {
            let got = sampler.next_batch(&mut out).unwrap();
            assert_eq!((got.epoch, got.index), (0, index));
            for (j, window) in out.chunks_exact(context + 1).enumerate() {
                let targets = got.targets(j);
                if targets == 0 {
                    assert!(window.iter().all(|&t| t == 0), "a padding window holds tokens");
                    continue;
                }
                assert_eq!(window[0] as usize % context, 0, "unaligned evaluation window");
                assert!(window[..=targets].windows(2).all(|w| w[1] == w[0] + 1));
                assert!(window[targets + 1..].iter().all(|&t| t == 0));
                predicted.extend(window[1..=targets].iter().copied());
            }
        }
        // The pass repeats, unshuffled.
        let again = sampler.next_batch(&mut out).unwrap();
        assert_eq!((again.epoch, again.index), (1, 0));
    }
    assert_eq!(batch_counts.len(), 1, "ranks got different batch counts: {batch_counts:?}");
    predicted.sort_unstable();
    assert_eq!(predicted, (1..n).collect::<Vec<u32>>(), "every token but the first, once");
    // The last window is partial: (n - 1) % context targets.
    assert_ne!((n as usize - 1) % context, 0);
}

#[test]
fn batches_allocate_nothing() {
    let tokens = counting(4_000);
    let mut train = SequenceSampler::new(Arc::clone(&tokens), config(64, 4, 2, 0, 1)).unwrap();
    let mut eval = SequenceSampler::evaluation(tokens, config(64, 4, 0, 0, 1)).unwrap();
    let mut out = vec![0; train.batch_len()];
    let steps = 3 * train.batches_per_epoch() + 1; // across epoch boundaries
    let ((), counts) = CountingAlloc::measure(|| {
        for _ in 0..steps {
            train.next_batch(&mut out).unwrap();
            eval.next_batch(&mut out).unwrap();
        }
    })
    .unwrap();
    assert_eq!(counts.calls(), 0, "{counts:?} in {steps} batches");
}
