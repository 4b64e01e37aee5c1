//! Test scaffolding shared by the tests: a directory removed on drop, gzip, and hex fixtures.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh directory for one test (`.0` is its path), removed when dropped, also when the
/// test fails. The second field is held for its drop.
pub(crate) struct TempDir(pub(crate) PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl TempDir {
    pub(crate) fn new(test: &str) -> Self {
        let dir = scratch_dir(test);
        TempDir(dir.path().to_path_buf(), dir)
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub(crate) fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// A fresh output directory inside, for one case.
    pub(crate) fn out(&self) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = self.0.join(format!("out-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }
}

/// A fresh directory for the test `test`, removed when dropped (also when the test fails).
pub(crate) fn scratch_dir(test: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("dp-data-{test}-")).tempdir().unwrap()
}

pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// Bytes from hex text split over several lines (fixtures made by real NumPy).
pub(crate) fn hex(lines: &[&str]) -> Vec<u8> {
    let text: String = lines.concat();
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}
