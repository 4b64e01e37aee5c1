//! Keys a config used to spell differently, in other units, still read: each is rewritten to
//! today's key in bytes, with a line on standard error saying so, so that an older config
//! file, `--set`, or a saved run's config goes on meaning what it meant.

use crate::error::{Error, Result};

/// (old key, today's key, bytes per unit of the old value).
const RENAMED: [(&str, &str, f64); 3] = [
    ("memory_budget_mib", "model_budget", MIB),
    ("data_budget_mib", "data_budget", MIB),
    ("bucket_mib", "bucket_size", MIB),
];

const MIB: f64 = (1u64 << 20) as f64;

/// Rewrites the old keys of a config's table to today's; returns the deprecation lines, none
/// when it had no old key. An old key beside its new one is an error: which one was meant?
pub(super) fn upgrade(table: &mut toml::Table) -> Result<Vec<String>> {
    let mut said = Vec::new();
    for (old, new, _) in RENAMED {
        let Some(value) = table.remove(old) else { continue };
        if table.contains_key(new) {
            return Err(Error::config(old, format!("is the old name of `{new}`: give one")));
        }
        let (key, value, line) = upgrade_key(old, value)?;
        table.insert(key, value);
        said.extend(line);
    }
    Ok(said)
}

/// `key = value` as today's key and value, and the deprecation line when `key` is old.
pub(super) fn upgrade_key(
    key: &str,
    value: toml::Value,
) -> Result<(String, toml::Value, Option<String>)> {
    let Some(&(old, new, unit)) = RENAMED.iter().find(|(old, _, _)| *old == key) else {
        return Ok((key.to_string(), value, None));
    };
    let number = match value {
        toml::Value::Integer(n) => n as f64,
        toml::Value::Float(x) => x,
        other => {
            return Err(Error::config(old, format!("{other} is not a number (of MiB)")));
        }
    };
    let bytes = number * unit;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < i64::MAX as f64) {
        return Err(Error::config(old, format!("{number} MiB is not a size")));
    }
    let bytes = bytes.round() as i64;
    // As a config writes it: exact, in the largest unit that divides it (`"64MiB"`).
    let written =
        toml::Value::try_from(dp_mem::ByteSize(bytes as u64)).expect("a byte size serializes");
    let line =
        format!("warning: `{old} = {number}` is deprecated; it now reads as `{new} = {written}`");
    Ok((new.to_string(), toml::Value::Integer(bytes), Some(line)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TrainConfig;

    #[test]
    fn old_mib_keys_read_as_todays_byte_sizes_and_say_so() {
        let mut table: toml::Table = toml::from_str(
            "memory_budget_mib = 64\ndata_budget_mib = 512\nbucket_mib = 0.5\nseed = 3",
        )
        .unwrap();
        let said = upgrade(&mut table).unwrap();
        assert_eq!(said.len(), 3, "{said:?}");
        assert!(
            said[0].contains("`memory_budget_mib = 64` is deprecated")
                && said[0].contains("model_budget = \"64MiB\""),
            "{said:?}"
        );
        let config: TrainConfig = toml::Value::Table(table).try_into().unwrap();
        assert_eq!(config.model_budget, Some(dp_mem::ByteSize(64 << 20)));
        assert_eq!(config.data_budget, dp_mem::ByteSize(512 << 20));
        assert_eq!(config.bucket_size, dp_mem::ByteSize(512 << 10));
        assert_eq!(config.seed, 3);

        let mut both: toml::Table =
            toml::from_str("bucket_mib = 1\nbucket_size = \"1MiB\"").unwrap();
        let error = upgrade(&mut both).unwrap_err().to_string();
        assert!(error.contains("`bucket_mib`") && error.contains("give one"), "{error}");
        let mut text: toml::Table = toml::from_str("data_budget_mib = \"lots\"").unwrap();
        let error = upgrade(&mut text).unwrap_err().to_string();
        assert!(error.contains("`data_budget_mib`") && error.contains("not a number"), "{error}");
    }
}
