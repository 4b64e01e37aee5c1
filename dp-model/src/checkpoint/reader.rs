//! Reading a checkpoint straight into a model's and an optimizer's buffers.

use std::ops::Range;
use std::path::{Path, PathBuf};

use super::frame::Frame;
use super::{CheckpointHeader, MAGIC, WHAT, shard, values};
use crate::error::{Error, Result};
use crate::float::Float;
use crate::model::Model;
use crate::optim::Optimizer;
use crate::shared::SharedParams;
use crate::spec::ModelSpec;

/// An open checkpoint, checked whole, from which the parameters and then the optimizer state
/// (any range of it) are read in one pass.
pub struct CheckpointReader {
    header: CheckpointHeader,
    frame: Frame,
    path: PathBuf,
    at: Section,
}

/// Where the reader is in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Params,
    Optimizer,
    End,
}

impl CheckpointReader {
    /// Opens the checkpoint at `path` after reading it through once: a damaged, truncated or
    /// inconsistent file is an error here, before anything is restored from it.
    pub fn open(path: &Path) -> Result<Self> {
        let (header, mut frame) = Frame::open::<CheckpointHeader>(path, MAGIC, WHAT)?;
        let fail = |what: String| Error::Checkpoint { path: path.to_path_buf(), what };
        let width = usize::from(header.value_bytes);
        if !matches!(width, 4 | 8) || header.tensors.len() != header.layout.tensors().len() {
            return Err(fail(format!(
                "damaged ({} tensors of {width}-byte values, its layout has {})",
                header.tensors.len(),
                header.layout.tensors().len()
            )));
        }
        for (t, meta) in header.tensors.iter().zip(header.layout.tensors()) {
            values::read(&mut frame, &t.name, (meta.len(), width), t.nonzeros, None)?;
        }
        if let Some(optimizer) = header.optimizer.as_ref().filter(|o| o.shards.is_empty()) {
            if optimizer.len != header.layout.len() {
                return Err(fail(format!(
                    "damaged (optimizer state over {} parameters, the model has {})",
                    optimizer.len,
                    header.layout.len()
                )));
            }
            frame.skip(super::sections_bytes(&optimizer.sections(width), optimizer.len))?;
        }
        // The second pass reads the very file the first checked, even if another has been
        // renamed over its name meanwhile.
        let file = frame.finish()?;
        let (_, frame) = Frame::reopen::<CheckpointHeader>(file, path, MAGIC, WHAT)?;
        Ok(Self { header, frame, path: path.to_path_buf(), at: Section::Params })
    }

    /// Opens the checkpoint at `path` and restores its parameters into `model`; returns its
    /// header (optimizer and caller state). A failed load leaves `model` as it was.
    pub fn load_into<T: Float>(path: &Path, model: &mut Model<T>) -> Result<CheckpointHeader> {
        let mut reader = Self::open(path)?;
        reader.restore_params(model)?;
        Ok(reader.header)
    }

    /// What the file says before its values.
    pub fn header(&self) -> &CheckpointHeader {
        &self.header
    }

    /// Reads the parameters into `model`, which must be built from the same spec (its
    /// fingerprint) with the same value type; they come first, so this is called first.
    pub fn restore_params<T: Float>(&mut self, model: &mut Model<T>) -> Result<()> {
        let (name, fingerprint) = (model.spec().name.clone(), model.spec().fingerprint());
        self.check_model(&name, fingerprint, model.layout() == &self.header.layout)?;
        self.restore_buffers(model)?;
        self.read_params(model.params_mut())
    }

    /// Sets `model`'s buffers (batch norms' running statistics) to the saved ones
    /// ([`CheckpointReader::restore_params`] does it too; a model whose parameters are
    /// shared calls this for its own buffers).
    pub fn restore_buffers<T: Float>(&self, model: &mut Model<T>) -> Result<()> {
        let (name, fingerprint) = (model.spec().name.clone(), model.spec().fingerprint());
        self.check_model(&name, fingerprint, model.layout() == &self.header.layout)?;
        let buffers = model.buffers_mut();
        if buffers.len() != self.header.buffers.len() {
            return Err(self.fail(format!(
                "holds {} buffer values, the model has {}",
                self.header.buffers.len(),
                buffers.len()
            )));
        }
        for (b, &v) in buffers.iter_mut().zip(&self.header.buffers) {
            *b = T::of(v);
        }
        Ok(())
    }

    /// Reads the parameters into `params` while no model shares them yet (see
    /// [`SharedParams::get_mut`]); `spec` is their model's.
    pub fn restore_shared<T: Float>(
        &mut self,
        spec: &ModelSpec,
        params: &mut SharedParams<T>,
    ) -> Result<()> {
        let same_layout = spec.layout().is_ok_and(|layout| layout == self.header.layout);
        self.check_model(&spec.name, spec.fingerprint(), same_layout)?;
        let Some(values) = params.get_mut() else {
            return Err(self.fail("the shared parameters are in use by a model".into()));
        };
        self.read_params(values)
    }

    fn check_model(&self, name: &str, fingerprint: u64, same_layout: bool) -> Result<()> {
        let header = &self.header;
        if header.fingerprint != fingerprint || !same_layout {
            return Err(self.fail(format!(
                "saved for model `{}` (spec {:016x}), loading into `{name}` (spec {fingerprint:016x}); the specs differ",
                header.model, header.fingerprint,
            )));
        }
        Ok(())
    }

    fn read_params<T: Float>(&mut self, params: &mut [T]) -> Result<()> {
        self.check_width::<T>()?;
        if self.at != Section::Params {
            return Err(self.fail("the parameters were read past already".into()));
        }
        if params.len() != self.header.layout.len() {
            let what =
                format!("{} parameters, loading into {}", self.header.layout.len(), params.len());
            return Err(self.fail(what));
        }
        for (t, meta) in self.header.tensors.iter().zip(self.header.layout.tensors()) {
            let dst = bytemuck::cast_slice_mut(&mut params[meta.range()]);
            values::read(
                &mut self.frame,
                &t.name,
                (meta.len(), size_of::<T>()),
                t.nonzeros,
                Some(dst),
            )?;
        }
        self.at = Section::Optimizer;
        Ok(())
    }

    /// Reads the state of `optimizer`, which covers `range` of the parameters, from the
    /// checkpoint or from the shard files it names, whatever ranges those were saved for.
    pub fn restore_optimizer<T: Float>(
        &mut self,
        optimizer: &mut dyn Optimizer<T>,
        range: Range<usize>,
    ) -> Result<()> {
        self.check_width::<T>()?;
        let Some(meta) = self.header.optimizer.clone() else {
            return Err(self.fail("holds no optimizer state".into()));
        };
        let len = optimizer.len();
        let state = optimizer.state_mut();
        let bits = state.precision.bits();
        if bits != meta.bits {
            return Err(self.fail(format!(
                "holds optimizer state of optimizer_bits = {}, loading into an optimizer of optimizer_bits = {bits}: 8-bit state is never converted; resume with the checkpoint's optimizer_bits",
                meta.bits
            )));
        }
        let state_buffers = state.buffers.len() + state.quantized.len();
        if state.kind != meta.kind
            || state_buffers != meta.buffers
            || range.end > meta.len
            || range.len() != len
        {
            return Err(self.fail(format!(
                "holds {} state ({} buffers) over {} parameters, loading {} ({} buffers) over {range:?} of them",
                meta.kind, meta.buffers, meta.len, state.kind, state_buffers
            )));
        }
        let sections = meta.sections(size_of::<T>());
        // Quantised state is read whole blocks at a time, so the range must be whole blocks.
        if let Some(&(_, per)) = sections.iter().max_by_key(|s| s.1)
            && (!range.start.is_multiple_of(per)
                || (!range.end.is_multiple_of(per) && range.end != meta.len))
        {
            return Err(self.fail(format!(
                "holds 8-bit optimizer state in blocks of {per} parameters; {range:?} is not whole blocks of it"
            )));
        }
        let (steps, mut buffers) = super::state_bytes_mut(state);
        if meta.shards.is_empty() {
            if self.at == Section::Params {
                self.frame.skip(self.header.params_bytes())?;
            } else if self.at == Section::End {
                return Err(self.fail("the optimizer state was read past already".into()));
            }
            for (buffer, &(width, per)) in buffers.iter_mut().zip(&sections) {
                self.frame.skip((range.start / per * width) as u64)?;
                self.frame.read(buffer)?;
                let rest = meta.len.div_ceil(per) - range.end.div_ceil(per);
                self.frame.skip((rest * width) as u64)?;
            }
            self.at = Section::End;
        } else {
            // Every shard read from is checked whole first, so that a damaged one changes
            // nothing.
            let dir = self.path.parent().unwrap_or(Path::new("."));
            let files: Vec<_> = (meta.shards.iter())
                .filter(|s| s.start < range.end && range.start < s.end)
                .collect();
            let covered = files.first().is_none_or(|f| f.start <= range.start)
                && files.windows(2).all(|w| w[0].end == w[1].start)
                && files.last().is_none_or(|f| f.end >= range.end);
            if !covered || (files.is_empty() && !range.is_empty()) {
                return Err(self.fail(format!("its shard files do not cover {range:?}")));
            }
            for file in &files {
                shard::read_part(dir, file, &meta, (size_of::<T>(), &sections), &range, None)?;
            }
            for file in &files {
                let part = (size_of::<T>(), &sections[..]);
                shard::read_part(dir, file, &meta, part, &range, Some(&mut buffers))?;
            }
        }
        *steps = meta.steps;
        Ok(())
    }

    fn check_width<T: Float>(&self) -> Result<()> {
        if usize::from(self.header.value_bytes) != size_of::<T>() {
            return Err(self.fail(format!(
                "values are {} bytes, the model's {}",
                self.header.value_bytes,
                size_of::<T>()
            )));
        }
        Ok(())
    }

    fn fail(&self, what: String) -> Error {
        Error::Checkpoint { path: self.path.clone(), what }
    }
}
