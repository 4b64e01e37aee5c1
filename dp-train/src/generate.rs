//! Text from a language model: the prompt's tokens fed to a KV-cache [`Generator`], then each
//! next token drawn from the softmax of the logits at a temperature, among the `top_k` most
//! likely (nanoGPT's `generate`), and the text streamed as it grows.

use std::time::Instant;

use dp_data::{Rng, Tokenizer};
use dp_model::{CudaGenerator, Generator};

use crate::error::{Error, Result};

/// How tokens are drawn.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleOptions {
    /// Tokens to generate after the prompt.
    pub tokens: usize,
    /// Divides the logits before the softmax: below 1 sharper, above 1 flatter; 0 always
    /// takes the most likely token.
    pub temperature: f64,
    /// Draw among this many most likely tokens (0: all of them).
    pub top_k: usize,
    /// The random stream's seed: the same seed, prompt and model give the same text.
    pub seed: u64,
}

impl Default for SampleOptions {
    /// nanoGPT's `sample.py`: 500 tokens at temperature 0.8 among the 200 most likely.
    fn default() -> Self {
        SampleOptions { tokens: 500, temperature: 0.8, top_k: 200, seed: 1337 }
    }
}

impl SampleOptions {
    fn check(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            let what = format!("{} is not a temperature (0 or more)", self.temperature);
            return Err(Error::config("temperature", what));
        }
        Ok(())
    }
}

/// What [`SavedRun::sample`](crate::SavedRun::sample) wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    /// The prompt's tokens (those fed: at most the context's last).
    pub prompt_tokens: usize,
    /// The tokens generated.
    pub tokens: Vec<u32>,
    /// Their text.
    pub text: String,
    /// Seconds from the first token fed to the last generated.
    pub seconds: f64,
}

/// What decodes a token at a time: the CPU's generator, or the GPU's with its KV cache in
/// device memory.
pub(crate) trait Decoder {
    /// Positions the model has.
    fn context(&self) -> usize;
    /// Tokens fed since the last reset.
    fn position(&self) -> usize;
    /// Starts a new sequence at position 0.
    fn reset(&mut self);
    /// Feeds `token` and returns the logits of the token after it.
    fn next(&mut self, token: usize) -> dp_model::Result<&[f32]>;
}

impl Decoder for Generator<'_, f32> {
    fn context(&self) -> usize {
        Generator::context(self)
    }
    fn position(&self) -> usize {
        Generator::position(self)
    }
    fn reset(&mut self) {
        Generator::reset(self);
    }
    fn next(&mut self, token: usize) -> dp_model::Result<&[f32]> {
        Generator::next(self, token)
    }
}

impl Decoder for CudaGenerator<'_> {
    fn context(&self) -> usize {
        CudaGenerator::context(self)
    }
    fn position(&self) -> usize {
        CudaGenerator::position(self)
    }
    fn reset(&mut self) {
        CudaGenerator::reset(self);
    }
    fn next(&mut self, token: usize) -> dp_model::Result<&[f32]> {
        CudaGenerator::next(self, token)
    }
}

/// Generates `options.tokens` tokens after `prompt` with `generator`, handing the text to
/// `emit` piece by piece as it is decoded (a piece is held back while it ends inside a
/// character).
///
/// The model sees at most its context: a longer prompt is cut to its last `context` tokens,
/// and when generation fills the context, the generator starts again from the last half of it
/// (learned positions cannot slide, so the cache is rebuilt), which keeps the cost linear in
/// the tokens generated.
pub(crate) fn generate(
    generator: &mut dyn Decoder,
    tokenizer: &Tokenizer,
    prompt: &str,
    options: &SampleOptions,
    mut emit: impl FnMut(&str) -> Result<()>,
) -> Result<Generated> {
    options.check()?;
    let mut history = tokenizer.encode(prompt)?;
    if history.is_empty() {
        return Err(Error::config("prompt", "the prompt has no tokens: give it some text"));
    }
    let context = generator.context();
    history.drain(..history.len().saturating_sub(context));
    let prompt_tokens = history.len();
    let started = Instant::now();
    let mut logits = Vec::new();
    feed(generator, &history, &mut logits)?;
    let mut rng = Rng::new(options.seed);
    let mut candidates = Vec::new();
    let (mut generated, mut emitted) = (Vec::new(), 0);
    for _ in 0..options.tokens {
        let next = pick(&logits, options, &mut rng, &mut candidates);
        generated.push(next);
        history.push(next);
        if generator.position() == context {
            generator.reset();
            let keep = (context / 2).max(1);
            feed(generator, &history[history.len() - keep..], &mut logits)?;
        } else {
            feed(generator, &[next], &mut logits)?;
        }
        let text = tokenizer.decode(&generated)?;
        if !text.ends_with(char::REPLACEMENT_CHARACTER)
            && let Some(new) = text.get(emitted..)
        {
            emit(new)?;
            emitted = text.len();
        }
    }
    let text = tokenizer.decode(&generated)?;
    if let Some(rest) = text.get(emitted..).filter(|rest| !rest.is_empty()) {
        emit(rest)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Generated { prompt_tokens, tokens: generated, text, seconds })
}

/// Feeds `tokens` in order and leaves the logits after the last in `logits`.
fn feed(generator: &mut dyn Decoder, tokens: &[u32], logits: &mut Vec<f32>) -> Result<()> {
    for &token in tokens {
        let next = generator.next(token as usize)?;
        logits.clear();
        logits.extend_from_slice(next);
    }
    Ok(())
}

/// The next token: the most likely at temperature 0, else drawn from the softmax of
/// `logits / temperature` over the `top_k` most likely (all with 0). `candidates` is scratch.
fn pick(
    logits: &[f32],
    options: &SampleOptions,
    rng: &mut Rng,
    candidates: &mut Vec<(f32, u32)>,
) -> u32 {
    let most_likely = || {
        let best = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1));
        best.map_or(0, |(id, _)| id as u32)
    };
    if options.temperature == 0.0 {
        return most_likely();
    }
    candidates.clear();
    candidates.extend(logits.iter().enumerate().map(|(id, &l)| (l, id as u32)));
    let k = match options.top_k {
        0 => candidates.len(),
        k => k.min(candidates.len()),
    };
    if k < candidates.len() {
        candidates.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
        candidates.truncate(k);
    }
    let max = candidates.iter().map(|c| c.0).fold(f32::NEG_INFINITY, f32::max);
    let inv = 1.0 / options.temperature;
    let weight = |l: f32| ((f64::from(l) - f64::from(max)) * inv).exp();
    let total: f64 = candidates.iter().map(|c| weight(c.0)).sum();
    if !(total.is_finite() && total > 0.0) {
        // Logits that are not numbers leave nothing to draw from.
        return most_likely();
    }
    let mut u = f64::from(rng.next_f32()) * total;
    for &(l, id) in candidates.iter() {
        u -= weight(l);
        if u < 0.0 {
            return id;
        }
    }
    candidates.last().map_or(0, |c| c.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(temperature: f64, top_k: usize) -> SampleOptions {
        SampleOptions { tokens: 1, temperature, top_k, seed: 3 }
    }

    #[test]
    fn temperature_zero_takes_the_most_likely_and_top_k_draws_only_among_the_k_best() {
        let logits = [0.5f32, 2.0, -1.0, 1.9, 0.0];
        let (mut rng, mut scratch) = (Rng::new(1), Vec::new());
        assert_eq!(pick(&logits, &options(0.0, 0), &mut rng, &mut scratch), 1);
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[pick(&logits, &options(1.0, 2), &mut rng, &mut scratch) as usize] += 1;
        }
        assert_eq!((seen[0], seen[2], seen[4]), (0, 0, 0), "{seen:?}");
        // exp(2.0) : exp(1.9) is 52.5% : 47.5%.
        let share = seen[1] as f64 / 2000.0;
        assert!((share - 0.525).abs() < 0.04, "{seen:?}");
    }

    #[test]
    fn a_high_temperature_flattens_the_draw_and_all_tokens_are_drawn_with_top_k_zero() {
        let logits = [0.0f32, 3.0, 0.0];
        let (mut rng, mut scratch) = (Rng::new(2), Vec::new());
        let mut seen = [0usize; 3];
        for _ in 0..3000 {
            seen[pick(&logits, &options(100.0, 0), &mut rng, &mut scratch) as usize] += 1;
        }
        // At temperature 100 the three are within a few percent of a third each.
        assert!(seen.iter().all(|&n| (900..1100).contains(&n)), "{seen:?}");
    }

    #[test]
    fn a_negative_or_undefined_temperature_is_refused_naming_it() {
        for t in [-0.5, f64::NAN, f64::INFINITY] {
            let error = options(t, 0).check().unwrap_err().to_string();
            assert!(error.contains("temperature"), "{error}");
        }
    }
}
