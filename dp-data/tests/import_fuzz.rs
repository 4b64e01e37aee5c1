//! Fuzzing every importer's parser through the public API: valid files with random bytes
//! changed, cut off or appended must import or fail with an error naming the input file and an
//! offset inside it, never panic, and never allocate more than the file could justify. The
//! regression tests at the end pin the absurd sizes and lying length fields found or feared.

#[path = "support/temp_dir.rs"]
#[allow(dead_code)]
mod temp_dir;

use temp_dir::{TempDir, gzip, hex};

#[path = "support/numpy_fixtures.rs"]
mod numpy_fixtures;

use numpy_fixtures::{NUMPY_I32, NUMPY_U8};

#[path = "support/tfrecord.rs"]
#[allow(dead_code)]
mod tfrecord;

use tfrecord::{List, frame, masked_crc};

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};

use dp_data::{
    CsvOptions, Dataset, Error, Manifest, TfRecordCompression, WriterOptions, import_csv,
    import_idx, import_npy, import_tfrecord,
};
use proptest::prelude::*;

/// The system allocator, noting the largest single request each thread makes.
struct Largest;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: an allocation while the thread's locals are torn down is just not noted.
    let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
}

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; noting a size touches only a const-initialized thread-local `Cell`,
// which never allocates.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's guarantees for `layout` are passed on to `System`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through this wrapper) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` was allocated by `System` with `layout`; the caller guarantees
        // `new_size` is valid for it.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Largest = Largest;

/// Runs `f` and returns the largest single allocation the calling thread made meanwhile.
fn largest_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|l| l.set(0));
    let result = f();
    (result, LARGEST.with(Cell::get))
}

/// What an importer may allocate regardless of its input: the writer's 4 KiB blocks, buffers,
/// thread stacks and the like, well under this.
const FIXED_ALLOWANCE: usize = 4 << 20;

/// The most a deflate stream can expand.
const GZIP_RATIO: usize = 1032;

fn options() -> WriterOptions {
    let mut options = WriterOptions::default();
    options.block_size = 4096;
    // Compression on the calling thread, so the allocation watch sees the writer too.
    options.threads = 1;
    options
}

/// Random damage to a valid file: bytes overwritten, bits flipped, a cut, bytes appended.
#[derive(Debug, Clone)]
struct Damage {
    writes: Vec<(usize, u8)>,
    flips: Vec<(usize, u8)>,
    cut: Option<usize>,
    append: Vec<u8>,
}

fn damage() -> impl Strategy<Value = Damage> {
    (
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        proptest::collection::vec((any::<usize>(), 0u8..8), 0..4),
        proptest::option::weighted(0.3, any::<usize>()),
        proptest::collection::vec(any::<u8>(), 0..3),
    )
        .prop_map(|(writes, flips, cut, append)| Damage { writes, flips, cut, append })
}

impl Damage {
    fn apply(&self, mut bytes: Vec<u8>) -> Vec<u8> {
        if !bytes.is_empty() {
            let n = bytes.len();
            for &(at, byte) in &self.writes {
                bytes[at % n] = byte;
            }
            for &(at, bit) in &self.flips {
                bytes[at % n] ^= 1 << bit;
            }
        }
        if let Some(cut) = self.cut {
            bytes.truncate(cut % (bytes.len() + 1));
        }
        bytes.extend_from_slice(&self.append);
        bytes
    }
}

/// Checks one importer run on damaged `inputs` (path, length on disk, gzip-compressed):
/// success opens as a dataset of the reported size; failure is a `Corrupt` naming one of the
/// inputs at an offset it can hold, or a schema/option error that damaged names cause; and no
/// single allocation exceeded what the inputs justify.
fn check(
    result: dp_data::Result<Manifest>,
    largest: usize,
    inputs: &[(PathBuf, usize, bool)],
    out: &Path,
) -> std::result::Result<(), TestCaseError> {
    let justified = inputs
        .iter()
        .map(|&(_, len, gz)| if gz { len * GZIP_RATIO } else { len })
        .sum::<usize>()
        .saturating_mul(2)
        .max(FIXED_ALLOWANCE);
    prop_assert!(largest <= justified, "allocated {} bytes for inputs of {:?}", largest, inputs);
    match result {
        Ok(manifest) => {
            let dataset = Dataset::open(out);
            prop_assert!(dataset.is_ok(), "{:?}", dataset.err());
            prop_assert_eq!(dataset.map(|d| d.len()).unwrap_or(0), manifest.records);
        }
        Err(Error::Corrupt { path, offset, what }) => {
            let input = inputs.iter().find(|(p, _, _)| *p == path);
            prop_assert!(input.is_some(), "error names {:?}, not an input", path);
            let (_, len, gz) = input.cloned().unwrap_or_default();
            let bound = if gz { len * GZIP_RATIO } else { len };
            prop_assert!(offset as usize <= bound, "offset {} past {} ({})", offset, bound, what);
            prop_assert!(!what.is_empty());
            prop_assert!(Dataset::open(out).is_err(), "a failed import left a dataset");
        }
        Err(Error::Schema(_) | Error::Config { .. }) => {}
        // Damaged floats may read as NaN: a clean refusal that leaves nothing behind.
        Err(Error::NonFinite { .. }) => {
            prop_assert!(!out.exists(), "a refused import left {}", out.display());
        }
        Err(other) => prop_assert!(false, "unexpected error: {}", other),
    }
    let _ = std::fs::remove_dir_all(out);
    Ok(())
}

/// 256 cases per importer, or `PROPTEST_CASES` for a longer hunt.
fn config() -> ProptestConfig {
    let base = ProptestConfig::default();
    let cases = if std::env::var_os("PROPTEST_CASES").is_some() { base.cases } else { 256 };
    ProptestConfig { cases, ..base }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn damaged_npy_files_fail_cleanly(damage in damage(), which in 0usize..2) {
        let tmp = TempDir::new("npy");
        let mut files = [hex(NUMPY_U8), hex(NUMPY_I32)];
        files[which] = damage.apply(files[which].clone());
        let a = tmp.write("a.npy", &files[0]);
        let b = tmp.write("b.npy", &files[1]);
        let out = tmp.out();
        let features = [("a".to_string(), a.clone()), ("b".to_string(), b.clone())];
        let (result, largest) = largest_during(|| import_npy(&features, &out, true, options()));
        check(result, largest, &[(a, files[0].len(), false), (b, files[1].len(), false)], &out)?;
    }

    #[test]
    fn damaged_idx_files_fail_cleanly(
        damage in damage(),
        which in 0usize..2,
        gz in any::<bool>(),
        inside in any::<bool>(),
    ) {
        let tmp = TempDir::new("idx");
        let images: Vec<u8> = (0..30u8).collect();
        let mut files = [
            [&[0u8, 0, 8, 3, 0, 0, 0, 5, 0, 0, 0, 3, 0, 0, 0, 2][..], &images].concat(),
            vec![0, 0, 8, 1, 0, 0, 0, 5, 1, 2, 3, 4, 5],
        ];
        // Damage inside the compressed stream reaches the parser; damage to the compressed
        // bytes tests the decompressor's error path.
        if gz && inside {
            files[which] = damage.apply(files[which].clone());
        }
        if gz {
            files = files.map(|f| gzip(&f));
        }
        if !(gz && inside) {
            files[which] = damage.apply(files[which].clone());
        }
        let a = tmp.write("images", &files[0]);
        let b = tmp.write("labels", &files[1]);
        let out = tmp.out();
        let (result, largest) = largest_during(|| import_idx(&a, Some(&b), &out, options()));
        check(result, largest, &[(a, files[0].len(), gz), (b, files[1].len(), gz)], &out)?;
    }

    #[test]
    fn damaged_csv_files_fail_cleanly(
        damage in damage(),
        gz in any::<bool>(),
        inside in any::<bool>(),
        all in any::<bool>(),
    ) {
        let tmp = TempDir::new("csv");
        let text = b"id,x,y,label\nr0,1.5,-2,3\n\"r1\",2.5,\"-3\",0\nr2,1e3,nan,9\n".to_vec();
        let file = match (gz, inside) {
            (true, true) => gzip(&damage.apply(text)),
            (true, false) => damage.apply(gzip(&text)),
            (false, _) => damage.apply(text),
        };
        let path = tmp.write("data.csv", &file);
        let out = tmp.out();
        let csv = CsvOptions {
            label: Some("label".into()),
            columns: if all { None } else { Some(vec!["x".into(), "y".into()]) },
            ..CsvOptions::default()
        };
        // The fixture's `nan` is kept, so that undamaged files import.
        let mut options = options();
        options.allow_nonfinite = true;
        let (result, largest) = largest_during(|| import_csv(&path, &out, &csv, options.clone()));
        check(result, largest, &[(path, file.len(), gz)], &out)?;
    }

    #[test]
    fn damaged_tfrecord_files_fail_cleanly(
        damage in damage(),
        gz in any::<bool>(),
        auto in any::<bool>(),
        inside in 0usize..3,
    ) {
        let tmp = TempDir::new("tfrecord");
        // Damage to one Example before it is framed reaches the protobuf parser past the CRCs;
        // damage to the framed stream before compression tests the framing.
        let mut examples: Vec<Vec<u8>> = (0..4).map(example).collect();
        if inside == 0 {
            examples[1] = damage.apply(examples[1].clone());
        }
        let mut records: Vec<u8> = examples.iter().flat_map(|e| frame(e)).collect();
        if inside == 1 {
            records = damage.apply(records);
        }
        let mut file = if gz { gzip(&records) } else { records };
        if inside == 2 {
            file = damage.apply(file);
        }
        let path = tmp.write("data.tfrecord", &file);
        let out = tmp.out();
        let compression = match (auto, gz) {
            (true, _) => TfRecordCompression::Auto,
            (false, true) => TfRecordCompression::Gzip,
            (false, false) => TfRecordCompression::None,
        };
        let paths = [path.clone()];
        let (result, largest) = largest_during(|| import_tfrecord(&paths, &out, &tf(compression), options()));
        check(result, largest, &[(path, file.len(), gz)], &out)?;
    }
}

/// An Example with an int64 pair, a float triple and one byte string.
fn example(i: u8) -> Vec<u8> {
    tfrecord::example(&[
        ("ints", List::Ints(&[i64::from(i), 0x7f], true)),
        ("floats", List::Floats(&[f32::from(i), 0.5, -1.0], true)),
        ("image/raw", List::Bytes(&[b'x', i])),
    ])
}

#[test]
fn the_allocation_watch_sees_large_allocations() {
    let (buffer, largest) = largest_during(|| vec![1u8; FIXED_ALLOWANCE + 1]);
    assert!(largest > FIXED_ALLOWANCE);
    assert_eq!(buffer.len(), FIXED_ALLOWANCE + 1);
}

// Regression tests: lying sizes must fail fast, before any large allocation.

fn npy_with_dict(dict: &str, version: u8, data: usize) -> Vec<u8> {
    let mut file = b"\x93NUMPY".to_vec();
    file.extend_from_slice(&[version, 0]);
    if version == 1 {
        file.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    } else {
        file.extend_from_slice(&(dict.len() as u32).to_le_bytes());
    }
    file.extend_from_slice(dict.as_bytes());
    file.resize(file.len() + data, 0);
    file
}

fn expect_corrupt(result: dp_data::Result<Manifest>, largest: usize, path: &Path) -> (u64, String) {
    assert!(largest <= FIXED_ALLOWANCE, "allocated {largest} bytes");
    match result {
        Err(Error::Corrupt { path: p, offset, what }) => {
            assert_eq!(p, path);
            (offset, what)
        }
        other => panic!("expected a Corrupt error, got {other:?}"),
    }
}

#[test]
fn regression_npy_absurd_shapes_and_header_lengths() {
    let tmp = TempDir::new("npy-absurd");
    let cases = [
        npy_with_dict("{'descr': '<i8', 'fortran_order': False, 'shape': (1099511627776,)}", 1, 64),
        npy_with_dict("{'descr': '|u1', 'fortran_order': False, 'shape': (3, 1073741824)}", 1, 3),
        npy_with_dict(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (18446744073709551615, 2)}",
            3,
            16,
        ),
        {
            let mut file = b"\x93NUMPY\x02\x00\xff\xff\xff\xff".to_vec();
            file.resize(100, b' ');
            file
        },
    ];
    for (i, file) in cases.into_iter().enumerate() {
        let path = tmp.write(&format!("{i}.npy"), &file);
        let out = tmp.out();
        let (result, largest) =
            largest_during(|| import_npy(&[("a".into(), path.clone())], &out, false, options()));
        expect_corrupt(result, largest, &path);
        assert!(!out.exists());
    }
}

#[test]
fn regression_zero_byte_records_are_refused_not_looped_over() {
    let tmp = TempDir::new("zero-records");
    let npy = tmp.write(
        "z.npy",
        &npy_with_dict(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1152921504606846976, 0)}",
            1,
            0,
        ),
    );
    let (_, what) = expect_corrupt(
        import_npy(&[("a".into(), npy.clone())], &tmp.out(), false, options()),
        0,
        &npy,
    );
    assert!(what.contains("zero bytes"), "{what}");
    let idx = tmp.write("z.idx", &[0, 0, 8, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    let (_, what) = expect_corrupt(import_idx(&idx, None, &tmp.out(), options()), 0, &idx);
    assert!(what.contains("zero bytes"), "{what}");
}

#[test]
fn regression_idx_and_gzip_sizes_that_lie() {
    let tmp = TempDir::new("idx-absurd");
    let huge = [0u8, 0, 0x0e, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1];
    let path = tmp.write("huge", &huge);
    let (result, largest) = largest_during(|| import_idx(&path, None, &tmp.out(), options()));
    expect_corrupt(result, largest, &path);
    // A gzip file of a few dozen bytes cannot hold a gigabyte of images, however it claims to.
    let lying = gzip(&[0, 0, 8, 3, 0, 0, 0x40, 0, 0, 0, 0x40, 0, 0, 0, 0x40, 0, 1, 2, 3]);
    let path = tmp.write("lying.gz", &lying);
    let (result, largest) = largest_during(|| import_idx(&path, None, &tmp.out(), options()));
    let (offset, what) = expect_corrupt(result, largest, &path);
    assert_eq!(offset, 4);
    assert!(what.contains("compressed"), "{what}");
    // A plausible size in a gzip file that then ends early.
    let short = gzip(&[0, 0, 8, 2, 0, 0, 0, 100, 0, 0, 0, 10, 1, 2, 3]);
    let path = tmp.write("short.gz", &short);
    let (result, largest) = largest_during(|| import_idx(&path, None, &tmp.out(), options()));
    let (offset, _) = expect_corrupt(result, largest, &path);
    assert_eq!(offset, 12 + 3);
}

#[test]
fn regression_tfrecord_lengths_that_lie_with_valid_crcs() {
    let tmp = TempDir::new("tfrecord-absurd");
    for len in [u64::MAX, 1 << 62, 1 << 31, 1000] {
        let length = len.to_le_bytes();
        let mut file = length.to_vec();
        file.extend_from_slice(&masked_crc(&length).to_le_bytes());
        file.extend_from_slice(&[7; 64]);
        for (name, bytes, gz) in [("plain", file.clone(), false), ("gz", gzip(&file), true)] {
            let path = tmp.write(&format!("{len}-{name}"), &bytes);
            let compression =
                if gz { TfRecordCompression::Gzip } else { TfRecordCompression::None };
            let (result, largest) = largest_during(|| {
                import_tfrecord(
                    std::slice::from_ref(&path),
                    &tmp.out(),
                    &tf(compression),
                    options(),
                )
            });
            let (offset, what) = expect_corrupt(result, largest, &path);
            assert!(offset == 0 || offset == 12 + 64, "{len} {name}: {offset}: {what}");
        }
    }
}

/// TFRecord options with `compression` and nothing declared sparse.
fn tf(compression: dp_data::TfRecordCompression) -> dp_data::TfRecordOptions {
    dp_data::TfRecordOptions { compression, ..dp_data::TfRecordOptions::default() }
}
