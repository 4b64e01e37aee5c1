//! Which gradients to all-reduce together, as backward makes them ready: adjacent layers'
//! ranges gather into one bucket until it holds at least the bucket size, so that NCCL gets
//! few large calls (each has a fixed cost) that still start before backward ends.

use std::ops::Range;

#[derive(Debug)]
pub(crate) struct Buckets {
    /// Gradients per bucket, at least.
    len: usize,
    /// Ready and not yet handed out.
    pending: Range<usize>,
}

impl Buckets {
    pub(crate) fn new(len: usize) -> Self {
        Buckets { len: len.max(1), pending: 0..0 }
    }

    /// The gradients in `range` are ready: the buckets to reduce now (a pending range that
    /// `range` does not continue goes first).
    pub(crate) fn ready(&mut self, range: Range<usize>) -> [Option<Range<usize>>; 2] {
        let mut out = [None, None];
        if range.start == self.pending.end {
            self.pending.end = range.end;
        } else {
            out[0] = self.rest();
            self.pending = range;
        }
        if self.pending.len() >= self.len {
            out[1] = self.rest();
        }
        out
    }

    /// What is still pending (backward is done).
    pub(crate) fn rest(&mut self) -> Option<Range<usize>> {
        let end = self.pending.end;
        let bucket = std::mem::replace(&mut self.pending, end..end);
        (!bucket.is_empty()).then_some(bucket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(len: usize, layers: &[Range<usize>]) -> Vec<Range<usize>> {
        let mut buckets = Buckets::new(len);
        let mut out: Vec<_> =
            layers.iter().flat_map(|r| buckets.ready(r.clone())).flatten().collect();
        out.extend(buckets.rest());
        out
    }

    #[test]
    fn adjacent_layers_gather_until_a_bucket_is_full() {
        let layers = [0..10, 10..15, 15..40, 40..41];
        assert_eq!(run(12, &layers), vec![0..15, 15..40, 40..41]);
        assert_eq!(run(1000, &layers), vec![0..41]);
        assert_eq!(run(1, &layers), layers.to_vec());
        // A bucket goes as soon as it holds the bucket size.
        assert_eq!(run(10, &[0..10, 10..20]), vec![0..10, 10..20]);
    }

    #[test]
    fn a_gap_closes_the_pending_bucket_and_every_gradient_goes_once() {
        assert_eq!(run(100, &[0..10, 20..30, 30..35]), vec![0..10, 20..35]);
        assert_eq!(run(100, &[]), Vec::<Range<usize>>::new());
        assert_eq!(run(5, &[0..3, 7..20]), vec![0..3, 7..20]);
    }
}
