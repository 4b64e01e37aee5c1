//! The svmlight importer through the public API: what it writes (CSR rows, labels, query
//! ids) read back record by record, the index base and width decided as scikit-learn does,
//! and malformed lines reported by file, offset and line.

#[path = "support/temp_dir.rs"]
#[allow(dead_code)]
mod temp_dir;

use std::path::Path;

use dp_data::{
    DType, Dataset, Error, Kind, SvmlightOptions, WriterOptions, import_svmlight,
    import_svmlight_splits,
};
use temp_dir::{TempDir, gzip};

/// One record as imported: the positions and values of `x`, the label's bytes, the query id.
type Record = (Vec<u64>, Vec<f32>, Vec<u8>, Option<i64>);

/// Every record of `dir`.
fn records(dir: &Path) -> Vec<Record> {
    let dataset = Dataset::open(dir).unwrap();
    let label_size = dataset.schema().feature("label").unwrap().dtype.size();
    let mut out = Vec::new();
    for block in dataset.blocks() {
        let block = block.unwrap();
        let labels = block.dense_bytes("label").unwrap();
        let qids = block.dense_bytes("qid").ok();
        for row in 0..block.len() {
            let (positions, values) = block.sparse::<f32>("x", row).unwrap();
            let label = labels[row * label_size..(row + 1) * label_size].to_vec();
            let qid = qids.map(|q| i64::from_le_bytes(q[row * 8..row * 8 + 8].try_into().unwrap()));
            out.push((positions.to_vec(), values.to_vec(), label, qid));
        }
    }
    out
}

fn import(
    tmp: &TempDir,
    text: &str,
    options: &SvmlightOptions,
) -> dp_data::Result<std::path::PathBuf> {
    let file = tmp.write("in.svm", text.as_bytes());
    let out = tmp.out();
    import_svmlight(&[&file], &out, options, WriterOptions::default()).map(|_| out)
}

fn corrupt(result: dp_data::Result<impl std::fmt::Debug>) -> (u64, String) {
    match result {
        Err(Error::Corrupt { offset, what, .. }) => (offset, what),
        other => panic!("expected a Corrupt error, got {other:?}"),
    }
}

#[test]
fn lines_become_csr_rows_with_their_labels_and_query_ids() {
    let tmp = TempDir::new("svm-basic");
    let text = "# a comment line\n\
                +1 qid:3 1:0.5 4:-2 7:1e-3 # trailing comment\n\
                \n\
                -1 qid:3\n\
                1 qid:9 2:3.25\r\n";
    let out = import(&tmp, text, &SvmlightOptions::default()).unwrap();
    let dataset = Dataset::open(&out).unwrap();
    let counts = dataset.manifest().sparse["x"];
    assert_eq!((counts.nnz, counts.max_per_record), (4, 3));
    assert!((counts.density(7, 3) - 4.0 / 21.0).abs() < 1e-12);
    let x = dataset.schema().feature("x").unwrap();
    // 1-based (no index 0), so the widest index 7 is the 7th of 7 features.
    assert_eq!((x.dtype, &x.kind), (DType::F32, &Kind::Sparse { shape: vec![7] }));
    assert_eq!(dataset.schema().feature("label").unwrap().dtype, DType::I64);
    let class = |c: i64| c.to_le_bytes().to_vec();
    assert_eq!(
        records(&out),
        vec![
            (vec![0, 3, 6], vec![0.5, -2.0, 1e-3], class(1), Some(3)),
            (vec![], vec![], class(0), Some(3)),
            (vec![1], vec![3.25], class(1), Some(9)),
        ]
    );
}

#[test]
fn the_index_base_and_width_follow_the_data_or_the_options() {
    let tmp = TempDir::new("svm-base");
    // An index 0 makes the file 0-based.
    let out = import(&tmp, "0 0:1 3:2\n2 1:1\n", &SvmlightOptions::default()).unwrap();
    let schema = Dataset::open(&out).unwrap().schema().clone();
    assert_eq!(schema.feature("x").unwrap().kind, Kind::Sparse { shape: vec![4] });
    assert!(schema.feature("qid").is_none());
    assert_eq!(records(&out)[0].0, vec![0, 3]);
    // A given width holds indices the data does not reach (another split's).
    let wide = SvmlightOptions { features: Some(100), ..SvmlightOptions::default() };
    let out = import(&tmp, "1 2:1\n", &wide).unwrap();
    let schema = Dataset::open(&out).unwrap().schema().clone();
    assert_eq!(schema.feature("x").unwrap().kind, Kind::Sparse { shape: vec![100] });
    assert_eq!(records(&out)[0].0, vec![1]);
    // Forced 0-based: index 1 is the second feature.
    let zero = SvmlightOptions { zero_based: Some(true), ..SvmlightOptions::default() };
    assert_eq!(records(&import(&tmp, "1 1:1\n", &zero).unwrap())[0].0, vec![1]);
    // Fractional labels make the label f32; multiclass labels stay as written.
    let out = import(&tmp, "0.5 1:1\n-2.25 2:1\n", &SvmlightOptions::default()).unwrap();
    let dataset = Dataset::open(&out).unwrap();
    assert_eq!(dataset.schema().feature("label").unwrap().dtype, DType::F32);
    assert_eq!(records(&out)[1].2, (-2.25f32).to_le_bytes().to_vec());
    let out = import(&tmp, "3 1:1\n1 2:1\n", &SvmlightOptions::default()).unwrap();
    assert_eq!(records(&out)[0].2, 3i64.to_le_bytes().to_vec());
}

#[test]
fn gzip_files_and_several_files_import_as_one_dataset() {
    let tmp = TempDir::new("svm-gzip");
    let a = tmp.write("a.svm.gz", &gzip(b"1 1:1\n"));
    let b = tmp.write("b.svm", b"0 2:2\n");
    let out = tmp.out();
    let manifest =
        import_svmlight(&[&a, &b], &out, &SvmlightOptions::default(), WriterOptions::default())
            .unwrap();
    assert_eq!(manifest.records, 2);
    let rows: Vec<_> = records(&out).into_iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(rows, vec![(vec![0], vec![1.0]), (vec![1], vec![2.0])]);
}

#[test]
fn a_train_and_a_test_file_imported_together_share_one_width_base_and_labels() {
    let tmp = TempDir::new("svm-splits");
    // The test file's largest index is one below the train file's, and only the train file
    // has a -1 label.
    let train = tmp.write("train.svm", b"1 1:1 50000:2\n-1 3:1\n");
    let test = tmp.write("test.svm", b"1 2:1 49999:3\n");
    let default = SvmlightOptions::default();
    // One at a time, the widths differ by one: what the trainer refuses.
    let (alone_train, alone_test) = (tmp.out(), tmp.out());
    let a = import_svmlight(&[&train], &alone_train, &default, WriterOptions::default()).unwrap();
    let b = import_svmlight(&[&test], &alone_test, &default, WriterOptions::default()).unwrap();
    assert_eq!(a.schema.to_string(), "x: sparse f32[50000], label: i64[]");
    assert_eq!(b.schema.to_string(), "x: sparse f32[49999], label: i64[]");

    let (train_out, test_out) = (tmp.out(), tmp.out());
    let splits = [(train_out.as_path(), &[train.as_path()][..]), (&test_out, &[test.as_path()])];
    let manifests = import_svmlight_splits(&splits, &default, WriterOptions::default()).unwrap();
    assert_eq!(manifests.len(), 2);
    for manifest in &manifests {
        assert_eq!(manifest.schema.to_string(), "x: sparse f32[50000], label: i64[]");
    }
    // The -1/+1 labels are mapped in both, though the test file has only +1.
    let label = |c: i64| c.to_le_bytes().to_vec();
    assert_eq!(
        records(&train_out),
        [(vec![0, 49999], vec![1.0, 2.0], label(1), None), (vec![2], vec![1.0], label(0), None)]
    );
    assert_eq!(records(&test_out), [(vec![1, 49998], vec![1.0, 3.0], label(1), None)]);

    // A split that cannot be written is refused before any is written; so are a split
    // without lines and one output given twice.
    let taken = tmp.out();
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("mine.txt"), b"mine").unwrap();
    let fresh = tmp.out();
    let refused = [(fresh.as_path(), &[train.as_path()][..]), (&taken, &[test.as_path()])];
    let error = import_svmlight_splits(&refused, &default, WriterOptions::default()).unwrap_err();
    assert!(error.to_string().contains("is a directory that is not a dataset"), "{error}");
    assert!(!fresh.exists());
    let empty = tmp.write("empty.svm", b"# nothing\n");
    let split_empty = [(fresh.as_path(), &[train.as_path()][..]), (&taken, &[empty.as_path()])];
    let (_, what) =
        corrupt(import_svmlight_splits(&split_empty, &default, WriterOptions::default()));
    assert!(
        what.contains(&format!("at least one svmlight line for {}", taken.display())),
        "{what}"
    );
    let twice = [(fresh.as_path(), &[train.as_path()][..]), (&fresh, &[test.as_path()])];
    let error = import_svmlight_splits(&twice, &default, WriterOptions::default()).unwrap_err();
    assert!(error.to_string().contains("is the output of two splits"), "{error}");
    assert!(!fresh.exists());
}

#[test]
fn malformed_lines_are_named_by_line_offset_and_what_was_expected() {
    let tmp = TempDir::new("svm-errors");
    let default = SvmlightOptions::default();
    let cases: [(&str, &SvmlightOptions, u64, &str); 9] = [
        ("1 1:1\n1 3:1 2:1\n", &default, 12, "line 2: index 2 comes after index 3"),
        ("1 3:1 3:2\n", &default, 6, "line 1: index 3 repeats index 3"),
        ("1 1:x\n", &default, 2, "index 1: expected a finite value"),
        ("1 1:nan\n", &default, 2, "expected a finite value"),
        ("yes 1:1\n", &default, 0, "expected a finite label"),
        ("1 a:1\n", &default, 2, "expected a non-negative integer index"),
        ("1 qid:1 1:1\n1 1:1\n", &default, 12, "line 2: some lines have a qid and others none"),
        ("1 1:1\n-3 1:1\n", &default, 6, "label -3 is negative"),
        (
            "1 1:1 7:1\n",
            &SvmlightOptions { features: Some(5), ..default.clone() },
            6,
            "index 7 is past the 5 features",
        ),
    ];
    for (text, options, offset, what) in cases {
        let (at, message) = corrupt(import(&tmp, text, options));
        assert!(message.contains(what), "{text:?}: {message}");
        assert_eq!(at, offset, "{text:?}: {message}");
    }
    let one = SvmlightOptions { zero_based: Some(false), ..SvmlightOptions::default() };
    let (at, message) = corrupt(import(&tmp, "1 0:1\n", &one));
    assert!(message.contains("line 1: index 0 in a file read as 1-based"), "{message}");
    assert_eq!(at, 2);
    let (_, message) = corrupt(import(&tmp, "# only a comment\n\n", &default));
    assert!(message.contains("at least one svmlight line"), "{message}");
    // The largest index a u64 holds: as 0-based it has no width after it; as 1-based its
    // width is more than a schema allows. Either way an error, not an overflow.
    let zero = SvmlightOptions { zero_based: Some(true), ..default.clone() };
    let error = import(&tmp, "1 18446744073709551615:1\n", &zero).unwrap_err().to_string();
    assert!(error.contains("too large for a width"), "{error}");
    let error = import(&tmp, "1 18446744073709551615:1\n", &default).unwrap_err().to_string();
    assert!(error.contains("bytes per record"), "{error}");
    // Nothing is written for a file that fails, whichever check finds it.
    let narrow = SvmlightOptions { features: Some(5), ..default.clone() };
    for (text, options) in [("1 1:1\n1 2:1 1:1\n", &default), ("1 1:1\n1 7:1\n", &narrow)] {
        let out = tmp.out();
        let file = tmp.write("bad.svm", text.as_bytes());
        assert!(import_svmlight(&[&file], &out, options, WriterOptions::default()).is_err());
        assert!(!out.exists(), "{text:?}");
    }
}

#[test]
fn an_enormous_token_is_quoted_cut_to_40_bytes_with_its_length() {
    let tmp = TempDir::new("svm-long-token");
    // One line whose index:value pairs lost their spaces: an 11 MB token.
    let token: String = (1..=1_000_000).map(|i| format!("{i}:0.5")).collect();
    let text = format!("1 {token}\n");
    let (at, message) = corrupt(import(&tmp, &text, &SvmlightOptions::default()));
    assert_eq!(at, 2);
    let value = &token[2..]; // after the first index, `1:`
    let expected = format!(
        "line 1: index 1: expected a finite value, found \"{}...\" ({} bytes)",
        &value[..40],
        value.len()
    );
    assert!(message.ends_with(&expected), "{}", &message[..message.len().min(500)]);
    assert!(message.len() < 200, "a message of {} bytes", message.len());
}

#[test]
fn export_writes_svmlight_that_imports_back_and_npz_in_scipys_csr_layout() {
    let tmp = TempDir::new("svm-export");
    let text = "1 qid:2 1:0.5 4:-2\n0 qid:2\n1 qid:7 2:3.25 3:1e-7\n";
    let first = import(&tmp, text, &SvmlightOptions::default()).unwrap();
    let svm = tmp.path("back.svm");
    assert_eq!(
        dp_data::export_svmlight(&first, &svm, &dp_data::SparseExport::default()).unwrap(),
        3
    );
    let written = std::fs::read_to_string(&svm).unwrap();
    assert_eq!(written, "1 qid:2 1:0.5 4:-2\n0 qid:2\n1 qid:7 2:3.25 3:0.0000001\n");
    let again = tmp.out();
    import_svmlight(&[&svm], &again, &SvmlightOptions::default(), WriterOptions::default())
        .unwrap();
    assert_eq!(records(&again), records(&first));

    let npz = tmp.path("x.npz");
    dp_data::export_npz(&first, &npz, &dp_data::SparseExport::default()).unwrap();
    let mut archive = zip::ZipArchive::new(std::fs::File::open(&npz).unwrap()).unwrap();
    let mut array = |name: &str| {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut archive.by_name(name).unwrap(), &mut bytes).unwrap();
        // The .npy header is padded to a multiple of 64 bytes; the data follows.
        let header = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        (
            String::from_utf8_lossy(&bytes[10..10 + header]).into_owned(),
            bytes[10 + header..].to_vec(),
        )
    };
    let ints = |b: Vec<u8>| {
        b.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>()
    };
    let (header, indptr) = array("indptr.npy");
    assert!(header.contains("'descr': '<i4'") && header.contains("(4,)"), "{header}");
    assert_eq!(ints(indptr), vec![0, 2, 2, 4]);
    assert_eq!(ints(array("indices.npy").1), vec![0, 3, 1, 2]);
    let values: Vec<f32> =
        array("data.npy").1.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(values, vec![0.5, -2.0, 3.25, 1e-7]);
    assert_eq!(ints(array("shape.npy").1), vec![3, 4]);
    let (header, format) = array("format.npy");
    assert!(header.contains("'descr': '|S3'") && header.contains("'shape': ()"), "{header}");
    assert_eq!(format, b"csr");
}
