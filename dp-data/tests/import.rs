//! Importers and the npy exporter through the public API: every import round-trips to `.npy`
//! files compared byte for byte with what NumPy writes, and malformed input gives errors that
//! name the file and the byte offset.

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

use tfrecord::{List, example, frame};

use std::path::{Path, PathBuf};

use dp_data::{
    CsvOptions, DType, Dataset, Error, ExportOptions, Feature, Kind, TfRecordCompression,
    WriterOptions, export_npy, import_csv, import_idx, import_npy, import_tfrecord, write_npy_f32,
};

// Files and headers written by NumPy 2.4.6 (`np.save`, and `np.lib.format.write_array` with
// `version=(2, 0)` and `(3, 0)`), as hex. The arrays, for i = 0, 1, ... over the flat elements:
//   U8  (6, 2, 3) |u1: (7 i + 3) % 256      I32 (6,) <i4: 1000 i - 2500
//   I64 (6, 4)    <i8: 123456789012 i - 1e12 F16 (6, 2) <f2: 0.5 i - 3
//   F32 (6, 2, 2) <f4: 0.25 i - 1.5          F64 (6, 3) <f8: i / 3
// HEADER_* are only the bytes before the elements, for arrays of the named shape. NUMPY_U8 and
// NUMPY_I32 are in support/numpy_fixtures.rs, which the fuzz tests read too.
const NUMPY_I64: &[&str] = &[
    "934e554d5059010076007b276465736372273a20273c6938272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028362c2034292c207d202020202020202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a00f05a2b17ffffff140af4e933ffffff",
    "28248da850ffffff3c3e26676dffffff5058bf258affffff647258e4a6ffffff788cf1a2c3ffffff8ca68a61e0ffffff",
    "a0c02320fdffffffb4dabcde19000000c8f4559d36000000dc0eef5b53000000f028881a70000000044321d98c000000",
    "185dba97a90000002c775356c60000004091ec14e300000054ab85d3ff00000068c51e921c0100007cdfb75039010000",
    "90f9500f56010000a413eacd72010000b82d838c8f010000cc471c4bac010000",
];
const NUMPY_F16: &[&str] = &[
    "934e554d5059010076007b276465736372273a20273c6632272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028362c2032292c207d202020202020202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a00c200c100c000be00bc00b800000038",
    "003c003e00400041",
];
const NUMPY_F32: &[&str] = &[
    "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028362c20322c2032292c207d202020202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a0000c0bf0000a0bf000080bf000040bf",
    "000000bf000080be000000000000803e0000003f0000403f0000803f0000a03f0000c03f0000e03f0000004000001040",
    "0000204000003040000040400000504000006040000070400000804000008840",
];
const NUMPY_F64: &[&str] = &[
    "934e554d5059010076007b276465736372273a20273c6638272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028362c2033292c207d202020202020202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a0000000000000000555555555555d53f",
    "555555555555e53f000000000000f03f555555555555f53fabaaaaaaaaaafa3f0000000000000040abaaaaaaaaaa0240",
    "55555555555505400000000000000840abaaaaaaaaaa0a405555555555550d4000000000000010405555555555551140",
    "abaaaaaaaaaa124000000000000014405555555555551540abaaaaaaaaaa1640",
];
const NUMPY_F32_V2: &[&str] = &[
    "934e554d50590200740000007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a204661",
    "6c73652c20277368617065273a2028362c20322c2032292c207d20202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a0000c0bf0000a0bf000080bf000040bf",
    "000000bf000080be000000000000803e0000003f0000403f0000803f0000a03f0000c03f0000e03f0000004000001040",
    "0000204000003040000040400000504000006040000070400000804000008840",
];
const NUMPY_F32_V3: &[&str] = &[
    "934e554d50590300740000007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a204661",
    "6c73652c20277368617065273a2028362c20322c2032292c207d20202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a0000c0bf0000a0bf000080bf000040bf",
    "000000bf000080be000000000000803e0000003f0000403f0000803f0000a03f0000c03f0000e03f0000004000001040",
    "0000204000003040000040400000504000006040000070400000804000008840",
];
const HEADER_U8_2000X8X8: &[&str] = &[
    "934e554d5059010076007b276465736372273a20277c7531272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028323030302c20382c2038292c207d202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a",
];
const HEADER_I64_2000: &[&str] = &[
    "934e554d5059010076007b276465736372273a20273c6938272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028323030302c292c207d2020202020202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a",
];
const HEADER_F32_2000X5: &[&str] = &[
    "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028323030302c2035292c207d202020202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a",
];
const HEADER_F32_9X3: &[&str] = &[
    "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028392c2033292c207d202020202020202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a",
];
const HEADER_I64_9: &[&str] = &[
    "934e554d5059010076007b276465736372273a20273c6938272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028392c292c207d2020202020202020202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a",
];
const HEADER_F32_9: &[&str] = &[
    "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028392c292c207d2020202020202020202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a",
];
const HEADER_F32_0X3: &[&str] = &[
    "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73",
    "652c20277368617065273a2028302c2033292c207d202020202020202020202020202020202020202020202020202020",
    "202020202020202020202020202020202020202020202020202020202020200a",
];

/// Small blocks, so that even small test datasets span several.
fn options() -> WriterOptions {
    let mut options = WriterOptions::default();
    options.block_size = 4096;
    options.threads = 2;
    options
}

/// All of a dense feature's bytes, block after block.
fn dense_bytes(dir: &Path, name: &str) -> Vec<u8> {
    let dataset = Dataset::open(dir).unwrap();
    let mut out = Vec::new();
    for block in dataset.blocks() {
        out.extend_from_slice(block.unwrap().dense_bytes(name).unwrap());
    }
    out
}

fn le<T: Copy, const N: usize>(
    values: impl IntoIterator<Item = T>,
    bytes: fn(T) -> [u8; N],
) -> Vec<u8> {
    values.into_iter().flat_map(bytes).collect()
}

fn corrupt(result: dp_data::Result<impl std::fmt::Debug>) -> (PathBuf, u64, String) {
    match result {
        Err(Error::Corrupt { path, offset, what }) => (path, offset, what),
        other => panic!("expected a Corrupt error, got {other:?}"),
    }
}

const ALL: [(&str, DType); 6] = [
    ("u8", DType::U8),
    ("i32", DType::I32),
    ("i64", DType::I64),
    ("f16", DType::F16),
    ("f32", DType::F32),
    ("f64", DType::F64),
];

fn fixture(dtype: DType) -> Vec<u8> {
    hex(match dtype {
        DType::U8 => NUMPY_U8,
        DType::I32 => NUMPY_I32,
        DType::I64 => NUMPY_I64,
        DType::F16 => NUMPY_F16,
        DType::F32 => NUMPY_F32,
        _ => NUMPY_F64,
    })
}

#[test]
fn numpy_files_round_trip_byte_for_byte() {
    let tmp = TempDir::new("npy-round-trip");
    let features: Vec<(String, PathBuf)> = ALL
        .iter()
        .map(|&(name, dtype)| {
            (name.to_string(), tmp.write(&format!("{name}.npy"), &fixture(dtype)))
        })
        .collect();
    let manifest = import_npy(&features, &tmp.path("ds"), false, options()).unwrap();
    assert_eq!(manifest.records, 6);
    let shapes: [&[usize]; 6] = [&[2, 3], &[], &[4], &[2], &[2, 2], &[3]];
    for ((feature, (name, dtype)), shape) in manifest.schema.features().iter().zip(ALL).zip(shapes)
    {
        assert_eq!(feature, &Feature::dense(name, dtype, shape));
    }
    // The values are the ones NumPy was asked for.
    assert_eq!(
        dense_bytes(&tmp.path("ds"), "i32"),
        le((0..6).map(|i| 1000 * i - 2500), i32::to_le_bytes)
    );
    assert_eq!(
        dense_bytes(&tmp.path("ds"), "f64"),
        le((0..18).map(|i| f64::from(i) / 3.0), f64::to_le_bytes)
    );
    assert_eq!(
        dense_bytes(&tmp.path("ds"), "i64"),
        le((0..24).map(|i| 123_456_789_012 * i - 1_000_000_000_000), i64::to_le_bytes)
    );

    let summary = export_npy(&tmp.path("ds"), &tmp.path("out"), &ExportOptions::default()).unwrap();
    assert_eq!(summary.records, 6);
    assert!(summary.skipped.is_empty());
    assert_eq!(summary.written.len(), 6);
    for ((name, dtype), (written, path)) in ALL.iter().zip(&summary.written) {
        assert_eq!(written, name);
        assert_eq!(std::fs::read(path).unwrap(), fixture(*dtype), "{name}");
    }
    assert_eq!(temporary_files(&tmp.path("out")), Vec::<String>::new());
}

/// The files in `dir` that are writes not yet renamed into place (`.NAME.XXXXXX.tmp`).
fn temporary_files(dir: &Path) -> Vec<String> {
    let names = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name());
    names.map(|n| n.to_string_lossy().into_owned()).filter(|n| n.ends_with(".tmp")).collect()
}

#[test]
fn an_f32_array_is_written_as_numpy_saves_it() {
    let tmp = TempDir::new("npy-write");
    let values: Vec<f32> = (0..24).map(|i| 0.25 * i as f32 - 1.5).collect();
    let path = tmp.path("x.npy");
    write_npy_f32(&path, &[6, 2, 2], &values).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), fixture(DType::F32));
    let error = write_npy_f32(&tmp.path("bad.npy"), &[5, 5], &values).unwrap_err().to_string();
    assert!(error.contains("[5, 5] does not hold 24 values"), "{error}");
    assert!(!tmp.path("bad.npy").exists());
    assert_eq!(temporary_files(&tmp.path("")), Vec::<String>::new());
}

#[test]
fn numpy_format_versions_2_and_3_import_the_same_array() {
    let tmp = TempDir::new("npy-versions");
    for (version, lines) in [("v2", NUMPY_F32_V2), ("v3", NUMPY_F32_V3)] {
        let path = tmp.write(&format!("{version}.npy"), &hex(lines));
        let out = tmp.path(&format!("ds-{version}"));
        import_npy(&[("x".into(), path)], &out, false, options()).unwrap();
        let npy = tmp.path(&format!("npy-{version}"));
        export_npy(&out, &npy, &ExportOptions::default()).unwrap();
        // Exported as NumPy would save it today: version 1.0.
        assert_eq!(std::fs::read(npy.join("x.npy")).unwrap(), fixture(DType::F32), "{version}");
    }
}

#[test]
fn f64_is_narrowed_to_f32_only_when_asked() {
    let tmp = TempDir::new("npy-narrow");
    let path = tmp.write("x.npy", &fixture(DType::F64));
    let manifest =
        import_npy(&[("x".into(), path.clone())], &tmp.path("narrow"), true, options()).unwrap();
    assert_eq!(manifest.schema.features()[0].dtype, DType::F32);
    let expected = le((0..18).map(|i| (f64::from(i) / 3.0) as f32), f32::to_le_bytes);
    assert_eq!(dense_bytes(&tmp.path("narrow"), "x"), expected);
    let manifest = import_npy(&[("x".into(), path)], &tmp.path("wide"), false, options()).unwrap();
    assert_eq!(manifest.schema.features()[0].dtype, DType::F64);
}

fn u8_images(n: usize) -> Vec<u8> {
    (0..n * 64).map(|i| (i * 31 % 251) as u8).collect()
}

fn labels(n: usize) -> Vec<i64> {
    (0..n as i64).map(|i| (i * 7) % 10).collect()
}

#[test]
fn large_arrays_span_many_blocks_and_round_trip() {
    let tmp = TempDir::new("npy-large");
    let images = [hex(HEADER_U8_2000X8X8), u8_images(2000)].concat();
    let labels = [hex(HEADER_I64_2000), le(labels(2000), i64::to_le_bytes)].concat();
    let floats =
        [hex(HEADER_F32_2000X5), le((0..10_000).map(|i| i as f32 * 0.1), f32::to_le_bytes)]
            .concat();
    let features = vec![
        ("image".to_string(), tmp.write("image.npy", &images)),
        ("label".to_string(), tmp.write("label.npy", &labels)),
        ("x".to_string(), tmp.write("x.npy", &floats)),
    ];
    let manifest = import_npy(&features, &tmp.path("ds"), false, options()).unwrap();
    assert_eq!(manifest.records, 2000);
    assert!(Dataset::open(tmp.path("ds")).unwrap().block_count() > 10);
    let summary = export_npy(&tmp.path("ds"), &tmp.path("out"), &ExportOptions::default()).unwrap();
    for ((name, path), original) in summary.written.iter().zip([&images, &labels, &floats]) {
        assert_eq!(&std::fs::read(path).unwrap(), original, "{name}");
    }
}

#[test]
fn npy_errors_name_the_file_and_offset() {
    let tmp = TempDir::new("npy-errors");
    let six = tmp.write("six.npy", &fixture(DType::U8));
    let many = tmp.write("many.npy", &[hex(HEADER_I64_2000), vec![0; 16000]].concat());
    let (path, offset, what) = corrupt(import_npy(
        &[("a".into(), six.clone()), ("b".into(), many.clone())],
        &tmp.path("ds"),
        false,
        options(),
    ));
    assert_eq!((path, offset), (many.clone(), 10));
    assert!(what.contains("2000 records") && what.contains("six.npy"), "{what}");
    assert!(!tmp.path("ds").exists(), "the output is created only after every header checks out");

    let mut truncated = fixture(DType::F64);
    truncated.pop();
    let short = tmp.write("short.npy", &truncated);
    let (path, offset, what) =
        corrupt(import_npy(&[("a".into(), short.clone())], &tmp.path("ds"), false, options()));
    assert_eq!((path, offset), (short, 128));
    assert!(what.contains("144 bytes of data, but 143 bytes follow"), "{what}");

    let missing = tmp.path("missing.npy");
    match import_npy(&[("a".into(), missing.clone())], &tmp.path("ds"), false, options()) {
        Err(Error::Io { path, op, .. }) => assert_eq!((path, op), (missing, "open")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        import_npy(&[], &tmp.path("ds"), false, options()),
        Err(Error::Config { .. })
    ));
    let twice = [("a".to_string(), six.clone()), ("a".to_string(), six)];
    assert!(matches!(import_npy(&twice, &tmp.path("ds"), false, options()), Err(Error::Schema(_))));
}

fn idx(code: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut file = vec![0, 0, code, dims.len() as u8];
    for d in dims {
        file.extend_from_slice(&d.to_be_bytes());
    }
    file.extend_from_slice(data);
    file
}

#[test]
fn idx_round_trips_to_the_npy_numpy_would_write() {
    let tmp = TempDir::new("idx");
    let images = u8_images(2000);
    let labels: Vec<u8> = labels(2000).iter().map(|&l| l as u8).collect();
    let image_file = idx(0x08, &[2000, 8, 8], &images);
    let label_file = idx(0x08, &[2000], &labels);
    let expected_images = [hex(HEADER_U8_2000X8X8), images.clone()].concat();
    let expected_labels =
        [hex(HEADER_I64_2000), le(labels.iter().map(|&l| i64::from(l)), i64::to_le_bytes)].concat();
    for compressed in [false, true] {
        let pack = |bytes: &[u8]| if compressed { gzip(bytes) } else { bytes.to_vec() };
        let name = if compressed { "gz" } else { "plain" };
        let images = tmp.write(&format!("images-{name}"), &pack(&image_file));
        let labels = tmp.write(&format!("labels-{name}"), &pack(&label_file));
        let out = tmp.path(&format!("ds-{name}"));
        let manifest = import_idx(&images, Some(&labels), &out, options()).unwrap();
        assert_eq!(manifest.records, 2000);
        assert_eq!(manifest.schema.to_string(), "image: u8[8,8], label: i64[]");
        let npy = tmp.path(&format!("npy-{name}"));
        export_npy(&out, &npy, &ExportOptions::default()).unwrap();
        assert_eq!(std::fs::read(npy.join("image.npy")).unwrap(), expected_images, "{name}");
        assert_eq!(std::fs::read(npy.join("label.npy")).unwrap(), expected_labels, "{name}");
    }
}

#[test]
fn idx_converts_other_types_and_checks_labels() {
    let tmp = TempDir::new("idx-types");
    let values: Vec<f32> = (0..12).map(|i| i as f32 - 5.5).collect();
    let be: Vec<u8> = values.iter().flat_map(|v| v.to_be_bytes()).collect();
    let images = tmp.write("f32", &idx(0x0D, &[3, 4], &be));
    let manifest = import_idx(&images, None, &tmp.path("f32-ds"), options()).unwrap();
    assert_eq!(manifest.schema.to_string(), "image: f32[4]");
    assert_eq!(dense_bytes(&tmp.path("f32-ds"), "image"), le(values, f32::to_le_bytes));

    let shorts: Vec<u8> = [-2i16, 300, -30000].iter().flat_map(|v| v.to_be_bytes()).collect();
    let images = tmp.write("i16", &idx(0x0B, &[3], &shorts));
    import_idx(&images, None, &tmp.path("i16-ds"), options()).unwrap();
    assert_eq!(
        dense_bytes(&tmp.path("i16-ds"), "image"),
        le([-2i32, 300, -30000], i32::to_le_bytes)
    );

    let wrong_count = tmp.write("labels-4", &idx(0x08, &[4], &[1, 2, 3, 4]));
    let (path, offset, what) =
        corrupt(import_idx(&images, Some(&wrong_count), &tmp.path("x"), options()));
    assert_eq!((path, offset), (wrong_count, 4));
    assert!(what.contains("4 labels") && what.contains("3 images"), "{what}");
    let float_labels = tmp.write("labels-f", &idx(0x0D, &[3], &[0; 12]));
    let (path, offset, _) =
        corrupt(import_idx(&images, Some(&float_labels), &tmp.path("x"), options()));
    assert_eq!((path, offset), (float_labels, 2));
    let bad_magic = tmp.write("magic", &[0, 1, 8, 1, 0, 0, 0, 0]);
    assert_eq!(corrupt(import_idx(&bad_magic, None, &tmp.path("x"), options())).1, 0);
}

const CSV: &str = "\u{feff}id,x,\"y\",z,label\r\n\
    r0,1.5,-2,0.25,3\r\n\
    r1, 2.5 ,\"-3\",1e-3,0\r\n\
    \r\n\
    \"r,2\",3.5,-4,1e3,9\r\n\
    r3,4.5,-5,-0,1\n\
    r4,5.5,-6,7,2\n\
    r5,6.5,-7,8,2\n\
    r6,7.5,-8,9,4\n\
    r7,8.5,-9,10,5\n\
    r8,9.5,-10,11,-6\n";

/// The CSV's numeric cells, as Rust parses them.
fn csv_cells(column: usize) -> Vec<String> {
    CSV.trim_start_matches('\u{feff}')
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let line = line.replacen("\"r,2\"", "r2", 1);
            line.split(',').nth(column).unwrap().trim().trim_matches('"').to_string()
        })
        .collect()
}

#[test]
fn csv_imports_a_label_and_a_feature_vector() {
    let tmp = TempDir::new("csv");
    let path = tmp.write("data.csv", CSV.as_bytes());
    let csv = CsvOptions {
        label: Some("label".into()),
        columns: Some(vec!["x".into(), "y".into(), "z".into()]),
        ..CsvOptions::default()
    };
    let manifest = import_csv(&path, &tmp.path("ds"), &csv, options()).unwrap();
    assert_eq!(manifest.records, 9);
    assert_eq!(manifest.schema.to_string(), "label: i64[], features: f32[3]");
    let summary = export_npy(&tmp.path("ds"), &tmp.path("npy"), &ExportOptions::default()).unwrap();
    assert_eq!(summary.written.len(), 2);
    let labels: Vec<i64> = csv_cells(4).iter().map(|c| c.parse().unwrap()).collect();
    let (x, y, z) = (csv_cells(1), csv_cells(2), csv_cells(3));
    let features: Vec<f32> =
        (0..9).flat_map(|r| [&x[r], &y[r], &z[r]].map(|c| c.parse::<f32>().unwrap())).collect();
    assert_eq!(
        std::fs::read(tmp.path("npy/label.npy")).unwrap(),
        [hex(HEADER_I64_9), le(labels, i64::to_le_bytes)].concat()
    );
    assert_eq!(
        std::fs::read(tmp.path("npy/features.npy")).unwrap(),
        [hex(HEADER_F32_9X3), le(features, f32::to_le_bytes)].concat()
    );
}

#[test]
fn an_empty_dataset_round_trips_to_empty_arrays() {
    let tmp = TempDir::new("csv-empty");
    let path = tmp.write("header-only.csv", b"a,b,c\n\n");
    let manifest = import_csv(&path, &tmp.path("ds"), &CsvOptions::default(), options()).unwrap();
    assert_eq!(manifest.records, 0);
    export_npy(&tmp.path("ds"), &tmp.path("npy"), &ExportOptions::default()).unwrap();
    assert_eq!(std::fs::read(tmp.path("npy/features.npy")).unwrap(), hex(HEADER_F32_0X3));
}

#[test]
fn csv_labels_with_fractions_become_f32_and_dtypes_can_be_forced() {
    let tmp = TempDir::new("csv-float");
    let text = CSV.replace(",-6\n", ",-6.5\n");
    let path = tmp.write("data.csv", text.as_bytes());
    let csv = CsvOptions {
        label: Some("label".into()),
        columns: Some(vec!["x".into()]),
        ..CsvOptions::default()
    };
    let manifest = import_csv(&path, &tmp.path("ds"), &csv, options()).unwrap();
    assert_eq!(manifest.schema.to_string(), "label: f32[], features: f32[1]");
    let mut expected: Vec<f32> = csv_cells(4).iter().map(|c| c.parse().unwrap()).collect();
    expected[8] = -6.5;
    export_npy(&tmp.path("ds"), &tmp.path("npy"), &ExportOptions::default()).unwrap();
    assert_eq!(
        std::fs::read(tmp.path("npy/label.npy")).unwrap(),
        [hex(HEADER_F32_9), le(expected, f32::to_le_bytes)].concat()
    );
    let forced = CsvOptions { label_dtype: Some(DType::F64), ..csv.clone() };
    let manifest = import_csv(&path, &tmp.path("f64"), &forced, options()).unwrap();
    assert_eq!(manifest.schema.features()[0].dtype, DType::F64);
    let ints = CsvOptions { label_dtype: Some(DType::I32), ..csv };
    let (_, offset, what) = corrupt(import_csv(&path, &tmp.path("i32"), &ints, options()));
    assert_eq!(offset as usize, text.find("-6.5").unwrap());
    assert!(what.contains("line 11") && what.contains("expected an i32"), "{what}");
}

#[test]
fn csv_errors_name_the_line_and_offset() {
    let tmp = TempDir::new("csv-errors");
    let csv = CsvOptions {
        label: Some("label".into()),
        columns: Some(vec!["x".into()]),
        ..CsvOptions::default()
    };
    let text = CSV.replace("r5,6.5,-7,8,2\n", "r5,6.5,-7,2\n");
    let path = tmp.write("short-row.csv", text.as_bytes());
    let (p, offset, what) = corrupt(import_csv(&path, &tmp.path("a"), &csv, options()));
    assert_eq!((p, offset as usize), (path, text.find("r5").unwrap()));
    assert!(what.contains("expected 5 fields") && what.contains("found 4"), "{what}");
    assert!(!tmp.path("a").exists(), "rows are checked before the output is created");

    let text = CSV.replace("r3,4.5", "r3,4.5x");
    let path = tmp.write("not-a-number.csv", text.as_bytes());
    let (_, offset, what) = corrupt(import_csv(&path, &tmp.path("b"), &csv, options()));
    assert_eq!(offset as usize, text.find("4.5x").unwrap());
    assert!(what.contains("column `x`") && what.contains("4.5x"), "{what}");

    let path = tmp.write("ok.csv", CSV.as_bytes());
    let missing = CsvOptions { label: Some("nope".into()), ..CsvOptions::default() };
    assert!(matches!(
        import_csv(&path, &tmp.path("c"), &missing, options()),
        Err(Error::Config { field: "label", .. })
    ));
    // Without a column list every other column is a feature, and `id` is not a number.
    let all = CsvOptions { label: Some("label".into()), ..CsvOptions::default() };
    let (_, offset, what) = corrupt(import_csv(&path, &tmp.path("d"), &all, options()));
    assert_eq!(offset as usize, CSV.find("r0").unwrap());
    assert!(what.contains("column `id`"), "{what}");
    let empty = tmp.write("empty.csv", b"");
    assert_eq!(corrupt(import_csv(&empty, &tmp.path("e"), &all, options())).1, 0);

    // A field of a megabyte is quoted by its first 40 bytes and its length; a header of
    // thousands of columns is listed by its first 20.
    let long = "9".repeat(1 << 20) + "x";
    let text = format!("label,x\n1,{long}\n");
    let path = tmp.write("long-field.csv", text.as_bytes());
    let (_, _, what) = corrupt(import_csv(&path, &tmp.path("f"), &csv, options()));
    assert!(what.ends_with(&format!("found \"{}...\" (1048577 bytes)", "9".repeat(40))), "{what}");
    let header: Vec<String> = (0..5000).map(|i| format!("c{i}")).collect();
    let path = tmp.write("wide.csv", format!("{}\n", header.join(",")).as_bytes());
    let error = import_csv(&path, &tmp.path("g"), &csv, options()).unwrap_err().to_string();
    assert!(error.contains("(its columns are: `c0`, `c1`, "), "{error}");
    assert!(error.contains("`c19` and 4980 more)"), "{error}");
    assert!(error.len() < 500, "a message of {} bytes", error.len());
}

fn record(i: usize) -> Vec<u8> {
    let image: Vec<u8> = (0..i % 7 + 1).map(|k| (i * 13 + k) as u8).collect();
    let coords = [i as f32, i as f32 / 2.0, -(i as f32)];
    let label = [(i % 10) as i64 - 3];
    // Alternate packed and unpacked encodings, as writers differ.
    let packed = i.is_multiple_of(2);
    example(&[
        ("label", List::Ints(&label, packed)),
        ("image/encoded", List::Bytes(&image)),
        ("coords", List::Floats(&coords, packed)),
    ])
}

#[test]
fn tfrecord_plain_and_gzip_import_to_the_same_arrays() {
    let tmp = TempDir::new("tfrecord");
    let records: Vec<Vec<u8>> = (0..300).map(|i| frame(&record(i))).collect();
    let first = records[..120].concat();
    let second = records[120..].concat();
    let plain = vec![tmp.write("a.tfrecord", &first), tmp.write("b.tfrecord", &second)];
    let gz =
        vec![tmp.write("a.tfrecord.gz", &gzip(&first)), tmp.write("b.tfrecord.gz", &gzip(&second))];
    let expected_labels = le((0..300).map(|i| (i % 10) as i64 - 3), i64::to_le_bytes);
    let expected_coords =
        le((0..300).flat_map(|i| [i as f32, i as f32 / 2.0, -(i as f32)]), f32::to_le_bytes);
    let mut exported = Vec::new();
    for (name, paths, compression) in [
        ("plain", &plain, TfRecordCompression::None),
        ("plain-auto", &plain, TfRecordCompression::Auto),
        ("gzip", &gz, TfRecordCompression::Gzip),
        ("gzip-auto", &gz, TfRecordCompression::Auto),
    ] {
        let out = tmp.path(name);
        let manifest = import_tfrecord(paths, &out, &tf(compression), options()).unwrap();
        assert_eq!(manifest.records, 300, "{name}");
        assert_eq!(
            manifest.schema.to_string(),
            "coords: f32[3], image_encoded: bytes, label: i64[1]"
        );
        let dataset = Dataset::open(&out).unwrap();
        let mut row = 0;
        for block in dataset.blocks() {
            let block = block.unwrap();
            for r in 0..block.len() {
                let expected: Vec<u8> = (0..row % 7 + 1).map(|k| (row * 13 + k) as u8).collect();
                assert_eq!(block.bytes("image_encoded", r).unwrap(), expected, "{name} {row}");
                row += 1;
            }
        }
        assert_eq!(row, 300);
        let npy = tmp.path(&format!("{name}-npy"));
        let summary = export_npy(&out, &npy, &ExportOptions::default()).unwrap();
        assert_eq!(summary.skipped.len(), 1);
        assert_eq!(summary.skipped[0].0, "image_encoded");
        let label = std::fs::read(npy.join("label.npy")).unwrap();
        let coords = std::fs::read(npy.join("coords.npy")).unwrap();
        assert!(label.ends_with(&expected_labels) && coords.ends_with(&expected_coords), "{name}");
        exported.push((label, coords));
    }
    assert!(exported.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn tfrecord_errors_name_the_file_record_and_offset() {
    let tmp = TempDir::new("tfrecord-errors");
    let good: Vec<Vec<u8>> = (0..5).map(|i| frame(&record(i))).collect();
    let offset_of = |k: usize| good[..k].iter().map(Vec::len).sum::<usize>() as u64;

    // A later Example that disagrees with the first.
    let mut files = good.clone();
    files[3] = frame(&example(&[
        ("label", List::Ints(&[1, 2], true)),
        ("image/encoded", List::Bytes(b"x")),
        ("coords", List::Floats(&[0.0; 3], true)),
    ]));
    let path = tmp.write("disagree.tfrecord", &files.concat());
    let (p, offset, what) = corrupt(import_tfrecord(
        std::slice::from_ref(&path),
        &tmp.path("a"),
        &tf(TfRecordCompression::Auto),
        options(),
    ));
    assert_eq!((p, offset), (path, offset_of(3)));
    assert!(
        what.contains("record 3") && what.contains("`label`") && what.contains("int64_list of 1"),
        "{what}"
    );
    assert!(Dataset::open(tmp.path("a")).is_err(), "a failed import leaves no dataset");

    // A flipped data byte breaks the record's CRC.
    let mut bytes = good.concat();
    let at = offset_of(2) as usize + 12 + 3;
    bytes[at] ^= 0x40;
    let path = tmp.write("flipped.tfrecord", &bytes);
    let (_, offset, what) = corrupt(import_tfrecord(
        &[path],
        &tmp.path("b"),
        &tf(TfRecordCompression::None),
        options(),
    ));
    assert_eq!(offset, offset_of(3) - 4);
    assert!(what.contains("CRC32C"), "{what}");

    // A truncated file.
    let bytes = good.concat();
    let path = tmp.write("short.tfrecord", &bytes[..bytes.len() - 5]);
    let (_, offset, _) = corrupt(import_tfrecord(
        &[path],
        &tmp.path("c"),
        &tf(TfRecordCompression::None),
        options(),
    ));
    assert_eq!(offset, offset_of(4));

    // Bytes lists of several values cannot be imported, nor can no Example at all.
    let path = tmp.write("empty.tfrecord", b"");
    assert!(matches!(
        import_tfrecord(&[path], &tmp.path("d"), &tf(TfRecordCompression::None), options()),
        Err(Error::Schema(_))
    ));
}

#[test]
fn export_refuses_features_it_cannot_write_when_asked_for_them() {
    let tmp = TempDir::new("export");
    let path =
        tmp.write("a.tfrecord", &(0..3).map(|i| frame(&record(i))).collect::<Vec<_>>().concat());
    let out = tmp.path("ds");
    import_tfrecord(&[path], &out, &tf(TfRecordCompression::Auto), options()).unwrap();
    let ask = |names: &[&str]| ExportOptions {
        features: Some(names.iter().map(|s| s.to_string()).collect()),
    };
    for names in [&["image_encoded"][..], &["nope"], &["label", "label"]] {
        match export_npy(&out, &tmp.path("npy"), &ask(names)) {
            Err(Error::Config { field: "features", .. }) => {}
            other => panic!("{names:?}: {other:?}"),
        }
    }
    let summary = export_npy(&out, &tmp.path("npy"), &ask(&["label"])).unwrap();
    assert_eq!(summary.written, vec![("label".to_string(), tmp.path("npy").join("label.npy"))]);
    assert!(summary.skipped.is_empty());
    assert!(matches!(
        Dataset::open(&out).unwrap().schema().feature("image_encoded").map(|f| &f.kind),
        Some(Kind::Bytes)
    ));
}

#[test]
fn non_finite_floats_are_counted_and_refused_unless_allowed_and_leave_nothing() {
    let dir = TempDir::new("nonfinite");
    let mut text = String::from("x,y,label\n");
    for i in 0..3000 {
        let x = match i {
            1234 => "nan".to_string(),
            2000 => "inf".to_string(),
            _ => format!("{}", i % 17),
        };
        text += &format!("{x},{},{}\n", i % 5, i % 3);
    }
    let csv = dir.write("data.csv", text.as_bytes());
    let out = dir.path("refused");
    let with_label = CsvOptions { label: Some("label".into()), ..CsvOptions::default() };
    let error = import_csv(&csv, &out, &with_label, options()).unwrap_err();
    match &error {
        Error::NonFinite { count, record, feature, value } => {
            assert_eq!((*count, *record, feature.as_str()), (2, 1234, "features"), "{error}");
            assert!(value.is_nan(), "{error}");
        }
        other => panic!("not a non-finite error: {other}"),
    }
    assert!(error.to_string().contains("--allow-nonfinite"), "{error}");
    assert!(!out.exists(), "a refused import left {}", out.display());

    let mut allowed = options();
    allowed.allow_nonfinite = true;
    let kept = dir.path("kept");
    let manifest = import_csv(&csv, &kept, &with_label, allowed).unwrap();
    assert_eq!(manifest.records, 3000);
    let values = dense_bytes(&kept, "features");
    let floats: Vec<f32> =
        values.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert!(floats[2 * 1234].is_nan() && floats[2 * 2000].is_infinite());
}

/// TFRecord options with `compression` and nothing declared sparse.
fn tf(compression: dp_data::TfRecordCompression) -> dp_data::TfRecordOptions {
    dp_data::TfRecordOptions { compression, ..dp_data::TfRecordOptions::default() }
}

#[test]
fn tfrecord_var_len_and_sparse_features_become_csr_rows() {
    let tmp = TempDir::new("tfrecord-sparse");
    // Record i: a label; i % 4 word ids with repeats; sparse (index, value) pairs out of order;
    // record 2 lacks the sparse keys altogether.
    let record = |i: i64| {
        let words: Vec<i64> = (0..i % 4).map(|k| (i * 3 + k * k) % 6).collect();
        let (index, value, label) = (vec![9 - i, i], vec![0.5 * i as f32, 1.0], [i]);
        let mut features =
            vec![("label", List::Ints(&label, false)), ("words", List::Ints(&words, true))];
        let sparse = [("idx", List::Ints(&index, true)), ("val", List::Floats(&value, true))];
        if i != 2 {
            features.extend(sparse);
        }
        frame(&example(&features))
    };
    let file: Vec<u8> = (0..5).flat_map(record).collect();
    let path = tmp.write("sparse.tfrecord", &file);
    let declared = dp_data::TfRecordOptions {
        var_len: vec![dp_data::VarLenFeature { key: "words".into(), width: 6 }],
        sparse: vec![dp_data::SparseFeature {
            name: "x".into(),
            index_key: "idx".into(),
            value_key: "val".into(),
            width: 10,
        }],
        ..dp_data::TfRecordOptions::default()
    };
    let out = tmp.path("out");
    let manifest =
        import_tfrecord(std::slice::from_ref(&path), &out, &declared, options()).unwrap();
    assert_eq!(
        manifest.schema.to_string(),
        "label: i64[1], words: sparse f32[6], x: sparse f32[10]"
    );
    let dataset = Dataset::open(&out).unwrap();
    let block = dataset.blocks().next().unwrap().unwrap();
    let row = |name: &str, r: usize| {
        let (p, v) = block.sparse::<f32>(name, r).unwrap();
        (p.to_vec(), v.to_vec())
    };
    // Record 3: ids (9 + 0, 9 + 1, 9 + 4) % 6 = 3, 4, 1; record 1: id 3 once.
    assert_eq!(row("words", 3), (vec![1, 3, 4], vec![1.0, 1.0, 1.0]));
    assert_eq!(row("words", 1), (vec![3], vec![1.0]));
    assert_eq!(row("words", 0), (vec![], vec![]));
    // Sorted by index with their values; record 2 is empty.
    assert_eq!(row("x", 1), (vec![1, 8], vec![1.0, 0.5]));
    assert_eq!(row("x", 2), (vec![], vec![]));

    // An index past the declared width, named with the record and the keys.
    let narrow = dp_data::TfRecordOptions {
        sparse: vec![dp_data::SparseFeature { width: 9, ..declared.sparse[0].clone() }],
        ..declared.clone()
    };
    let (_, offset, what) = corrupt(import_tfrecord(
        std::slice::from_ref(&path),
        &tmp.path("narrow"),
        &narrow,
        options(),
    ));
    assert_eq!(offset, 0, "{what}");
    assert!(
        what.contains("record 0 of this file: sparse feature `x` (idx, val): index 9 is outside"),
        "{what}"
    );
    // A declared key that no record has (misspelt) is refused by name, with the keys the
    // records do have, instead of importing a feature that is empty in every record.
    let mut misspelt = declared.clone();
    misspelt.var_len.push(dp_data::VarLenFeature { key: "tags".into(), width: 6 });
    misspelt.sparse.push(dp_data::SparseFeature {
        name: "y".into(),
        index_key: "y_idx".into(),
        value_key: "y_val".into(),
        width: 3,
    });
    let refused = tmp.path("misspelt");
    let error = import_tfrecord(std::slice::from_ref(&path), &refused, &misspelt, options())
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        format!(
            "invalid option `var_len`: declared keys are `tags` (a VarLenFeature), `y_idx` (the \
             index key of the SparseFeature `y`), `y_val` (the value key of the SparseFeature \
             `y`) in no record of {}: every record would hold an empty feature for them; the \
             records' keys are `label`, `words`, `idx`, `val`",
            path.display()
        )
    );
    assert!(!refused.exists());
    // Without the declarations, a varying list is ragged where the first Example fixed it.
    let (_, _, what) = corrupt(import_tfrecord(
        &[path],
        &tmp.path("plain"),
        &tf(TfRecordCompression::Auto),
        options(),
    ));
    assert!(what.contains("record 1 of this file: feature `words`"), "{what}");
}

#[test]
fn csv_quoted_fields_may_span_lines() {
    let tmp = TempDir::new("csv-multiline");
    let text =
        "note,x,label\n\"first line\nsecond, with a comma\",1.5,0\n\"plain\",2.5,1\nlast,x3,1\n";
    let path = tmp.write("notes.csv", text.as_bytes());
    let csv = CsvOptions {
        label: Some("label".into()),
        columns: Some(vec!["x".into()]),
        ..CsvOptions::default()
    };
    // The bad cell is on line 5: the quoted note took lines 2 and 3.
    let (_, offset, what) = corrupt(import_csv(&path, &tmp.path("bad"), &csv, options()));
    assert_eq!(offset as usize, text.find("x3").unwrap());
    assert!(what.contains("line 5") && what.contains("column `x`"), "{what}");
    let text = text.replace("x3", "3.5");
    let path = tmp.write("notes-ok.csv", text.as_bytes());
    let manifest = import_csv(&path, &tmp.path("ok"), &csv, options()).unwrap();
    assert_eq!(manifest.records, 3);
    let x: Vec<f32> = dense_bytes(&tmp.path("ok"), "features")
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(x, vec![1.5, 2.5, 3.5]);
}

#[test]
fn csv_blank_lines_are_skipped_but_an_empty_quoted_field_is_an_error() {
    let tmp = TempDir::new("csv-one-column");
    let csv = CsvOptions::default();
    let path = tmp.write("ok.csv", b"x\n1\n   \n\n2\n");
    assert_eq!(import_csv(&path, &tmp.path("ok"), &csv, options()).unwrap().records, 2);
    let text = "x\n1\n\"\"\n2\n";
    let path = tmp.write("empty.csv", text.as_bytes());
    let (_, offset, what) = corrupt(import_csv(&path, &tmp.path("empty"), &csv, options()));
    assert_eq!(offset as usize, text.find("\"\"").unwrap());
    assert!(what.contains("line 3") && what.contains("expected a number"), "{what}");
}
