//! `cargo xtask bench`: every benchmark section, each against a reference measured in the same
//! run. Only the `xtask` binary has this tree; `dp` links none of it.

mod bf16;
mod bf16act;
mod checkpoints;
mod comm;
mod corpus;
mod criterion;
pub(crate) mod data;
mod images;
mod largest;
mod lm;
mod objects;
mod optim8;
mod support;
mod train;

use std::path::Path;

use anyhow::Result;

pub(crate) use comm::mpi_rank;

/// `cargo xtask bench [CRATE] [--filter F]`: the criterion benchmarks of a crate (or all), with
/// the sections measured here after them; `comm` and `train` are sections of their own.
pub(crate) fn run(root: &Path, krate: Option<&str>, filter: Option<&str>) -> Result<()> {
    match krate {
        Some("comm") => return comm::run(root),
        Some("train") => return train::run(root, filter),
        _ => {}
    }
    criterion::run(root, krate, filter)?;
    // Data's benchmarks end with the image section and object storage, measured in this run.
    let data = matches!(krate, Some("data" | "dp-data"));
    if data && filter.is_none_or(|f| f == "images") {
        images::run(root)?;
    }
    if data && filter.is_none_or(|f| f == "objects") {
        objects::run(root)?;
    }
    Ok(())
}
