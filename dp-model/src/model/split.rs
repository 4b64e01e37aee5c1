//! Borrowing one buffer of a list to write while reading the others.

use dp_mem::PoolBuf;

use crate::float::Float;

/// The output buffer of a node, and the others to read its inputs from.
pub(super) fn split_out<U>(bufs: &mut [U], out: usize) -> (&mut U, Others<'_, U>) {
    let (before, rest) = bufs.split_at_mut(out);
    let (output, after) = rest.split_first_mut().expect("an output buffer");
    (output, Others { before, after })
}

/// Every buffer but one, by index.
pub(super) struct Others<'a, U> {
    before: &'a [U],
    after: &'a [U],
}

impl<'a, U> Others<'a, U> {
    pub(super) fn get(&self, index: usize) -> &'a U {
        match index.checked_sub(self.before.len()) {
            None => &self.before[index],
            Some(k) => &self.after[k - 1],
        }
    }
}

/// Buffer `read` and buffer `write` (or a dummy write when `write` is out of range).
pub(super) fn read_write<T: Float>(
    bufs: &mut [PoolBuf<T>],
    read: usize,
    write: usize,
) -> (&[T], &mut [T]) {
    if write >= bufs.len() {
        return (&bufs[read][..], &mut []);
    }
    let (write_buf, others) = split_out(bufs, write);
    (&others.get(read)[..], &mut write_buf[..])
}
