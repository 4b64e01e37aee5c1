//! Errors in the words of the config: the key to change, not the library call behind it.

use dp_mem::ByteSize;

use super::TrainConfig;
use crate::error::Error;

impl TrainConfig {
    /// A budget error in the words of this config: the key to change, not the library call
    /// behind it. Other errors pass through.
    pub(crate) fn explain(&self, error: Error) -> Error {
        let out_of_memory = match &error {
            Error::Memory(dp_mem::Error::OutOfMemory(report)) => Some(report),
            Error::Model(dp_model::Error::Memory(dp_mem::Error::OutOfMemory(report))) => {
                Some(report)
            }
            _ => None,
        };
        if let (Some(report), Some(budget)) = (out_of_memory, self.model_budget) {
            let held: Vec<String> = report
                .reserved_by_tag
                .iter()
                .filter(|(_, bytes)| *bytes > 0)
                .map(|(tag, bytes)| format!("{tag} {}", ByteSize(*bytes)))
                .collect();
            return Error::config(
                "model_budget",
                format!(
                    "{budget} per replica is too small: {} more for {} did not fit beside {} held ({}); raise model_budget, or lower global_batch, or set recompute or zero_stage = 1",
                    ByteSize(report.requested),
                    report.tag,
                    ByteSize(report.held),
                    if held.is_empty() { "nothing yet".into() } else { held.join(", ") }
                ),
            );
        }
        let refused = match &error {
            Error::Memory(e @ dp_mem::Error::Backend { tag: Some(tag), .. })
            | Error::Model(dp_model::Error::Memory(
                e @ dp_mem::Error::Backend { tag: Some(tag), .. },
            ))
            | Error::Data(dp_data::Error::Memory(
                e @ dp_mem::Error::Backend { tag: Some(tag), .. },
            )) => Some((e.to_string(), *tag)),
            // A shard the system would not map: the same shortage, met by the data.
            Error::Data(e @ dp_data::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::OutOfMemory =>
            {
                Some((e.to_string(), dp_mem::Tag::Data))
            }
            _ => None,
        };
        if let Some((what, tag)) = refused {
            let key = if tag == dp_mem::Tag::Data { "data_budget" } else { "model_budget" };
            let limit = dp_mem::address_space_limit()
                .map_or(String::new(), |bytes| format!(" (ulimit -v is {} MiB)", bytes >> 20));
            return Error::config(
                key,
                format!(
                    "the system refused memory the budgets allowed ({what}): this machine, or its address-space limit{limit}, holds less than the run needs; lower replicas, global_batch, data_workers, data_prefetch or shuffle_window, or raise the limit; with {key} set to what the machine has, a run that does not fit stops at setup"
                ),
            );
        }
        match error {
            Error::Data(dp_data::Error::Budget { budget, needed, detail }) => Error::config(
                "data_budget",
                format!(
                    "{} per replica cannot hold its input pipeline's working set of {} ({detail}); raise data_budget, or lower shuffle_window, data_prefetch or data_workers",
                    ByteSize(budget),
                    ByteSize(needed)
                ),
            ),
            other => other,
        }
    }
}
