//! What a run learns: classes (an integer label) or a value (a float label), and the checks
//! that every label of the training and evaluation data is one of the classes.

use dp_data::{Block, DType, Dataset, Kind};

use crate::config::TrainConfig;
use crate::error::{Error, Result};

/// The task of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Task {
    /// Labels in `0..classes`, trained with the softmax cross-entropy.
    Classify { classes: usize },
    /// A float label regressed: one output, trained with the squared error.
    Regress,
}

impl Task {
    /// The task of `train`, the training data of `config`: a float label is a value to
    /// regress; an integer one names classes, every one of which is checked now (a bad one
    /// found hours in, or never in a short run, would have trained on nonsense).
    pub(crate) fn resolve(train: &Dataset, config: &TrainConfig) -> Result<Self> {
        let name = &config.label_feature;
        let label = train.schema().feature(name).ok_or_else(|| {
            Error::config(
                "label_feature",
                format!("`{name}` is not a feature of {}", config.train_data.display()),
            )
        })?;
        if !matches!(&label.kind, Kind::Dense { shape } if shape.iter().product::<usize>() == 1) {
            return Err(Error::config("label_feature", format!("`{name}` is not a scalar")));
        }
        if !label.dtype.is_float() {
            return Ok(Task::Classify { classes: classes_of(train, name, config.classes)? });
        }
        if config.classes.is_some() {
            return Err(Error::config(
                "classes",
                format!("`{name}` is a float feature, a value to regress, not classes"),
            ));
        }
        Ok(Task::Regress)
    }

    /// Outputs of the model: the classes, or 1 for a regression.
    pub(crate) fn outputs(self) -> usize {
        match self {
            Task::Classify { classes } => classes,
            Task::Regress => 1,
        }
    }

    pub(crate) fn is_regression(self) -> bool {
        self == Task::Regress
    }

    /// Refuses evaluation data whose labels the task cannot score: an integer label outside
    /// the classes, or not a float label for a regression. Now rather than at the first
    /// evaluation, hours in: evaluation sets are small.
    pub(crate) fn check_eval(
        self,
        eval: &Dataset,
        name: &str,
        path: &std::path::Path,
    ) -> Result<()> {
        match self {
            Task::Classify { classes } => check_labels(eval, name, classes),
            Task::Regress => {
                let dtype = eval.schema().feature(name).map(|f| f.dtype);
                if dtype.is_some_and(DType::is_float) {
                    return Ok(());
                }
                Err(Error::config(
                    "eval_data",
                    format!(
                        "`{name}` in {} is not a float feature like the training data's",
                        path.display()
                    ),
                ))
            }
        }
    }
}

/// The most classes a run takes: more would be an output layer of gigabytes, which a label
/// written by mistake (a float's bits, an id) asks for.
pub(crate) const MAX_CLASSES: usize = 1 << 20;

/// The smallest and largest label of the dataset, each with the first record holding it:
/// from the manifest's range when it has one (no block is read), else by reading every block.
fn label_range(dataset: &Dataset, name: &str) -> Result<dp_data::IntRange> {
    let dtype = dataset.schema().feature(name).map(|f| f.dtype);
    if !matches!(dtype, Some(DType::U8 | DType::I32 | DType::I64)) {
        return Err(Error::config("label_feature", format!("`{name}` must be u8, i32 or i64")));
    }
    if let Some(range) = dataset.manifest().ranges.get(name) {
        return Ok(*range);
    }
    let mut range: Option<dp_data::IntRange> = None;
    let mut labels = Vec::new();
    for block in dataset.blocks() {
        let block = block?;
        class_labels(&block, name, &mut labels)?;
        for (row, &label) in labels.iter().enumerate() {
            let record = block.first_record() + row as u64;
            let r = range.get_or_insert(dp_data::IntRange::new(label, record));
            r.add(label, record);
        }
    }
    range.ok_or_else(|| {
        Error::config("label_feature", format!("`{name}` has no records to take classes from"))
    })
}

/// The classes of a run on `train`: `configured`, or one more than the largest label; every
/// label must be one of them.
fn classes_of(train: &Dataset, name: &str, configured: Option<usize>) -> Result<usize> {
    let range = label_range(train, name)?;
    let classes = match configured {
        Some(c) if (2..=MAX_CLASSES).contains(&c) => c,
        Some(c) => {
            return Err(Error::config("classes", format!("{c} is outside 2..={MAX_CLASSES}")));
        }
        None if range.max < 1 && range.min >= 0 => {
            return Err(Error::config("classes", "the training labels have fewer than 2 classes"));
        }
        None => usize::try_from(range.max).map_or(MAX_CLASSES, |max| (max + 1).min(MAX_CLASSES)),
    };
    labels_within(range, classes)?;
    Ok(classes)
}

/// Checks that every label of the dataset is a class in `0..classes`, naming the first
/// record outside.
fn check_labels(dataset: &Dataset, name: &str, classes: usize) -> Result<()> {
    labels_within(label_range(dataset, name)?, classes)
}

/// An error naming the first record of `range`'s extremes that is outside `0..classes`.
fn labels_within(range: dp_data::IntRange, classes: usize) -> Result<()> {
    if range.min < 0 {
        return Err(label_error(range.min, range.min_record, classes));
    }
    if range.max >= classes as i64 {
        return Err(label_error(range.max, range.max_record, classes));
    }
    Ok(())
}

/// A block's class labels as `i64` into `out`; `false` (and nothing read) when `name` is not
/// a u8, i32 or i64 feature.
pub(crate) fn class_labels(block: &Block, name: &str, out: &mut Vec<i64>) -> Result<bool> {
    out.clear();
    match block.schema().feature(name).map(|f| f.dtype) {
        Some(DType::U8) => out.extend(block.dense::<u8>(name)?.iter().map(|&v| i64::from(v))),
        Some(DType::I32) => out.extend(block.dense::<i32>(name)?.iter().map(|&v| i64::from(v))),
        Some(DType::I64) => out.extend(block.dense::<i64>(name)?.iter()),
        _ => return Ok(false),
    }
    Ok(true)
}

/// A label outside `0..classes`.
pub(crate) fn label_error(label: i64, record: u64, classes: usize) -> Error {
    Error::config(
        "label_feature",
        format!("label {label} of record {record} is outside 0..{classes} (the classes)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_labels_are_classes_each_checked_and_a_float_label_is_a_value() {
        let dir = tempfile::tempdir().unwrap();
        let (train, config) = crate::plan::test_data::digits(dir.path());
        let task = Task::resolve(&train, &config).unwrap();
        assert_eq!(
            (task, task.outputs(), task.is_regression()),
            (Task::Classify { classes: 10 }, 10, false)
        );
        let eval = Dataset::open(dir.path().join("eval")).unwrap();
        task.check_eval(&eval, &config.label_feature, dir.path()).unwrap();
        // Fewer classes than the labels name: the first record outside is named.
        let few = TrainConfig { classes: Some(5), ..config.clone() };
        let error = Task::resolve(&train, &few).unwrap_err().to_string();
        assert!(error.contains("`label_feature`") && error.contains("outside 0..5"), "{error}");
        let error = Task::Classify { classes: 5 }.check_eval(&eval, "label", dir.path());
        assert!(error.unwrap_err().to_string().contains("outside 0..5"));
        // Evaluation data without a float label cannot score a regression.
        let error = Task::Regress.check_eval(&eval, "label", dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("`eval_data`") && error.contains("is not a float feature"),
            "{error}"
        );
        for (label, says) in [("nothing", "is not a feature of"), ("image", "is not a scalar")] {
            let config = TrainConfig { label_feature: label.into(), ..config.clone() };
            let error = Task::resolve(&train, &config).unwrap_err().to_string();
            assert!(error.contains("`label_feature`") && error.contains(says), "{error}");
        }
    }
}
