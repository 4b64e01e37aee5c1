//! A collective call as ranks describe it to each other, so that every backend can check that
//! all ranks called the same collective the same way before any buffer is touched.

use crate::element::{DType, ReduceOp};

/// The kinds of collectives, as recorded in a published call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce = 1,
    Broadcast,
    AllGather,
    ReduceScatter,
    Barrier,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::Broadcast => "broadcast",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Barrier => "barrier",
        }
    }

    pub(crate) fn from_code(code: u64) -> &'static str {
        [Kind::AllReduce, Kind::Broadcast, Kind::AllGather, Kind::ReduceScatter, Kind::Barrier]
            .into_iter()
            .find(|k| *k as u64 == code)
            .map_or("an unknown collective", Kind::name)
    }
}

/// A call's description, packed so that ranks compare calls with one load each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Desc {
    pub(crate) kind: Kind,
    pub(crate) dtype: Option<DType>,
    pub(crate) op: Option<ReduceOp>,
    pub(crate) root: usize,
}

impl Desc {
    pub(crate) fn pack(self) -> u64 {
        (self.kind as u64)
            | (self.dtype.map_or(0, |d| d.code() as u64) << 8)
            | (self.op.map_or(0, |o| o.code() as u64) << 16)
            | ((self.root as u64) << 32)
    }
}

/// Explains how two packed calls differ.
pub(crate) fn difference(mine: u64, theirs: u64, my_len: usize, their_len: usize) -> String {
    let field = |word: u64, shift: u32, bits: u32| (word >> shift) & ((1 << bits) - 1);
    if field(mine, 0, 8) != field(theirs, 0, 8) {
        format!("it called {}", Kind::from_code(field(theirs, 0, 8)))
    } else if field(mine, 8, 8) != field(theirs, 8, 8) {
        "it passed another element type".into()
    } else if field(mine, 16, 8) != field(theirs, 16, 8) {
        "it passed another reduce operation".into()
    } else if field(mine, 32, 32) != field(theirs, 32, 32) {
        format!("it passed root {} instead of {}", field(theirs, 32, 32), field(mine, 32, 32))
    } else {
        format!("it passed {their_len} elements instead of {my_len}")
    }
}
