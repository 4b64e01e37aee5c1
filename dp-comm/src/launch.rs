//! How a process learns its place in a multi-process job: from the environment its launcher
//! set. Nothing is configured by hand, and nothing here talks to the network.

use std::process::Command;

use crate::error::{Error, Result};

/// The launcher that started this process, as its environment says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launch {
    /// No launcher: a process of its own, the whole world.
    Single,
    /// `mpirun`/`mpiexec` (Open MPI, MPICH) or `srun --mpi=pmix|pmi2`: MPI knows the world,
    /// and [`MpiWorld::init`](crate::MpiWorld::init) joins it.
    Mpi {
        /// The launcher, as its variables name it (`Open MPI`, `PMI`, `PMIx`, `srun`).
        launcher: &'static str,
        /// The world size the launcher announced, when its variables carry one;
        /// [`MpiWorld::init`](crate::MpiWorld::init) checks that MPI agrees.
        world_size: Option<usize>,
    },
    /// `torchrun`'s contract (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
    /// `MASTER_PORT`): processes that find each other through NCCL's own rendezvous at
    /// `MASTER_ADDR:MASTER_PORT` (`NCCL_COMM_ID`), for GPU runs without MPI.
    Env {
        /// This process's rank.
        rank: usize,
        /// The number of processes.
        world_size: usize,
        /// This process's rank on its host: the GPU it uses.
        local_rank: usize,
        /// Rank 0's host.
        master_addr: String,
        /// The port rank 0 listens on.
        master_port: u16,
    },
}

impl Launch {
    /// Reads this process's environment.
    pub fn detect() -> Result<Launch> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the launcher's variables through `var` (the environment, or a map in tests).
    /// MPI launchers win over `torchrun`'s variables, which some clusters set globally.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        if let Some(size) = var("OMPI_COMM_WORLD_SIZE") {
            let world_size = Some(parse("OMPI_COMM_WORLD_SIZE", &size)?);
            return Ok(Launch::Mpi { launcher: "Open MPI", world_size });
        }
        if let Some(size) = var("PMI_SIZE") {
            return Ok(Launch::Mpi {
                launcher: "PMI",
                world_size: Some(parse("PMI_SIZE", &size)?),
            });
        }
        if var("PMIX_RANK").is_some() || var("PMI_RANK").is_some() {
            return Ok(Launch::Mpi { launcher: "PMIx", world_size: None });
        }
        // `srun` without an MPI plugin sets no PMI variables, and MPI would see each task
        // alone; announcing the step's size lets `MpiWorld::init` refuse that instead of
        // training the same run once per task.
        if let Some(tasks) = var("SLURM_STEP_NUM_TASKS") {
            let tasks = parse("SLURM_STEP_NUM_TASKS", &tasks)?;
            if tasks > 1 {
                return Ok(Launch::Mpi { launcher: "srun", world_size: Some(tasks) });
            }
        }
        if var("RANK").is_none() && var("WORLD_SIZE").is_none() {
            return Ok(Launch::Single);
        }
        let get = |name: &'static str| {
            var(name).ok_or(Error::Launch {
                variable: name,
                what: "is not set, though RANK or WORLD_SIZE is (torchrun sets all five)".into(),
            })
        };
        let rank = parse("RANK", &get("RANK")?)?;
        let world_size = parse("WORLD_SIZE", &get("WORLD_SIZE")?)?;
        let local_rank = parse("LOCAL_RANK", &get("LOCAL_RANK")?)?;
        let master_addr = get("MASTER_ADDR")?;
        let master_port = get("MASTER_PORT")?;
        let master_port =
            master_port.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| Error::Launch {
                variable: "MASTER_PORT",
                what: format!("`{master_port}` is not a port"),
            })?;
        if world_size == 0 || rank >= world_size {
            return Err(Error::Launch {
                variable: "RANK",
                what: format!("{rank} is not below WORLD_SIZE {world_size}"),
            });
        }
        Ok(Launch::Env { rank, world_size, local_rank, master_addr, master_port })
    }

    /// The variable that announced the world size, for messages.
    pub fn size_variable(&self) -> Option<&'static str> {
        match self {
            Launch::Mpi { launcher: "Open MPI", .. } => Some("OMPI_COMM_WORLD_SIZE"),
            Launch::Mpi { launcher: "PMI", .. } => Some("PMI_SIZE"),
            Launch::Mpi { launcher: "srun", .. } => Some("SLURM_STEP_NUM_TASKS"),
            Launch::Env { .. } => Some("WORLD_SIZE"),
            _ => None,
        }
    }
}

/// An `mpirun` command line that starts `processes` copies of a program on this host: append
/// the program and its arguments. With Open MPI it lets processes outnumber cores
/// (`--oversubscribe`), leaves thread placement to the OS (`--bind-to none`: a process runs
/// replica and data threads, which one core would serialize), allows running as root, as
/// containers do, and picks the ring algorithm for non-blocking all-reduces (see
/// [`OPEN_MPI_TUNING`]); with MPICH's `mpiexec` it passes only the count.
pub fn mpirun(processes: usize) -> Result<Command> {
    // By name, not path: Open MPI takes the directory of a path it is started by as its
    // installation prefix.
    let program =
        ["mpirun", "mpiexec"].into_iter().find(|name| in_path(name)).ok_or(Error::Launch {
            variable: "PATH",
            what: "has no mpirun or mpiexec: install Open MPI (Debian and Ubuntu: openmpi-bin \
               libopenmpi-dev) or MPICH"
                .into(),
        })?;
    let version = Command::new(program).arg("--version").output().map_err(|e| Error::Launch {
        variable: "PATH",
        what: format!("cannot run {program}: {e}"),
    })?;
    let mut command = Command::new(program);
    if String::from_utf8_lossy(&version.stdout).contains("Open MPI") {
        command.args(["--oversubscribe", "--bind-to", "none", "-np"]);
        command.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        for (name, value) in OPEN_MPI_TUNING {
            if std::env::var_os(name).is_none() {
                command.env(name, value);
            }
        }
    } else {
        command.arg("-n");
    }
    command.arg(processes.to_string());
    Ok(command)
}

/// Open MPI settings [`mpirun`] passes (as `OMPI_MCA_*` variables, unless already set):
/// `MPI_Iallreduce` by ring (`coll_libnbc_iallreduce_algorithm 1`). Open MPI 4.1's default
/// for 2 ranks moved 64 MiB at 0.9 GB/s on a 2-core machine; the ring moved it at 2.0 GB/s, and
/// beat Rabenseifner's algorithm at 3 ranks (1.22 against 1.08 GB/s busbw). Pass them to a
/// hand-made `mpirun` with `--mca coll_libnbc_iallreduce_algorithm 1`.
pub const OPEN_MPI_TUNING: [(&str, &str); 1] = [("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1")];

fn in_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| dir.join(name).is_file())
}

fn parse(name: &'static str, value: &str) -> Result<usize> {
    value.trim().parse().map_err(|_| Error::Launch {
        variable: name,
        what: format!("`{value}` is not a whole number"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn launch(vars: &[(&str, &str)]) -> Result<Launch> {
        let map: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Launch::from_vars(|name| map.get(name).cloned())
    }

    #[test]
    fn launchers_are_told_apart_by_their_variables() {
        assert_eq!(launch(&[]).unwrap(), Launch::Single);
        assert_eq!(
            launch(&[("OMPI_COMM_WORLD_SIZE", "4"), ("RANK", "1")]).unwrap(),
            Launch::Mpi { launcher: "Open MPI", world_size: Some(4) }
        );
        assert_eq!(
            launch(&[("PMI_SIZE", "2"), ("PMI_RANK", "0")]).unwrap(),
            Launch::Mpi { launcher: "PMI", world_size: Some(2) }
        );
        assert_eq!(
            launch(&[("PMIX_RANK", "3")]).unwrap(),
            Launch::Mpi { launcher: "PMIx", world_size: None }
        );
        assert_eq!(
            launch(&[("SLURM_STEP_NUM_TASKS", "4"), ("SLURM_PROCID", "2")]).unwrap(),
            Launch::Mpi { launcher: "srun", world_size: Some(4) }
        );
        // A batch script's single task is no launch.
        assert_eq!(launch(&[("SLURM_STEP_NUM_TASKS", "1")]).unwrap(), Launch::Single);
        let torchrun = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "29500"),
        ];
        assert_eq!(
            launch(&torchrun).unwrap(),
            Launch::Env {
                rank: 1,
                world_size: 2,
                local_rank: 1,
                master_addr: "node7".into(),
                master_port: 29500
            }
        );
    }

    #[test]
    fn malformed_variables_are_named() {
        let error = launch(&[("OMPI_COMM_WORLD_SIZE", "two")]).unwrap_err();
        assert_eq!(
            error,
            Error::Launch {
                variable: "OMPI_COMM_WORLD_SIZE",
                what: "`two` is not a whole number".into()
            }
        );
        let error = launch(&[("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(matches!(error, Error::Launch { variable: "LOCAL_RANK", .. }), "{error}");
        let bad_port = [
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "70000"),
        ];
        assert!(matches!(launch(&bad_port), Err(Error::Launch { variable: "MASTER_PORT", .. })));
        let bad_rank = [
            ("RANK", "2"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ];
        assert!(matches!(launch(&bad_rank), Err(Error::Launch { variable: "RANK", .. })));
    }
}
