//! The process's resident memory as the kernel counts it, to hold the trackers' accounts
//! against: what a job scheduler or the OOM killer sees.

/// Resident set sizes of this process, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Resident now (`VmRSS`).
    pub rss: u64,
    /// The most ever resident in the process's life (`VmHWM`).
    pub peak_rss: u64,
}

/// The process's resident memory, where the system reports it (`/proc/self/status` on
/// Linux); `None` elsewhere.
pub fn process_memory() -> Option<ProcessMemory> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|k| k << 10)
    };
    Some(ProcessMemory { rss: kib("VmRSS:")?, peak_rss: kib("VmHWM:")? })
}

/// Starts a new window for [`ProcessMemory::peak_rss`]: the kernel's peak becomes what is
/// resident now. Returns whether the system allows it (Linux's `/proc/self/clear_refs`), so
/// that a measurement of one phase's peak knows when it would include earlier phases.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

/// The process's address-space limit (`ulimit -v`, `RLIMIT_AS`) in bytes, when it has one and
/// the system reports it (`/proc/self/limits` on Linux).
pub fn address_space_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max address space"))?;
    line["Max address space".len()..].split_whitespace().next()?.parse().ok()
}

/// Why the system refuses to start a thread, for errors that say so: a thread needs a slot
/// under the limit of processes and the address space for its stack.
pub const THREAD_REFUSED: &str =
    "the system is out of threads or of memory for their stacks (ulimit -u, ulimit -v)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_touched_is_resident_and_the_peak_remembers_it() {
        let Some(before) = process_memory() else {
            eprintln!("skipped: this system does not report resident memory");
            return;
        };
        assert!(before.rss > 0 && before.peak_rss >= before.rss, "{before:?}");
        // 64 MiB written page by page is resident until dropped (other tests of this binary
        // may free memory meanwhile, so only the block itself is counted on).
        let mut block = vec![0u8; 64 << 20];
        for page in block.chunks_mut(4096) {
            page[0] = 1;
        }
        let touched = process_memory().unwrap();
        assert!(touched.rss >= 64 << 20, "{touched:?}");
        drop(std::hint::black_box(block));
        let after = process_memory().unwrap();
        assert!(after.peak_rss >= 64 << 20, "{touched:?} -> {after:?}");
    }

    #[test]
    fn the_address_space_limit_is_read_as_the_kernel_reports_it() {
        let limits = std::fs::read_to_string("/proc/self/limits");
        let Ok(limits) = limits else { return assert_eq!(address_space_limit(), None) };
        let unlimited =
            limits.lines().any(|l| l.starts_with("Max address space") && l.contains("unlimited"));
        assert_eq!(address_space_limit().is_none(), unlimited, "{limits}");
    }
}
