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

    /// How the server binary was built (`"release"` or `"dev"`), as `cargo install` recorded
    /// it; `None` when cargo did not install it. A benchmark says it: on a machine whose cores
    /// also train, a debug build's cost is counted against the client.
    pub fn build_profile(&self) -> Option<String> {
        cargo_install_profile(&self.binary)
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

/// The profile `cargo install` built `binary` with, from the record it keeps beside its `bin`
/// directory (`.crates2.json`).
fn cargo_install_profile(binary: &Path) -> Option<String> {
    let name = binary.file_name()?.to_str()?;
    let home = binary.parent()?.parent()?;
    let text = std::fs::read_to_string(home.join(".crates2.json")).ok()?;
    let record: serde_json::Value = serde_json::from_str(&text).ok()?;
    record.get("installs")?.as_object()?.values().find_map(|install| {
        let ours = install.get("bins")?.as_array()?.iter().any(|b| b == name);
        ours.then(|| install.get("profile")?.as_str().map(str::to_string)).flatten()
    })
}

impl Drop for LocalS3 {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The rate, in bytes per second, at which the server at `url` (a dataset's prefix) serves
/// the dataset's shards, whole (`piece` `None`) or in ranged GETs of `piece` bytes, `threads`
/// requests at a time: the most any reader fetching such pieces can reach, the reference a
/// cold read is measured against.
pub fn object_read_rate(url: &str, threads: usize, piece: Option<u64>) -> Result<f64> {
    use super::object::RemoteDir;
    let dir = RemoteDir::new(url)?;
    let manifest = crate::manifest::Manifest::parse(
        &dir.object(crate::manifest::MANIFEST_FILE).get(None)?,
        Path::new(url),
    )?;
    let mut requests: Vec<(&str, Option<std::ops::Range<u64>>)> = Vec::new();
    for shard in &manifest.shards {
        match piece {
            None => requests.push((&shard.file, None)),
            Some(piece) => requests.extend(
                (0..shard.bytes)
                    .step_by(piece.max(1) as usize)
                    .map(|at| (shard.file.as_str(), Some(at..(at + piece).min(shard.bytes)))),
            ),
        }
    }
    let threads = threads.clamp(1, requests.len().max(1));
    let started = Instant::now();
    let bytes = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let (dir, requests) = (&dir, &requests);
                scope.spawn(move || -> Result<u64> {
                    let mut bytes = 0;
                    for (name, range) in requests.iter().skip(thread).step_by(threads) {
                        let object = dir.object(name);
                        bytes += match range {
                            None => object.get(None)?.len(),
                            Some(range) => object.get_range(range.clone(), None)?.len(),
                        } as u64;
                    }
                    Ok(bytes)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_is_the_one_cargo_recorded_for_the_binary() {
        let home = tempfile::tempdir().unwrap();
        let binary = home.path().join("bin/s3s-fs");
        assert_eq!(cargo_install_profile(&binary), None, "no record");
        let record = r#"{"installs":{
            "other 1.0.0 (registry+x)":{"bins":["other"],"profile":"dev"},
            "s3s-fs 0.14.1 (registry+x)":{"bins":["s3s-fs"],"profile":"release"}}}"#;
        std::fs::write(home.path().join(".crates2.json"), record).unwrap();
        assert_eq!(cargo_install_profile(&binary).as_deref(), Some("release"));
        assert_eq!(cargo_install_profile(&home.path().join("bin/other")).as_deref(), Some("dev"));
        assert_eq!(cargo_install_profile(&home.path().join("bin/third")), None);
    }
}
