//! The training input a run reads: which feature, its shape and type, whether it is sparse
//! or encoded images (then its shape is the samples', `[channels, size, size]`); and the
//! evaluation data's, which must be the same.

use std::path::Path;

use dp_data::{DType, Dataset, Kind};

use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::normalization::SavedInput;

/// The input feature of a run's training data, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Input {
    /// The feature's name: the configured one, or the data's only array (see [`feature`]).
    pub(crate) feature: String,
    /// Its shape per record (flattened when sparse).
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) sparse: bool,
    /// Encoded images, decoded to `shape` by the pipeline.
    pub(crate) image: bool,
}

impl Input {
    /// The input of `train`, the training data of `config`.
    pub(crate) fn resolve(train: &Dataset, config: &TrainConfig) -> Result<Self> {
        let feature = feature(train, config);
        let (shape, dtype, sparse, image) =
            input_of(train, &feature, &config.train_data, config.image_size)?;
        if !matches!(dtype, DType::U8 | DType::F32) {
            return Err(Error::config(
                "input_feature",
                format!("`{feature}` is {}; the trainer reads u8 or f32 inputs", dtype.name()),
            ));
        }
        Ok(Input { feature, shape, dtype, sparse, image })
    }

    /// What augmentation is resolved for.
    pub(crate) fn kind(&self) -> crate::augment::InputKind<'_> {
        crate::augment::InputKind {
            feature: &self.feature,
            shape: &self.shape,
            image: self.image,
            sparse: self.sparse,
        }
    }

    /// Elements per record.
    pub(crate) fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// What the run saves of it, to check the data of a resumed run against.
    pub(crate) fn saved(&self) -> SavedInput {
        SavedInput {
            dtype: self.dtype,
            shape: self.shape.clone(),
            sparse: self.sparse,
            image: self.image,
        }
    }

    /// Refuses evaluation data (`eval`, at `path`) without records or whose input differs.
    pub(crate) fn check_eval(&self, eval: &Dataset, path: &Path) -> Result<()> {
        // No records would score as a perfect evaluation, and the best one forever.
        if eval.is_empty() {
            return Err(Error::config(
                "eval_data",
                format!("{} has no records to evaluate on", path.display()),
            ));
        }
        // Images are decoded to the training samples' size and channels, whatever theirs.
        let size = self.image.then(|| self.shape[1]);
        let (eval_shape, _, eval_sparse, eval_image) = input_of(eval, &self.feature, path, size)?;
        if (self.image && eval_image)
            || (&eval_shape, eval_sparse, eval_image) == (&self.shape, self.sparse, self.image)
        {
            return Ok(());
        }
        let kind = |sparse| if sparse { "sparse " } else { "" };
        // Sparse widths differ when each split was imported alone, at the width of its own
        // largest index: say how to import them at one width.
        let hint = match (&eval_shape[..], &self.shape[..]) {
            ([a], [b]) if self.sparse && eval_sparse => format!(
                "; a width not given at import is the largest index of the files imported \
                 together: import both splits in one command, `dp data import --format \
                 svmlight --split train=TRAIN.svm --split eval=EVAL.svm --out DIR`, or give each \
                 import `--width {}`",
                a.max(b)
            ),
            _ => String::new(),
        };
        Err(Error::config(
            "eval_data",
            format!(
                "inputs are {}{eval_shape:?}, the training data's {}{:?}{hint}",
                kind(eval_sparse),
                kind(self.sparse),
                self.shape
            ),
        ))
    }
}

/// The input feature: as configured, or, when the configured name is the default (`image`)
/// and the data has no such feature, its only dense array besides the label (what the CSV
/// and npy importers write under other names).
fn feature(dataset: &Dataset, config: &TrainConfig) -> String {
    let configured = &config.input_feature;
    if dataset.schema().feature(configured).is_some()
        || *configured != TrainConfig::default().input_feature
    {
        return configured.clone();
    }
    let mut arrays = dataset.schema().features().iter().filter(|f| {
        f.name != config.label_feature
            && match &f.kind {
                Kind::Dense { shape } => !shape.is_empty(),
                Kind::Sparse { .. } | Kind::Image => true,
                Kind::Bytes => false,
            }
    });
    match (arrays.next(), arrays.next()) {
        (Some(only), None) => only.name.clone(),
        _ => configured.clone(),
    }
}

/// The input feature's shape and dtype, and whether it is sparse (its shape then flattened)
/// or encoded images (its shape then the samples', `[channels, size, size]`, of
/// `image_size` or the default for the images' sizes).
fn input_of(
    dataset: &Dataset,
    name: &str,
    dir: &Path,
    image_size: Option<usize>,
) -> Result<(Vec<usize>, DType, bool, bool)> {
    let feature = dataset.schema().feature(name).ok_or_else(|| {
        Error::config("input_feature", format!("`{name}` is not a feature of {}", dir.display()))
    })?;
    match &feature.kind {
        Kind::Dense { shape } if !shape.is_empty() => {
            Ok((shape.clone(), feature.dtype, false, false))
        }
        Kind::Sparse { shape } => Ok((vec![shape.iter().product()], feature.dtype, true, false)),
        Kind::Image => {
            let counts = dataset.manifest().images.get(name).ok_or_else(|| {
                Error::config(
                    "input_feature",
                    format!("the manifest of {} does not count its images `{name}`", dir.display()),
                )
            })?;
            let size = image_size.unwrap_or_else(|| counts.sample_size());
            Ok((vec![counts.channels(), size, size], DType::U8, false, true))
        }
        _ => Err(Error::config(
            "input_feature",
            format!(
                "`{name}` in {} is not a dense array, a sparse feature or images",
                dir.display()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_is_the_configured_feature_and_evaluation_data_must_match_it() {
        let dir = tempfile::tempdir().unwrap();
        let (train, config) = crate::plan::test_data::digits(dir.path());
        let input = Input::resolve(&train, &config).unwrap();
        assert_eq!(
            (&input.feature[..], &input.shape[..], input.sparse),
            ("image", &[28, 28][..], false)
        );
        assert_eq!((input.dtype, input.len()), (DType::U8, 784));
        let eval = Dataset::open(dir.path().join("eval")).unwrap();
        input.check_eval(&eval, dir.path()).unwrap();
        // Evaluation data whose input is another shape is refused, saying both.
        let other = Input { shape: vec![784], ..input.clone() };
        let error = other.check_eval(&eval, dir.path()).unwrap_err().to_string();
        assert!(error.contains("`eval_data`") && error.contains("inputs are [28, 28]"), "{error}");
        let named = TrainConfig { input_feature: "pixels".into(), ..config };
        let error = Input::resolve(&train, &named).unwrap_err().to_string();
        assert!(
            error.contains("`input_feature`") && error.contains("`pixels` is not a feature"),
            "{error}"
        );
    }
}
