//! A local S3-compatible server for tests and benchmarks: `s3s-fs` (scripts/setup-s3.sh),
//! started on 127.0.0.1 on a free port over a directory, with this process's S3 client
//! pointed at it through the environment, as a user's would be.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

const KEY: &str = "dp-local-key";
const SECRET: &str = "dp-local-secret";

/// A running `s3s-fs` serving bucket `bucket` from a directory; killed when dropped.
#[derive(Debug)]
pub struct LocalS3 {
    child: Option<Child>,
    binary: PathBuf,
    root: PathBuf,
    port: u16,
}

impl LocalS3 {
    /// The server binary: on the PATH, or where `cargo install` puts it.
    pub fn binary() -> Option<PathBuf> {
        let on_path = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths).map(|p| p.join("s3s-fs")).find(|p| p.is_file())
        });
        let cargo_home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
        on_path.or_else(|| cargo_home.map(|h| h.join("bin/s3s-fs")).filter(|p| p.is_file()))
    }

    /// Starts a server keeping its objects under `root` (created), and points this process's
    /// S3 client at it (`AWS_ENDPOINT` and credentials). Call it before other threads read
    /// the environment.
    pub fn start(root: &Path) -> Result<LocalS3> {
        let binary = Self::binary().ok_or_else(|| Error::Config {
            field: "s3s-fs",
            what: "not installed (bash scripts/setup-s3.sh)".into(),
        })?;
        let bucket = root.join("bucket");
        std::fs::create_dir_all(&bucket).map_err(|e| Error::io(&bucket, "create", e))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| Error::io("127.0.0.1:0", "bind", e))?
            .port();
        // SAFETY: the caller starts the server before other threads read the environment.
        unsafe {
            std::env::set_var("AWS_ACCESS_KEY_ID", KEY);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET);
            std::env::set_var("AWS_REGION", "us-east-1");
            std::env::set_var("AWS_ENDPOINT", format!("http://127.0.0.1:{port}"));
            std::env::set_var("AWS_ALLOW_HTTP", "true");
        }
        let mut server = LocalS3 { child: None, binary, root: root.to_path_buf(), port };
        server.restart()?;
        Ok(server)
    }

    /// Starts the server process again (after [`LocalS3::kill`]) on the same port and
    /// objects, and waits until it accepts connections.
    pub fn restart(&mut self) -> Result<()> {
        let child = Command::new(&self.binary)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", KEY, "--secret-key", SECRET])
            .arg(&self.root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error::io(&self.binary, "start", e))?;
        self.child = Some(child);
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if started.elapsed() > Duration::from_secs(20) {
                self.kill();
                return Err(Error::Config {
                    field: "s3s-fs",
                    what: format!("did not listen on 127.0.0.1:{} within 20 s", self.port),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Kills the server process (as a crash would) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The CPU time the running server has taken, in seconds (what its threads' scheduler
    /// statistics say, on Linux; `None` elsewhere, or when it is not running): on a machine
    /// whose cores also train, the server's share of them bounds what a cold read reaches.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let pid = self.child.as_ref()?.id();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        let nanos: u64 = tasks
            .filter_map(|task| {
                let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
                stat.split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum();
        Some(nanos as f64 * 1e-9)
    }

    /// The URL of `prefix` in the bucket.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://bucket/{prefix}")
    }

    /// Where the server keeps object `key` of the bucket.
    pub fn object_path(&self, key: &str) -> PathBuf {
        self.root.join("bucket").join(key)
    }
}

impl Drop for LocalS3 {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The rate, in bytes per second, at which the server at `url` (a dataset's prefix) serves
/// the dataset's shards whole, on `threads` threads at once: the most any reader of it can
/// fetch, the reference a cold read is measured against.
pub fn object_read_rate(url: &str, threads: usize) -> Result<f64> {
    use super::object::RemoteDir;
    let dir = RemoteDir::new(url)?;
    let manifest = crate::manifest::Manifest::parse(
        &dir.object(crate::manifest::MANIFEST_FILE).get(None)?,
        Path::new(url),
    )?;
    let names: Vec<&str> = manifest.shards.iter().map(|s| s.file.as_str()).collect();
    let started = Instant::now();
    let chunk = names.len().div_ceil(threads.max(1)).max(1);
    let bytes = std::thread::scope(|scope| {
        let handles: Vec<_> = names
            .chunks(chunk)
            .map(|part| {
                let dir = &dir;
                scope.spawn(move || -> Result<u64> {
                    part.iter().map(|name| Ok(dir.object(name).get(None)?.len() as u64)).sum()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .sum::<Result<u64>>()
    })?;
    Ok(bytes as f64 / started.elapsed().as_secs_f64())
}
