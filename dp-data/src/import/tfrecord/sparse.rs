//! The TFRecord keys a caller declares sparse, as TensorFlow's feature specs do where the
//! first Example alone cannot tell: `tf.io.VarLenFeature` (a list of any length per record)
//! and `tf.io.SparseFeature` (an index list and a value list of equal length). Each becomes a
//! sparse `f32` feature of a declared width.

use super::example::{List, Parsed};

/// A key read as `tf.io.VarLenFeature`: a list of any length per record (none when the key is
/// missing), stored as the sparse feature named after the key, `width` wide.
///
/// A `float_list` is a variable-length vector: its values at positions `0..len` (`len` at
/// most `width`). An `int64_list` is a bag of ids, as an embedding bag reads it: positions
/// are the ids (each below `width`, the vocabulary), values how often each occurs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarLenFeature {
    /// The Example key.
    pub key: String,
    /// The sparse feature's width.
    pub width: usize,
}

/// Two keys read together as `tf.io.SparseFeature`: an `int64_list` of indices and a
/// `float_list` or `int64_list` of values, of equal length in every record, stored as the
/// sparse feature `name`, `width` wide. Indices need not be sorted; a repeated one is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseFeature {
    /// The sparse feature's name in the dataset.
    pub name: String,
    /// The key of the indices.
    pub index_key: String,
    /// The key of the values.
    pub value_key: String,
    /// The sparse feature's width: every index is below it.
    pub width: usize,
}

/// One record's sparse value, built in buffers reused from record to record.
#[derive(Debug, Default)]
pub(crate) struct SparseRow {
    pub(crate) positions: Vec<u64>,
    pub(crate) values: Vec<f32>,
    pairs: Vec<(u64, f32)>,
}

impl SparseRow {
    /// A `VarLenFeature`'s row from its list (`None`: the key is missing, an empty row).
    pub(crate) fn var_len(&mut self, parsed: Option<&Parsed>, width: usize) -> Result<(), String> {
        self.positions.clear();
        self.values.clear();
        let Some(parsed) = parsed else { return Ok(()) };
        match parsed.list {
            None => Ok(()),
            Some(List::Float) => {
                if parsed.floats.len() > width {
                    return Err(format!(
                        "a float_list of {} values, more than the declared width {width}",
                        parsed.floats.len()
                    ));
                }
                self.positions.extend(0..parsed.floats.len() as u64);
                self.values.extend_from_slice(&parsed.floats);
                Ok(())
            }
            Some(List::Int64) => {
                self.pairs.clear();
                for &id in &parsed.ints {
                    let position = check_index(id, width, "id")?;
                    self.pairs.push((position, 1.0));
                }
                self.pairs.sort_unstable_by_key(|&(p, _)| p);
                for &(p, _) in &self.pairs {
                    if self.positions.last() == Some(&p) {
                        if let Some(count) = self.values.last_mut() {
                            *count += 1.0;
                        }
                    } else {
                        self.positions.push(p);
                        self.values.push(1.0);
                    }
                }
                Ok(())
            }
            Some(List::Bytes) => Err("a bytes_list, which a sparse feature cannot hold".into()),
        }
    }

    /// A `SparseFeature`'s row from its index and value lists (both missing: an empty row).
    pub(crate) fn indexed(
        &mut self,
        index: Option<&Parsed>,
        value: Option<&Parsed>,
        width: usize,
    ) -> Result<(), String> {
        self.positions.clear();
        self.values.clear();
        self.pairs.clear();
        let empty = |p: Option<&Parsed>| p.is_none_or(|p| p.count() == 0);
        if empty(index) && empty(value) {
            return Ok(());
        }
        let (Some(index), Some(value)) = (index, value) else {
            return Err("the index list or the value list is missing while the other is not".into());
        };
        if index.list != Some(List::Int64) {
            return Err(format!("the indices are {}, not an int64_list", index.describe()));
        }
        let values: Vec<f32> = match value.list {
            Some(List::Float) => value.floats.clone(),
            Some(List::Int64) => value.ints.iter().map(|&v| v as f32).collect(),
            _ => {
                return Err(format!(
                    "the values are {}, not a float_list or int64_list",
                    value.describe()
                ));
            }
        };
        if values.len() != index.ints.len() {
            return Err(format!("{} indices but {} values", index.ints.len(), values.len()));
        }
        for (&i, &v) in index.ints.iter().zip(&values) {
            self.pairs.push((check_index(i, width, "index")?, v));
        }
        self.pairs.sort_unstable_by_key(|&(p, _)| p);
        if let Some(w) = self.pairs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(format!("index {} appears twice", w[0].0));
        }
        self.positions.extend(self.pairs.iter().map(|&(p, _)| p));
        self.values.extend(self.pairs.iter().map(|&(_, v)| v));
        Ok(())
    }
}

fn check_index(value: i64, width: usize, what: &str) -> Result<u64, String> {
    u64::try_from(value)
        .ok()
        .filter(|&p| p < width as u64)
        .ok_or_else(|| format!("{what} {value} is outside the declared width 0..{width}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Parsed {
        Parsed { list: Some(List::Int64), ints: values.to_vec(), ..Parsed::default() }
    }

    fn floats(values: &[f32]) -> Parsed {
        Parsed { list: Some(List::Float), floats: values.to_vec(), ..Parsed::default() }
    }

    #[test]
    fn var_len_ids_become_a_bag_and_floats_a_prefix() {
        let mut row = SparseRow::default();
        row.var_len(Some(&ints(&[7, 2, 7, 7, 0])), 10).unwrap();
        assert_eq!(
            (row.positions.clone(), row.values.clone()),
            (vec![0, 2, 7], vec![1.0, 1.0, 3.0])
        );
        row.var_len(Some(&floats(&[0.5, -1.0])), 4).unwrap();
        assert_eq!((row.positions.clone(), row.values.clone()), (vec![0, 1], vec![0.5, -1.0]));
        row.var_len(None, 4).unwrap();
        assert!(row.positions.is_empty() && row.values.is_empty());
        assert!(row.var_len(Some(&ints(&[10])), 10).unwrap_err().contains("id 10 is outside"));
        assert!(row.var_len(Some(&ints(&[-1])), 10).unwrap_err().contains("id -1"));
        assert!(row.var_len(Some(&floats(&[1.0; 5])), 4).unwrap_err().contains("5 values"));
    }

    #[test]
    fn indexed_rows_are_sorted_and_checked() {
        let mut row = SparseRow::default();
        row.indexed(Some(&ints(&[5, 1, 3])), Some(&floats(&[0.5, 0.1, 0.3])), 6).unwrap();
        assert_eq!(
            (row.positions.clone(), row.values.clone()),
            (vec![1, 3, 5], vec![0.1, 0.3, 0.5])
        );
        row.indexed(None, None, 6).unwrap();
        assert!(row.positions.is_empty());
        let cases = [
            (Some(ints(&[1, 1])), Some(floats(&[1.0, 2.0])), "index 1 appears twice"),
            (Some(ints(&[1, 2])), Some(floats(&[1.0])), "2 indices but 1 values"),
            (Some(ints(&[6])), Some(floats(&[1.0])), "index 6 is outside"),
            (Some(ints(&[1])), None, "missing"),
            (Some(floats(&[1.0])), Some(floats(&[1.0])), "not an int64_list"),
        ];
        for (index, value, what) in cases {
            let error = row.indexed(index.as_ref(), value.as_ref(), 6).unwrap_err();
            assert!(error.contains(what), "{what}: {error}");
        }
    }
}
