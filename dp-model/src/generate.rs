//! Generation with a KV cache: a language model run one token at a time, each attention
//! keeping the keys and values of the positions so far, so that a new token costs one row
//! through every layer and an attention over the cached rows, where a forward over the whole
//! window would redo every earlier position (GPT-2's `past_key_values`, llm.c's and
//! nanoGPT's generation without the recomputation).

use dp_mem::{Pool, PoolBuf, Tag};

use crate::error::{Error, Result};
use crate::float::Float;
use crate::model::Model;
use crate::ops::Op;
use crate::ops::add::Add;
use crate::ops::gemm::{Gemm, GemmBackend};
use crate::tape::{Node, Tape};

/// A language model's next-token logits, a token at a time: see [`Model::generator`].
///
/// It reads the model's parameters as they are when each token is fed, and evaluates as
/// [`Model::forward_eval`] does (dropout off), so position `p`'s logits equal that forward's
/// row `p` for the same tokens, up to the rounding of a different summation order.
#[derive(Debug)]
pub struct Generator<'m, T: Float = f32> {
    model: &'m Model<T>,
    /// Each node's output for the position being decoded: one row.
    rows: Vec<PoolBuf<T>>,
    /// Each attention node's keys and values of the positions so far, `[context, d]` each.
    caches: Vec<Option<(PoolBuf<T>, PoolBuf<T>)>>,
    scratch: PoolBuf<T>,
    gemm: Gemm,
    /// Tokens fed since the start (or the last [`Generator::reset`]).
    position: usize,
    context: usize,
}

impl<T: Float> Model<T> {
    /// A generator for this model, its rows and caches from `pool` (as activations). Fails
    /// unless the model is a language model made of per-token layers: a token embedding,
    /// then linear layers, norms, activations, dropout, residual sums and causal
    /// attention.
    pub fn generator(&self, pool: &Pool) -> Result<Generator<'_, T>> {
        let tape = self.tape();
        let context = decoding_context(tape)?;
        let (mut rows, mut caches) = (Vec::new(), Vec::new());
        for node in &tape.nodes {
            caches.push(match &node.op {
                Op::Attention(a) => {
                    let len = context * a.heads * a.head_dim;
                    let kv = (
                        pool.alloc_zeroed(len, Tag::Activation)?,
                        pool.alloc_zeroed(len, Tag::Activation)?,
                    );
                    Some(kv)
                }
                _ => None,
            });
            rows.push(pool.alloc_zeroed(node.out_len / context, Tag::Activation)?);
        }
        Ok(Generator {
            model: self,
            rows,
            caches,
            scratch: pool.alloc_zeroed(tape.attention_scratch_len(), Tag::Activation)?,
            gemm: Gemm::new(pool, GemmBackend::current(), self.options().precision)?,
            position: 0,
            context,
        })
    }
}

/// The context of a language model that decodes a token at a time (a token embedding, then
/// linear layers, norms, activations, dropout, residual sums, causal attention and a head,
/// each row its position's), or an error naming the first layer that cannot.
pub(crate) fn decoding_context(tape: &Tape) -> Result<usize> {
    let not_per_token = |node: &Node, why: &str| {
        Error::spec("layers", format!("{} ({why}) cannot decode a token at a time", node.name))
    };
    let context = match &tape.nodes[0].op {
        Op::Embedding(e) => e.t,
        _ => {
            return Err(Error::spec(
                "layers",
                "only a language model (a token embedding first) decodes tokens",
            ));
        }
    };
    for (i, node) in tape.nodes.iter().enumerate() {
        let per_token = i == 0 || (node.rows == context && node.in_len % context == 0);
        if !per_token || node.out_len % context != 0 {
            return Err(not_per_token(node, "it mixes positions"));
        }
        match &node.op {
            Op::Embedding(_)
            | Op::Linear(_)
            | Op::LayerNorm(_)
            | Op::Activation(_)
            | Op::Dropout(_)
            | Op::TiedHead(_)
            | Op::Attention(_) => {}
            Op::Add(add) if add.skip.is_some() => {}
            _ => return Err(not_per_token(node, "not a per-token layer")),
        }
    }
    Ok(context)
}

/// Refuses `token` at position `position` of a model that decodes (`tape`): an id outside its
/// vocabulary, or a position past its context; `input` names what is fed.
pub(crate) fn check_next(tape: &Tape, token: usize, position: usize, input: &str) -> Result<()> {
    let Op::Embedding(embedding) = &tape.nodes[0].op else { unreachable!("checked when made") };
    if token >= embedding.vocab {
        let expected = format!("a token id in 0..{}", embedding.vocab);
        return Err(Error::shape(input, expected, token));
    }
    if position == embedding.t {
        let expected = format!("at most {} tokens (the context)", embedding.t);
        return Err(Error::shape(input, expected, format!("token {}", position + 1)));
    }
    Ok(())
}

impl<T: Float> Generator<'_, T> {
    /// Positions the model has: at most this many tokens are fed before a [`Generator::reset`].
    pub fn context(&self) -> usize {
        self.context
    }

    /// Tokens fed so far: the position the next one takes.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Forgets the tokens fed, to start a new sequence at position 0.
    pub fn reset(&mut self) {
        self.position = 0;
    }

    /// Feeds `token` at the next position and returns the logits of the token after it
    /// (the vocabulary's). Fails on an id outside the vocabulary, or when the context is
    /// full (then [`Generator::reset`] and feed the tokens to keep again).
    pub fn next(&mut self, token: usize) -> Result<&[T]> {
        let nodes = &self.model.tape().nodes;
        let input = format!("{} input", self.model.spec().name);
        check_next(self.model.tape(), token, self.position, &input)?;
        let p = self.position;
        let params = self.model.params();
        for (i, node) in nodes.iter().enumerate() {
            let (before, rest) = self.rows.split_at_mut(i);
            let y = &mut rest[0][..];
            let read = |source: Option<usize>| -> &[T] {
                &before[source.expect("checked when made: only the embedding reads ids")]
            };
            match &node.op {
                Op::Embedding(e) => e.forward_row(params, token, p, y),
                Op::Linear(l) => l.forward(1, params, read(node.input), y, &mut self.gemm),
                Op::LayerNorm(n) => n.forward(1, params, read(node.input), y),
                Op::Activation(a) => a.forward(read(node.input), y),
                // Evaluation: dropout passes its input through.
                Op::Dropout(_) => y.copy_from_slice(read(node.input)),
                Op::Add(add) => Add::forward(read(node.input), read(add.skip), y),
                Op::TiedHead(h) => h.forward(1, params, read(node.input), y, &mut self.gemm),
                Op::Attention(a) => {
                    let (k_cache, v_cache) = self.caches[i].as_mut().expect("made with the node");
                    let d = a.heads * a.head_dim;
                    let qkv = read(node.input);
                    k_cache[p * d..(p + 1) * d].copy_from_slice(&qkv[d..2 * d]);
                    v_cache[p * d..(p + 1) * d].copy_from_slice(&qkv[2 * d..3 * d]);
                    a.decode(&qkv[..d], k_cache, v_cache, p + 1, y, &mut self.scratch);
                }
                _ => unreachable!("checked when made"),
            }
        }
        self.position += 1;
        Ok(&self.rows[nodes.len() - 1])
    }
}

#[cfg(test)]
mod tests {
    use dp_mem::{Pool, Tracker};
    use ndarray::Array2;

    use crate::{GptShape, LayerSpec, Model, ModelOptions, ModelSpec};

    /// A 2-block GPT over 11 tokens and 8 positions, with dropout (off when decoding), its
    /// head tied to the embedding or its own linear layer.
    fn gpt(tied: bool) -> ModelSpec {
        let shape = GptShape { layers: 2, heads: 2, dim: 16, dropout: 0.1 };
        let mut spec = ModelSpec::gpt("gpt", 11, 8, shape);
        if !tied {
            *spec.layers.last_mut().unwrap() = LayerSpec::Linear { out: 11 };
        }
        spec
    }

    #[test]
    fn decoding_a_token_at_a_time_equals_the_whole_windows_forward() {
        for tied in [true, false] {
            let pool = Pool::new(&Tracker::new());
            let spec = gpt(tied);
            let mut model = Model::<f64>::new(&spec, &pool, ModelOptions::new(1, 7)).unwrap();
            let tokens = [3usize, 1, 4, 1, 5, 9, 2, 6];
            let x = Array2::from_shape_fn((1, 8), |(_, p)| tokens[p] as f64);
            let whole = model.forward_eval(x.view()).unwrap().to_owned();
            let mut generator = model.generator(&pool).unwrap();
            for (p, &token) in tokens.iter().enumerate() {
                let logits = generator.next(token).unwrap();
                for (a, b) in logits.iter().zip(whole.row(p)) {
                    assert!((a - b).abs() < 1e-12, "tied {tied}, position {p}: {a} vs {b}");
                }
            }
            let full = generator.next(0).unwrap_err().to_string();
            assert!(full.contains("at most 8 tokens"), "{full}");
            generator.reset();
            let again = generator.next(3).unwrap();
            assert!((again[0] - whole[(0, 0)]).abs() < 1e-12);
        }
    }

    #[test]
    fn ids_outside_the_vocabulary_and_models_that_mix_positions_are_refused() {
        let pool = Pool::new(&Tracker::new());
        let model = Model::<f32>::new(&gpt(true), &pool, ModelOptions::new(1, 7)).unwrap();
        let mut generator = model.generator(&pool).unwrap();
        let error = generator.next(11).unwrap_err().to_string();
        assert!(error.contains("a token id in 0..11"), "{error}");
        assert_eq!(generator.position(), 0);
        let mlp = Model::<f32>::new(&ModelSpec::mlp(4, &[8], 3), &pool, ModelOptions::new(1, 7));
        let error = mlp.unwrap().generator(&pool).unwrap_err().to_string();
        assert!(error.contains("only a language model"), "{error}");
    }
}
