//! The AVX2 kernel of 8-bit optimizer state's quantisation: [`quantize`] as
//! [`super::quantized`]'s portable loop does it, eight values per instruction, with the same
//! `f32` operations in the same order as [`Grids::encode`], so a block gets the same codes on
//! every machine, with or without AVX2: replicas and processes stay bit for bit alike.
//! (Decoding, one table load a value, is no faster with AVX2's gathers.)

use std::arch::x86_64::*;

use super::codebook::{Codebook, Grids};

/// Whether this CPU runs the kernels (the answer is cached by the standard library).
#[inline]
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
}

/// A codebook's encoding tables in registers, one lane per grid.
struct Tables {
    signed: bool,
    zero_below: __m256,
    zero: __m256,
    starts: [__m256; 7],
    first: __m256,
    per_step: __m256,
    last: __m256,
    up: __m256,
    down: __m256,
}

impl Tables {
    #[target_feature(enable = "avx2")]
    fn of(book: &Grids) -> Self {
        // SAFETY: each array holds the eight `f32`s a load reads.
        let load = |grids: &[f32; 8]| unsafe { _mm256_loadu_ps(grids.as_ptr()) };
        Tables {
            signed: book.signed,
            zero_below: _mm256_set1_ps(book.zero_below),
            zero: _mm256_set1_ps(book.zero),
            starts: book.starts.map(|start| _mm256_set1_ps(start)),
            first: load(&book.first),
            per_step: load(&book.per_step),
            last: load(&book.last),
            up: load(&book.up),
            down: load(&book.down),
        }
    }

    /// The codes of eight values as `i32`s: [`Grids::encode`], lane by lane.
    #[target_feature(enable = "avx2")]
    fn encode(&self, y: __m256) -> __m256i {
        let sign = _mm256_set1_ps(-0.0);
        let a = if self.signed {
            _mm256_andnot_ps(sign, y)
        } else {
            _mm256_max_ps(y, _mm256_setzero_ps())
        };
        // The grid: how many starts `a` reaches (a true comparison is -1 as an integer).
        let mut grid = _mm256_setzero_si256();
        for &start in &self.starts {
            let reached = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(a, start));
            grid = _mm256_sub_epi32(grid, reached);
        }
        let first = _mm256_permutevar8x32_ps(self.first, grid);
        let per_step = _mm256_permutevar8x32_ps(self.per_step, grid);
        let place =
            _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(a, first), per_step), _mm256_set1_ps(0.5));
        // `max_ps` returns its second operand for NaN, as `f32::max` returns the non-NaN one.
        let clamped = _mm256_min_ps(
            _mm256_max_ps(place, _mm256_setzero_ps()),
            _mm256_permutevar8x32_ps(self.last, grid),
        );
        let k = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(clamped);
        // By `y`'s sign bit, as `is_sign_negative` and `copysign`.
        let base = _mm256_blendv_ps(
            _mm256_permutevar8x32_ps(self.up, grid),
            _mm256_permutevar8x32_ps(self.down, grid),
            y,
        );
        let code = _mm256_add_ps(base, _mm256_or_ps(k, _mm256_and_ps(y, sign)));
        let nonzero = _mm256_cmp_ps::<_CMP_GE_OQ>(a, self.zero_below);
        _mm256_cvttps_epi32(_mm256_blendv_ps(self.zero, code, nonzero))
    }
}

/// [`super::quantized::quantize`] with AVX2: the block's largest magnitude, and its values'
/// codes at that scale.
///
/// # Safety
/// The CPU has AVX2 ([`available`]).
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize(book: &Codebook, values: &[f32], codes: &mut [u8]) -> f32 {
    let absmax = absmax(values);
    let inverse = if absmax > 0.0 { 1.0 / absmax } else { 0.0 };
    let (tables, scale) = (Tables::of(&book.grids), _mm256_set1_ps(inverse));
    // Bytes of four registers of codes packed in lane order, put back in value order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut values_32 = values.chunks_exact(32);
    let mut codes_32 = codes.chunks_exact_mut(32);
    for (values, codes) in (&mut values_32).zip(&mut codes_32) {
        let [a, b, c, d] = std::array::from_fn(|i| {
            // SAFETY: the chunk holds 32 values.
            let y = unsafe { _mm256_loadu_ps(values.as_ptr().add(8 * i)) };
            tables.encode(_mm256_mul_ps(y, scale))
        });
        let bytes = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
        let bytes = _mm256_permutevar8x32_epi32(bytes, order);
        // SAFETY: the chunk holds 32 bytes.
        unsafe { _mm256_storeu_si256(codes.as_mut_ptr().cast(), bytes) };
    }
    for (code, &value) in codes_32.into_remainder().iter_mut().zip(values_32.remainder()) {
        *code = book.encode(value * inverse);
    }
    absmax
}

/// The largest magnitude of `values`, NaN skipped: the portable fold's answer (the maximum
/// of non-NaN values does not depend on their order).
#[target_feature(enable = "avx2")]
fn absmax(values: &[f32]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut lanes = [_mm256_setzero_ps(); 4];
    let mut chunks = values.chunks_exact(32);
    for chunk in &mut chunks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            // SAFETY: the chunk holds 32 values.
            let v = unsafe { _mm256_loadu_ps(chunk.as_ptr().add(8 * i)) };
            // The second operand on NaN: the running maximum skips it.
            *lane = _mm256_max_ps(_mm256_andnot_ps(sign, v), *lane);
        }
    }
    let mut out = [0f32; 32];
    for (i, lane) in lanes.iter().enumerate() {
        // SAFETY: `out` holds 32 values.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * i), *lane) };
    }
    out.iter().chain(chunks.remainder()).fold(0f32, |m, v| m.max(v.abs()))
}
