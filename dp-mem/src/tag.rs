//! The roles a buffer can play in training, used to attribute every byte.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a buffer is for. Every allocation through this crate carries one, so a memory report can
/// say where each byte went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Tag {
    /// Model parameters.
    Param,
    /// Gradients of the parameters.
    Grad,
    /// Optimizer state (momentum, Adam moments).
    OptState,
    /// Activations saved for backward, and their gradients.
    Activation,
    /// Input data: decompressed blocks, decoded records, batches.
    Data,
    /// Communication buffers (collective staging, compression).
    Comm,
    /// Short-lived scratch space.
    Temp,
}

/// The number of tags; the length of every per-tag table.
pub(crate) const TAG_COUNT: usize = 7;

impl Tag {
    /// Every tag, in report order.
    pub const ALL: [Tag; TAG_COUNT] =
        [Tag::Param, Tag::Grad, Tag::OptState, Tag::Activation, Tag::Data, Tag::Comm, Tag::Temp];

    /// The tag's name as it appears in reports.
    pub fn name(self) -> &'static str {
        match self {
            Tag::Param => "Param",
            Tag::Grad => "Grad",
            Tag::OptState => "OptState",
            Tag::Activation => "Activation",
            Tag::Data => "Data",
            Tag::Comm => "Comm",
            Tag::Temp => "Temp",
        }
    }

    /// The tag's position in [`Tag::ALL`], used to index per-tag tables.
    #[inline]
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The tag at `index` in [`Tag::ALL`], which must be below [`TAG_COUNT`]; the inverse of
    /// [`Tag::index`].
    #[inline]
    pub(crate) fn from_index(index: usize) -> Tag {
        match index {
            0 => Tag::Param,
            1 => Tag::Grad,
            2 => Tag::OptState,
            3 => Tag::Activation,
            4 => Tag::Data,
            5 => Tag::Comm,
            6 => Tag::Temp,
            _ => panic!("tag index {index} out of range"),
        }
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_matches_position_in_all() {
        for (i, tag) in Tag::ALL.iter().enumerate() {
            assert_eq!(tag.index(), i, "{tag}");
            assert_eq!(Tag::from_index(i), *tag);
        }
    }
}
