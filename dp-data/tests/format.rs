//! The dataset format end to end: round trips of every feature kind, shards, determinism,
//! atomicity, and what corrupt, truncated or mismatched files produce.

use std::fs;
use std::path::{Path, PathBuf};

use dp_data::{
    DType, Dataset, DatasetWriter, Error, Feature, MANIFEST_FILE, Schema, Value, WriterOptions,
};
use proptest::prelude::*;

/// A fresh directory for one test.
/// A path for one test's dataset, not created yet, inside a scratch directory that is removed
/// when the first value drops (also when the test fails).
fn temp_dir(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp =
        tempfile::Builder::new().prefix(&format!("dp-data-format-{name}-")).tempdir().unwrap();
    let dir = tmp.path().join("dataset");
    (tmp, dir)
}

fn schema() -> Schema {
    Schema::new(vec![
        Feature::dense("image", DType::U8, &[4, 3]),
        Feature::dense("label", DType::I64, &[]),
        Feature::dense("weight", DType::F32, &[2]),
        Feature::bytes("text"),
        Feature::sparse("tokens", DType::F32, &[1000]),
    ])
    .unwrap()
}

/// Record `i` of the test dataset, a pure function of `i`.
struct Rec {
    image: [u8; 12],
    label: i64,
    weight: [f32; 2],
    text: Vec<u8>,
    positions: Vec<u64>,
    values: Vec<f32>,
}

fn record(i: u64) -> Rec {
    let nnz = (i % 7) as usize;
    Rec {
        image: std::array::from_fn(|k| (i as usize * 31 + k * 7) as u8),
        label: (i % 10) as i64 - 3,
        weight: [i as f32 * 0.5, -(i as f32)],
        text: format!("record number {i}").repeat((i % 4) as usize).into_bytes(),
        positions: (0..nnz).map(|k| (k as u64) * 100 + i % 100).collect(),
        values: (0..nnz).map(|k| k as f32 + i as f32).collect(),
    }
}

/// Appends record `i`.
fn append(writer: &mut DatasetWriter, i: u64) {
    let r = record(i);
    writer
        .append(&[
            Value::dense(&r.image),
            Value::dense(&[r.label]),
            Value::dense(&r.weight),
            Value::Bytes(&r.text),
            Value::sparse(&r.positions, &r.values),
        ])
        .unwrap();
}

fn write(dir: &Path, records: u64, options: WriterOptions) -> dp_data::Manifest {
    let mut writer = DatasetWriter::create(dir, schema(), options).unwrap();
    for i in 0..records {
        append(&mut writer, i);
    }
    writer.finish().unwrap()
}

fn small_blocks(threads: usize) -> WriterOptions {
    let mut options = WriterOptions::default();
    options.block_size = 4 << 10;
    options.shard_size = 16 << 10;
    options.threads = threads;
    options
}

fn check_record(dataset: &Dataset, i: u64) {
    let r = record(i);
    let got = dataset.get(i).unwrap();
    assert_eq!(got.index(), i);
    let image: Vec<u8> = got.dense::<u8>("image").unwrap().iter().copied().collect();
    assert_eq!(image, r.image);
    assert_eq!(got.dense::<u8>("image").unwrap().shape(), &[4, 3]);
    assert_eq!(
        got.dense::<i64>("label").unwrap().iter().copied().collect::<Vec<_>>(),
        vec![r.label]
    );
    assert_eq!(got.dense::<f32>("weight").unwrap().iter().copied().collect::<Vec<_>>(), r.weight);
    assert_eq!(got.bytes("text").unwrap(), r.text.as_slice());
    let (positions, values) = got.sparse::<f32>("tokens").unwrap();
    assert_eq!((positions, values), (r.positions.as_slice(), r.values.as_slice()));
}

#[test]
fn every_feature_kind_round_trips_across_blocks_and_shards() {
    let (_dir_tmp, dir) = temp_dir("round-trip");
    let manifest = write(&dir, 3000, small_blocks(2));
    assert!(manifest.shards.len() > 2, "{} shards", manifest.shards.len());
    let dataset = Dataset::open(&dir).unwrap();
    assert_eq!(dataset.len(), 3000);
    assert!(dataset.block_count() > manifest.shards.len());
    for i in (0..3000).step_by(7).chain([0, 2999]) {
        check_record(&dataset, i);
    }
    // Sequential iteration sees every record once, in order, with column-wise dense data.
    let mut next = 0;
    for block in dataset.blocks() {
        let block = block.unwrap();
        assert_eq!(block.first_record(), next);
        let labels = block.dense::<i64>("label").unwrap();
        assert_eq!(labels.shape(), &[block.len()]);
        for (row, &label) in labels.iter().enumerate() {
            assert_eq!(label, record(next + row as u64).label);
        }
        let images = block.dense::<u8>("image").unwrap();
        assert_eq!(images.shape(), &[block.len(), 4, 3]);
        next += block.len() as u64;
    }
    assert_eq!(next, 3000);
    assert!(dataset.verify().is_empty());
}

#[test]
fn bytes_do_not_depend_on_the_thread_count() {
    let ((_a_tmp, a), (_b_tmp, b)) = (temp_dir("threads-1"), temp_dir("threads-3"));
    let ma = write(&a, 2000, small_blocks(1));
    let mb = write(&b, 2000, small_blocks(3));
    assert_eq!(ma, mb);
    for shard in &ma.shards {
        assert_eq!(fs::read(a.join(&shard.file)).unwrap(), fs::read(b.join(&shard.file)).unwrap());
    }
    assert_eq!(fs::read(a.join(MANIFEST_FILE)).unwrap(), fs::read(b.join(MANIFEST_FILE)).unwrap());
}

#[test]
fn records_that_do_not_match_the_schema_are_refused_by_name() {
    let (_dir_tmp, dir) = temp_dir("bad-records");
    let mut writer = DatasetWriter::create(&dir, schema(), WriterOptions::default()).unwrap();
    let r = record(0);
    let err = writer
        .append(&[
            Value::dense(&[1u8; 11]),
            Value::dense(&[r.label]),
            Value::dense(&r.weight),
            Value::Bytes(&r.text),
            Value::sparse(&r.positions, &r.values),
        ])
        .unwrap_err();
    assert!(
        matches!(&err, Error::Record { record: 0, feature, .. } if feature == "image"),
        "{err}"
    );
    let err = writer
        .append(&[
            Value::dense(&r.image),
            Value::dense(&[r.label]),
            Value::dense(&r.weight),
            Value::Bytes(&r.text),
            Value::sparse(&[5, 3], &[1.0f32, 2.0]),
        ])
        .unwrap_err();
    assert!(err.to_string().contains("strictly increasing"), "{err}");
    let err = writer
        .append(&[
            Value::dense(&r.image),
            Value::dense(&[r.label]),
            Value::dense(&r.weight),
            Value::Bytes(&r.text),
            Value::sparse(&[1000], &[1.0f32]),
        ])
        .unwrap_err();
    assert!(err.to_string().contains("outside"), "{err}");
    assert!(writer.append(&[Value::dense(&r.image)]).is_err());
    assert_eq!(writer.records(), 0);
    drop(writer);
    assert!(!dir.exists(), "a writer that did not finish left its directory");
}

/// The entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `dir` with `.partial` appended: where a dataset bound for `dir` is written.
fn partial(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap().to_os_string();
    name.push(".partial");
    dir.with_file_name(name)
}

#[test]
fn an_unfinished_writer_leaves_no_dataset() {
    let (_dir_tmp, dir) = temp_dir("unfinished");
    let mut writer = DatasetWriter::create(&dir, schema(), small_blocks(2)).unwrap();
    for i in 0..500 {
        append(&mut writer, i);
    }
    // It writes its shards next to the target, which does not exist until `finish` (each
    // under a temporary name, `.shard-NNNNN.dps.XXXXXX.tmp`, until it is whole).
    assert!(
        entries(&partial(&dir)).iter().any(|n| n.starts_with("shard-") || n.starts_with(".shard-"))
    );
    assert!(!dir.exists());
    drop(writer);
    assert!(!dir.exists() && !partial(&dir).exists(), "an unfinished writer left files");
    // An empty directory is taken, and holds the dataset and nothing else.
    fs::create_dir_all(&dir).unwrap();
    let manifest = write(&dir, 500, small_blocks(2));
    let mut expected: Vec<String> = manifest.shards.iter().map(|s| s.file.clone()).collect();
    expected.push(MANIFEST_FILE.into());
    expected.sort();
    assert_eq!(entries(&dir), expected);
    assert!(!partial(&dir).exists());
    // A finished dataset is not overwritten by accident.
    assert!(matches!(
        DatasetWriter::create(&dir, schema(), WriterOptions::default()),
        Err(Error::Config { field: "out", .. })
    ));
}

#[test]
fn a_path_holding_anything_of_the_users_is_refused_by_name_and_left_alone() {
    let (tmp, dir) = temp_dir("foreign");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("notes.txt"), b"mine").unwrap();
    fs::write(dir.join("shard-00000.dps"), b"not a shard, but named like one").unwrap();
    fs::create_dir(dir.join("photos")).unwrap();
    let error = DatasetWriter::create(&dir, schema(), small_blocks(1)).unwrap_err().to_string();
    assert!(
        error.contains(&format!("{} is a directory that is not a dataset", dir.display()))
            && error.contains("it holds `notes.txt` and 1 other entry"),
        "{error}"
    );
    assert_eq!(entries(&dir), ["notes.txt", "photos", "shard-00000.dps"]);
    assert!(!partial(&dir).exists());

    let file = tmp.path().join("file");
    fs::write(&file, b"mine").unwrap();
    let error = DatasetWriter::create(&file, schema(), small_blocks(1)).unwrap_err().to_string();
    assert!(error.contains(&format!("{} is a file", file.display())), "{error}");
    assert_eq!(fs::read(&file).unwrap(), b"mine");

    // A directory of the user's where the writer would stage the dataset is not removed.
    let staged = tmp.path().join("staged");
    fs::create_dir_all(partial(&staged)).unwrap();
    fs::write(partial(&staged).join("keep"), b"mine").unwrap();
    let error = DatasetWriter::create(&staged, schema(), small_blocks(1)).unwrap_err().to_string();
    assert!(error.contains("is in the way") && error.contains("staged.partial"), "{error}");
    assert_eq!(entries(&partial(&staged)), ["keep"]);
}

#[test]
fn two_writers_to_one_path_at_once_are_refused() {
    let (_tmp, dir) = temp_dir("busy");
    let mut first = DatasetWriter::create(&dir, schema(), small_blocks(1)).unwrap();
    append(&mut first, 0);
    let error = DatasetWriter::create(&dir, schema(), small_blocks(1)).unwrap_err().to_string();
    assert!(error.contains(&format!("another writer is writing {}", dir.display())), "{error}");
    // The first one was not disturbed.
    first.finish().unwrap();
    check_record(&Dataset::open(&dir).unwrap(), 0);
}

#[test]
fn a_write_that_never_finished_in_place_is_replaced_and_its_shards_are_reported() {
    // What a writer that wrote in its target directory and was killed left there: shards
    // and no manifest.
    let (_tmp, dir) = temp_dir("leftovers");
    let killed = write(&dir, 4000, small_blocks(1));
    assert!(killed.shards.len() > 3, "the case needs several shards");
    fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
    // The temporary files of a manifest and a shard being written, as writers name them, and
    // as writers before them did.
    fs::write(dir.join(".manifest.json.Ab12Cd.tmp"), b"{").unwrap();
    fs::write(dir.join(".shard-00009.dps.xY34zW.tmp"), b"DPS").unwrap();
    fs::write(dir.join("manifest.json.tmp"), b"{").unwrap();

    let manifest = write(&dir, 40, small_blocks(1));
    assert_eq!(manifest.shards.len(), 1);
    assert_eq!(entries(&dir), [MANIFEST_FILE, "shard-00000.dps"]);
    let dataset = Dataset::open(&dir).unwrap();
    assert!(dataset.verify().is_empty());
    assert_eq!(dataset.len(), 40);

    // A shard the manifest does not name (as a killed import's next to a finished one's)
    // makes `verify` fail, naming it.
    fs::write(dir.join("shard-00007.dps"), b"orphan").unwrap();
    fs::write(dir.join("notes.txt"), b"mine").unwrap();
    let problems: Vec<String> = dataset.verify().iter().map(ToString::to_string).collect();
    let orphan = dir.join("shard-00007.dps");
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[1].starts_with(&format!("{}: not part of the dataset", orphan.display())));
    assert!(problems[0].contains("notes.txt: not part of the dataset"), "{problems:?}");
}

#[test]
fn absurd_options_are_refused() {
    let (_dir_tmp, dir) = temp_dir("options");
    for change in [
        |o: &mut WriterOptions| o.block_size = 10,
        |o: &mut WriterOptions| o.block_size = 1 << 40,
        |o: &mut WriterOptions| o.shard_size = 1,
        |o: &mut WriterOptions| o.level = 99,
        |o: &mut WriterOptions| o.threads = 0,
    ] {
        let mut options = WriterOptions::default();
        change(&mut options);
        assert!(matches!(
            DatasetWriter::create(&dir, schema(), options),
            Err(Error::Config { .. })
        ));
    }
}

/// Writes a small dataset and returns its directory and first shard's path.
fn one_shard(name: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let (tmp, dir) = temp_dir(name);
    let mut options = small_blocks(1);
    options.shard_size = 1 << 30;
    let manifest = write(&dir, 400, options);
    assert_eq!(manifest.shards.len(), 1);
    let shard = dir.join(&manifest.shards[0].file);
    (tmp, dir, shard)
}

#[test]
fn a_flipped_byte_in_a_block_is_found_and_located() {
    let (_tmp, dir, shard) = one_shard("flip");
    let mut bytes = fs::read(&shard).unwrap();
    let at = 200;
    bytes[at] ^= 0x40;
    fs::write(&shard, &bytes).unwrap();
    let dataset = Dataset::open(&dir).unwrap();
    let problems = dataset.verify();
    assert!(!problems.is_empty());
    let text = problems.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n");
    assert!(text.contains("shard-00000.dps"), "{text}");
    assert!(text.contains("checksum mismatch"), "{text}");
    assert!(dataset.get(0).is_err(), "the first block is corrupt");
}

#[test]
fn truncated_and_foreign_shards_are_refused_at_open() {
    let (_tmp, dir, shard) = one_shard("truncate");
    let bytes = fs::read(&shard).unwrap();
    // Truncation: the manifest's size no longer matches.
    fs::write(&shard, &bytes[..bytes.len() - 10]).unwrap();
    assert!(matches!(Dataset::open(&dir), Err(Error::Incomplete { .. })));
    // Wrong magic, same size.
    let mut wrong = bytes.clone();
    wrong[0] = b'X';
    fs::write(&shard, &wrong).unwrap();
    let err = Dataset::open(&dir).unwrap_err();
    assert!(matches!(&err, Error::Corrupt { offset: 0, .. }), "{err}");
    // A lying trailer.
    let mut lying = bytes.clone();
    let n = lying.len();
    lying[n - 40] ^= 1; // block count
    fs::write(&shard, &lying).unwrap();
    assert!(matches!(Dataset::open(&dir), Err(Error::Corrupt { .. })));
    fs::write(&shard, &bytes).unwrap();
    assert!(Dataset::open(&dir).is_ok());
}

#[test]
fn a_shard_from_another_schema_is_refused() {
    let (_tmp, dir, shard) = one_shard("foreign");
    let (_other_tmp, other) = temp_dir("foreign-other");
    let other_schema = Schema::new(vec![Feature::dense("x", DType::F32, &[3])]).unwrap();
    let mut writer = DatasetWriter::create(&other, other_schema, small_blocks(1)).unwrap();
    for _ in 0..400 {
        writer.append(&[Value::dense(&[1.0f32, 2.0, 3.0])]).unwrap();
    }
    let m = writer.finish().unwrap();
    fs::copy(other.join(&m.shards[0].file), &shard).unwrap();
    let err = Dataset::open(&dir).unwrap_err();
    assert!(err.to_string().contains("shard-00000.dps"), "{err}");
}

#[test]
fn missing_or_garbled_manifests_are_errors() {
    let (_tmp, dir, _) = one_shard("manifest");
    let manifest = dir.join(MANIFEST_FILE);
    let text = fs::read_to_string(&manifest).unwrap();
    // The total no longer matches the shards' sum.
    fs::write(&manifest, text.replacen("\"records\": 400", "\"records\": 401", 1)).unwrap();
    assert!(matches!(Dataset::open(&dir), Err(Error::Corrupt { .. })));
    // Total and shard agree with each other but not with the shard file: stale.
    fs::write(&manifest, text.replace("\"records\": 400", "\"records\": 401")).unwrap();
    assert!(matches!(Dataset::open(&dir), Err(Error::Incomplete { .. })));
    fs::write(&manifest, "{ not json").unwrap();
    assert!(matches!(Dataset::open(&dir), Err(Error::Corrupt { .. })));
    fs::write(&manifest, text.replace("shard-00000.dps", "shard-00000.dps.tmp")).unwrap();
    assert!(matches!(Dataset::open(&dir), Err(Error::Corrupt { .. })));
    fs::write(&manifest, text.replace("\"raw_bytes\": ", "\"raw_bytes\": 1")).unwrap();
    assert!(matches!(Dataset::open(&dir), Err(Error::Incomplete { .. })));
    fs::write(&manifest, text.replace("shard-00000.dps", "../etc/passwd")).unwrap();
    assert!(matches!(Dataset::open(&dir), Err(Error::Corrupt { .. })));
    fs::remove_file(&manifest).unwrap();
    assert!(matches!(Dataset::open(&dir), Err(Error::Incomplete { .. })));
}

#[test]
fn out_of_range_and_wrongly_typed_access_are_errors() {
    let (_tmp, dir, _) = one_shard("access");
    let dataset = Dataset::open(&dir).unwrap();
    assert!(matches!(dataset.get(400), Err(Error::OutOfRange { index: 400, len: 400 })));
    let record = dataset.get(3).unwrap();
    assert!(matches!(record.dense::<f32>("image"), Err(Error::Access { .. })));
    assert!(matches!(record.dense::<u8>("nope"), Err(Error::Access { .. })));
    assert!(matches!(record.bytes("image"), Err(Error::Access { .. })));
    assert!(matches!(record.sparse::<f32>("text"), Err(Error::Access { .. })));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random damage to a shard (flipped bytes, truncation) never panics: opening and reading
    /// every record either works or returns an error.
    #[test]
    fn damaged_shards_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let (_tmp, dir, shard) = one_shard(&format!("fuzz-{}", std::thread::current().name().unwrap_or("t").replace("::", "-")));
        let mut bytes = fs::read(&shard).unwrap();
        fs::write(dir.join("original"), &bytes).unwrap();
        for (at, mask) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= mask;
        }
        if let Some(cut) = cut {
            let keep = cut.index(bytes.len());
            bytes.truncate(keep);
        }
        fs::write(&shard, &bytes).unwrap();
        if let Ok(dataset) = Dataset::open(&dir) {
            // Where reading a record met damage: the offsets its errors name.
            let mut damaged = std::collections::BTreeSet::new();
            for i in 0..dataset.len() {
                match dataset.get(i) {
                    Ok(record) => {
                        let _ = record.bytes("text");
                        let _ = record.sparse::<f32>("tokens");
                    }
                    Err(dp_data::Error::Corrupt { offset, .. }) => {
                        damaged.insert(offset);
                    }
                    Err(_) => {}
                }
            }
            // verify reports every damaged block a read met, at the same offset, and finds
            // damage anywhere (the whole file's CRC32C).
            let found: std::collections::BTreeSet<u64> = dataset
                .verify()
                .iter()
                .filter_map(|e| match e {
                    dp_data::Error::Corrupt { offset, .. } => Some(*offset),
                    _ => None,
                })
                .collect();
            prop_assert!(damaged.is_subset(&found), "read {damaged:?}, verify {found:?}");
            let original = fs::read(dir.join("original")).unwrap();
            prop_assert_eq!(bytes != original, !found.is_empty());
        }
    }
}

/// A dataset of 64 records of 4 KiB of noise seeded by `seed`: blocks that do not compress,
/// so every shard of 8 records has the same size.
fn noise(dir: &Path, seed: u64) {
    let schema = Schema::new(vec![Feature::dense("noise", DType::U8, &[4096])]).unwrap();
    let mut options = WriterOptions::default();
    options.block_size = 4 << 10;
    options.shard_size = 8 * (4 << 10);
    options.threads = 1;
    let mut writer = DatasetWriter::create(dir, schema, options).unwrap();
    let mut rng = dp_data::Rng::new(seed);
    for _ in 0..64 {
        let record: Vec<u8> = (0..4096).map(|_| rng.next_u64() as u8).collect();
        writer.append(&[Value::dense(&record)]).unwrap();
    }
    writer.finish().unwrap();
}

#[test]
fn a_shard_in_another_shards_place_is_refused_at_open() {
    let ((_dir_tmp, dir), (_other_tmp, other)) = (temp_dir("bound"), temp_dir("bound-other"));
    noise(&dir, 1);
    noise(&other, 2);
    let shard = |d: &Path, i: usize| d.join(format!("shard-{i:05}.dps"));
    let size = |p: PathBuf| fs::metadata(p).unwrap().len();
    assert!(Dataset::open(&dir).is_ok());
    assert_eq!(size(shard(&dir, 0)), size(shard(&dir, 1)), "the case needs shards of one size");
    assert_eq!(size(shard(&dir, 0)), size(shard(&other, 0)));
    let original = fs::read(shard(&dir, 0)).unwrap();

    // Two shards of the dataset swapped.
    let second = fs::read(shard(&dir, 1)).unwrap();
    fs::write(shard(&dir, 0), &second).unwrap();
    fs::write(shard(&dir, 1), &original).unwrap();
    let error = Dataset::open(&dir).unwrap_err().to_string();
    assert!(error.contains("shard-00000.dps") && error.contains("another shard"), "{error}");
    fs::write(shard(&dir, 1), &second).unwrap();

    // A shard of another dataset of the same size.
    fs::copy(shard(&other, 0), shard(&dir, 0)).unwrap();
    let error = Dataset::open(&dir).unwrap_err().to_string();
    assert!(error.contains("shard-00000.dps") && error.contains("another shard"), "{error}");

    fs::write(shard(&dir, 0), &original).unwrap();
    assert!(Dataset::open(&dir).unwrap().verify().is_empty());
}
