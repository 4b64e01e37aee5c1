//! The AVX-512 kernels of 8-bit optimizer state: [`quantize`] and [`dequantize`] as
//! [`super::quantized`]'s portable loops do them, with the same results on every machine.
//!
//! * [`quantize`] does [`Grids::encode`]'s `f32` operations sixteen lanes wide, and finds a
//!   value's grid from its binary exponent: a 32-entry table (two registers) gives the grids
//!   below each power of two and the one threshold, if any, within it, where the AVX2 kernel
//!   compares with all seven thresholds.
//! * [`dequantize`] uses VBMI's two-table byte permute, which looks a byte up among 128 in one
//!   instruction: each of a value's four bytes is two lookups and a blend (on the code's top
//!   bit) for 64 codes, where the portable loop loads one value per code.

use std::arch::x86_64::*;
use std::sync::LazyLock;

use super::codebook::{self, Codebook, GRIDS, Grids};

/// Whether this CPU runs the kernel (the answer is cached by the standard library).
#[inline]
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vbmi")
}

/// Biased exponents below this one share the first entry of the exponent tables (no
/// threshold between grids is below `2^-22`).
const LOWEST_EXPONENT: i32 = 104;

/// A codebook's encoding tables in registers.
struct Tables {
    signed: bool,
    zero_below: __m512,
    zero: __m512,
    /// By biased exponent less [`LOWEST_EXPONENT`] (clamped to `0..32`): the grids wholly
    /// below that power of two, and the threshold of the next within it (or infinity).
    below: [__m512i; 2],
    threshold: [__m512; 2],
    first: __m512,
    per_step: __m512,
    last: __m512,
    up: __m512,
    down: __m512,
}

/// The exponent tables of [`Tables`] (`below`, `threshold`), of the signed and the unsigned
/// codebook, built once.
static BY_EXPONENT: LazyLock<[([i32; 32], [f32; 32]); 2]> = LazyLock::new(|| {
    [&*codebook::SIGNED, &*codebook::UNSIGNED].map(|book| by_exponent(&book.grids))
});

/// For each entry `i` of the exponent tables, the grids wholly below its floats, and the
/// threshold of the next grid among them (or infinity).
fn by_exponent(grids: &Grids) -> ([i32; 32], [f32; 32]) {
    let (mut below, mut threshold) = ([0i32; 32], [f32::INFINITY; 32]);
    for i in 0..32 {
        // The floats of entry `i`: from its power of two (zero for the first) to the next.
        let low = if i == 0 { 0.0 } else { exponent_value(LOWEST_EXPONENT + i as i32) };
        let high = exponent_value(LOWEST_EXPONENT + i as i32 + 1);
        below[i] = grids.starts.iter().filter(|&&start| start <= low).count() as i32;
        let mut within = grids.starts.iter().filter(|&&start| start > low && start < high);
        threshold[i] = within.next().copied().unwrap_or(f32::INFINITY);
        // Thresholds are a decade apart: a power of two holds one at most.
        assert!(within.next().is_none(), "two thresholds between {low:e} and {high:e}");
    }
    (below, threshold)
}

impl Tables {
    #[target_feature(enable = "avx512f")]
    fn of(grids: &Grids) -> Self {
        let (below, threshold) = &BY_EXPONENT[usize::from(!grids.signed)];
        let grids_of = |table: &[f32; GRIDS]| {
            let mut lanes = [0f32; 16];
            lanes[..GRIDS].copy_from_slice(table);
            // SAFETY: `lanes` holds 16 values.
            unsafe { _mm512_loadu_ps(lanes.as_ptr()) }
        };
        // SAFETY: each half holds 16 values.
        let halves_i =
            |t: &[i32; 32]| unsafe { [0, 16].map(|h| _mm512_loadu_si512(t[h..].as_ptr().cast())) };
        // SAFETY: each half holds 16 values.
        let halves_f = |t: &[f32; 32]| unsafe { [0, 16].map(|h| _mm512_loadu_ps(t[h..].as_ptr())) };
        Tables {
            signed: grids.signed,
            zero_below: _mm512_set1_ps(grids.zero_below),
            zero: _mm512_set1_ps(grids.zero),
            below: halves_i(below),
            threshold: halves_f(threshold),
            first: grids_of(&grids.first),
            per_step: grids_of(&grids.per_step),
            last: grids_of(&grids.last),
            up: grids_of(&grids.up),
            down: grids_of(&grids.down),
        }
    }

    /// The codes of sixteen values as `i32`s: [`Grids::encode`], lane by lane.
    #[target_feature(enable = "avx512f")]
    fn encode(&self, y: __m512) -> __m512i {
        let zero = _mm512_setzero_ps();
        let a = if self.signed { _mm512_abs_ps(y) } else { _mm512_max_ps(y, zero) };
        // The grid: those below `a`'s power of two, and one more past the threshold in it.
        let exponent = _mm512_srli_epi32::<23>(_mm512_castps_si512(a));
        let entry = _mm512_min_epi32(
            _mm512_max_epi32(
                _mm512_sub_epi32(exponent, _mm512_set1_epi32(LOWEST_EXPONENT)),
                _mm512_setzero_si512(),
            ),
            _mm512_set1_epi32(31),
        );
        let below = _mm512_permutex2var_epi32(self.below[0], entry, self.below[1]);
        let threshold = _mm512_permutex2var_ps(self.threshold[0], entry, self.threshold[1]);
        let past = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, threshold);
        let grid = _mm512_mask_add_epi32(below, past, below, _mm512_set1_epi32(1));
        let first = _mm512_permutexvar_ps(grid, self.first);
        let per_step = _mm512_permutexvar_ps(grid, self.per_step);
        let place =
            _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(a, first), per_step), _mm512_set1_ps(0.5));
        // `max_ps` returns its second operand for NaN, as `f32::max` returns the non-NaN one.
        let clamped =
            _mm512_min_ps(_mm512_max_ps(place, zero), _mm512_permutexvar_ps(grid, self.last));
        let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(clamped);
        // Below zero (`y`'s sign bit set, as `is_sign_negative`): `down - k`, else `up + k`.
        let negative = _mm512_cmplt_epi32_mask(_mm512_castps_si512(y), _mm512_setzero_si512());
        let up = _mm512_add_ps(_mm512_permutexvar_ps(grid, self.up), k);
        let code = _mm512_mask_sub_ps(up, negative, _mm512_permutexvar_ps(grid, self.down), k);
        let nonzero = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, self.zero_below);
        _mm512_cvttps_epi32(_mm512_mask_blend_ps(nonzero, self.zero, code))
    }
}

/// The float `2^(exponent - 127)`, for a biased exponent in `1..255`.
fn exponent_value(exponent: i32) -> f32 {
    f32::from_bits((exponent as u32) << 23)
}

/// [`super::quantized::quantize`] with AVX-512: the block's largest magnitude, and its values'
/// codes at that scale.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VBMI ([`available`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(crate) unsafe fn quantize(book: &Codebook, values: &[f32], codes: &mut [u8]) -> f32 {
    let absmax = absmax(values);
    let inverse = if absmax > 0.0 { 1.0 / absmax } else { 0.0 };
    let (tables, scale) = (Tables::of(&book.grids), _mm512_set1_ps(inverse));
    let mut values_16 = values.chunks_exact(16);
    let mut codes_16 = codes.chunks_exact_mut(16);
    for (values, codes) in (&mut values_16).zip(&mut codes_16) {
        // SAFETY: the chunks hold 16 values and 16 bytes.
        unsafe {
            let y = _mm512_mul_ps(_mm512_loadu_ps(values.as_ptr()), scale);
            let bytes = _mm512_cvtepi32_epi8(tables.encode(y));
            _mm_storeu_si128(codes.as_mut_ptr().cast(), bytes);
        }
    }
    for (code, &value) in codes_16.into_remainder().iter_mut().zip(values_16.remainder()) {
        *code = book.encode(value * inverse);
    }
    absmax
}

/// The largest magnitude of `values`, NaN skipped: the portable fold's answer (the maximum
/// of non-NaN values does not depend on their order).
#[target_feature(enable = "avx512f")]
fn absmax(values: &[f32]) -> f32 {
    let mut lanes = [_mm512_setzero_ps(); 4];
    let mut chunks = values.chunks_exact(64);
    for chunk in &mut chunks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            // SAFETY: the chunk holds 64 values.
            let v = unsafe { _mm512_loadu_ps(chunk.as_ptr().add(16 * i)) };
            // The second operand on NaN: the running maximum skips it.
            *lane = _mm512_max_ps(_mm512_abs_ps(v), *lane);
        }
    }
    let mut out = [0f32; 64];
    for (i, lane) in lanes.iter().enumerate() {
        // SAFETY: `out` holds 64 values.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * i), *lane) };
    }
    out.iter().chain(chunks.remainder()).fold(0f32, |m, v| m.max(v.abs()))
}

/// Writes the values of `codes` at `scale` to `out` (as long as `codes`).
///
/// # Safety
/// The CPU has AVX-512 F, BW and VBMI ([`available`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(crate) unsafe fn dequantize(book: &Codebook, codes: &[u8], scale: f32, out: &mut [f32]) {
    // Byte `j` of every value, in four registers of 64 codes each.
    let planes: [[__m512i; 4]; 4] = std::array::from_fn(|j| {
        // SAFETY: each plane holds 256 bytes.
        std::array::from_fn(|q| unsafe {
            _mm512_loadu_si512(book.byte_planes()[j][64 * q..].as_ptr().cast())
        })
    });
    // The unpacking below puts the values of input group (4-byte) `4l + q` in lane `l` of
    // output register `q`; this order of the groups makes each register 16 values in a row.
    let groups = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let factor = _mm512_set1_ps(scale);
    let mut codes_64 = codes.chunks_exact(64);
    let mut out_64 = out.chunks_exact_mut(64);
    for (codes, out) in (&mut codes_64).zip(&mut out_64) {
        // SAFETY: the chunk holds 64 codes.
        let index = unsafe { _mm512_loadu_si512(codes.as_ptr().cast()) };
        let index = _mm512_permutexvar_epi32(groups, index);
        let high = _mm512_movepi8_mask(index);
        let [b0, b1, b2, b3] = planes.map(|[t0, t1, t2, t3]| {
            let low_half = _mm512_permutex2var_epi8(t0, index, t1);
            let high_half = _mm512_permutex2var_epi8(t2, index, t3);
            _mm512_mask_blend_epi8(high, low_half, high_half)
        });
        let (b01_low, b01_high) = (_mm512_unpacklo_epi8(b0, b1), _mm512_unpackhi_epi8(b0, b1));
        let (b23_low, b23_high) = (_mm512_unpacklo_epi8(b2, b3), _mm512_unpackhi_epi8(b2, b3));
        let values = [
            _mm512_unpacklo_epi16(b01_low, b23_low),
            _mm512_unpackhi_epi16(b01_low, b23_low),
            _mm512_unpacklo_epi16(b01_high, b23_high),
            _mm512_unpackhi_epi16(b01_high, b23_high),
        ];
        for (q, v) in values.into_iter().enumerate() {
            let scaled = _mm512_mul_ps(_mm512_castsi512_ps(v), factor);
            // SAFETY: the chunk holds 64 values.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * q), scaled) };
        }
    }
    for (o, &c) in out_64.into_remainder().iter_mut().zip(codes_64.remainder()) {
        *o = book.decode(c) * scale;
    }
}
