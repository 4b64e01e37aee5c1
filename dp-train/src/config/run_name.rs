//! What a run's name may be.

use crate::error::{Error, Result};

/// Checks that `name` is one ordinary path component, so that the run directory
/// `out/<name>` is inside `out`: not empty, not `.` or `..`, no separator (which also makes an
/// absolute path impossible) and no NUL. A name like `../x` would otherwise put the run, and
/// the files it replaces, outside the directory the user gave.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let why = if name.is_empty() {
        Some("is empty")
    } else if name == "." || name == ".." {
        Some("names a directory itself, not a new one in --out")
    } else if name.contains('/') || name.contains('\\') {
        Some("holds a path separator")
    } else if name.contains('\0') {
        Some("holds a NUL byte")
    } else {
        None
    };
    match why {
        Some(why) => Err(Error::config(
            "name",
            format!(
                "`{name}` {why}: a run's name is one directory name under --out (as `mlp-digits`)"
            ),
        )),
        None => Ok(()),
    }
}
