//! A token batch's rows sorted by id, on the host: what the embedding table's gradient gathers
//! by on the device instead of scattering with atomics.

/// A batch's token rows sorted by id (stably), as the table gradient's gather reads them: the
/// rows, where each distinct id's run starts (and, last, where the runs end), and the ids.
#[derive(Default)]
pub(super) struct TokenSort {
    pub(super) order: Vec<i64>,
    pub(super) starts: Vec<i64>,
    pub(super) ids: Vec<i64>,
}

impl TokenSort {
    /// Sorts the token ids `ids` (checked integers in the vocabulary).
    pub(super) fn of(&mut self, ids: &[f32]) {
        self.order.clear();
        self.order.extend(0..ids.len() as i64);
        self.order.sort_by_key(|&r| (ids[r as usize] as i64, r));
        self.starts.clear();
        self.ids.clear();
        for (k, &r) in self.order.iter().enumerate() {
            let id = ids[r as usize] as i64;
            if self.ids.last() != Some(&id) {
                self.ids.push(id);
                self.starts.push(k as i64);
            }
        }
        self.starts.push(self.order.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::TokenSort;

    #[test]
    fn rows_are_sorted_by_id_stably_into_runs() {
        let mut sort = TokenSort::default();
        sort.of(&[2.0, 5.0, 2.0, 0.0, 2.0]);
        assert_eq!(sort.order, [3, 0, 2, 4, 1]);
        assert_eq!(sort.starts, [0, 1, 4, 5]);
        assert_eq!(sort.ids, [0, 2, 5]);
        // Reused for the next batch, nothing of the last one left.
        sort.of(&[1.0]);
        assert_eq!(
            (sort.order.as_slice(), sort.starts.as_slice(), sort.ids.as_slice()),
            (&[0][..], &[0, 1][..], &[1][..])
        );
    }
}
