//! A real S3-compatible server for the object storage tests: `s3s-fs` (installed by
//! scripts/setup-s3.sh), started on 127.0.0.1 on a free port over a directory of its own.
//! Without it the tests say they are skipped, unless DP_REQUIRE_S3 is set (as CI sets it).
//! Each test binary uses a part of it.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dp_data::{DType, DatasetWriter, Feature, Schema, Value, WriterOptions};

const KEY: &str = "dp-test-key";
const SECRET: &str = "dp-test-secret";

/// The server binary: on the PATH, or where `cargo install` puts it.
fn binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|p| p.join("s3s-fs")).find(|p| p.is_file())
    });
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    on_path.or_else(|| cargo_home.map(|h| h.join("bin/s3s-fs")).filter(|p| p.is_file()))
}

/// A running server whose data lives in `root` (bucket `bucket`); killed when dropped.
pub(crate) struct Server {
    child: Option<Child>,
    binary: PathBuf,
    pub(crate) root: tempfile::TempDir,
    pub(crate) port: u16,
}

impl Server {
    /// Starts a server, pointing this process's S3 client at it (endpoint and credentials
    /// through the environment, as a user's would be); `None` (after saying why) when
    /// s3s-fs is not installed and DP_REQUIRE_S3 is not set.
    pub(crate) fn start(test: &str) -> Option<Server> {
        let Some(binary) = binary() else {
            if std::env::var_os("DP_REQUIRE_S3").is_some() {
                panic!("DP_REQUIRE_S3 is set but s3s-fs is not installed (scripts/setup-s3.sh)");
            }
            eprintln!("skipped {test}: s3s-fs is not installed (bash scripts/setup-s3.sh)");
            return None;
        };
        let root = tempfile::Builder::new().prefix("dp-data-s3-").tempdir().unwrap();
        std::fs::create_dir(root.path().join("bucket")).unwrap();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // SAFETY: set before any thread of this test binary reads them (each test binary
        // starts one server, first thing).
        unsafe {
            std::env::set_var("AWS_ACCESS_KEY_ID", KEY);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET);
            std::env::set_var("AWS_REGION", "us-east-1");
            std::env::set_var("AWS_ENDPOINT", format!("http://127.0.0.1:{port}"));
            std::env::set_var("AWS_ALLOW_HTTP", "true");
        }
        let mut server = Server { child: None, binary, root, port };
        server.restart();
        Some(server)
    }

    /// Starts the server process again (after [`Server::kill`]), on the same port and data,
    /// and waits until it accepts connections.
    pub(crate) fn restart(&mut self) {
        let child = Command::new(&self.binary)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", KEY, "--secret-key", SECRET])
            .arg(self.root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("s3s-fs starts");
        self.child = Some(child);
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "s3s-fs did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server process (as a crash would) and waits for it to be gone.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The URL of `prefix` in the bucket.
    pub(crate) fn url(&self, prefix: &str) -> String {
        format!("s3://bucket/{prefix}")
    }

    /// Where the server keeps object `key` of the bucket.
    pub(crate) fn object_path(&self, key: &str) -> PathBuf {
        self.root.path().join("bucket").join(key)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A dataset of `records` 8x8 u8 images of hashed (incompressible) pixels, labelled by their
/// index, in blocks of about 4 KiB and shards of about 32 KiB.
pub(crate) fn dataset(dir: &Path, records: u64) {
    let schema = Schema::new(vec![
        Feature::dense("image", DType::U8, &[8, 8]),
        Feature::dense("label", DType::I64, &[]),
    ])
    .unwrap();
    let mut options = WriterOptions::default();
    options.block_size = 4 << 10;
    options.shard_size = 32 << 10;
    options.threads = 1;
    let mut writer = DatasetWriter::create(dir, schema, options).unwrap();
    for i in 0..records {
        let image: [u8; 64] = std::array::from_fn(|k| {
            let mut x = (i * 64 + k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x ^= x >> 33;
            (x.wrapping_mul(0xFF51_AFD7_ED55_8CCD) >> 56) as u8
        });
        writer.append(&[Value::dense(&image), Value::dense(&[i as i64])]).unwrap();
    }
    writer.finish().unwrap();
}
