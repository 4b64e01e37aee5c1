//! 16 x 16 `f32` transposes in AVX-512 registers: between a GEMM operand's rows and its
//! packed panels, and between a layer's channel-major planes and the direct convolutions'
//! channels in lanes.

use std::arch::x86_64::*;

/// The 16 x 16 matrix `rows` transposed: pairs of rows interleaved, then fours, then their
/// 128-bit lanes gathered.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn transpose(rows: [__m512; 16]) -> [__m512; 16] {
    // Per 128-bit lane `k`: `pairs[2g]` holds rows `2g, 2g + 1` at columns `4k, 4k + 1`
    // interleaved, `pairs[2g + 1]` at columns `4k + 2, 4k + 3`.
    let pairs: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (rows[i & !1], rows[i | 1]);
        if i % 2 == 0 { _mm512_unpacklo_ps(a, b) } else { _mm512_unpackhi_ps(a, b) }
    });
    // `fours[4g + m]` holds, in lane `k`, rows `4g..4g + 4` at column `4k + m`.
    let fours: [__m512; 16] = std::array::from_fn(|i| {
        let (g, m) = (i / 4, i % 4);
        let (a, b) = (pairs[4 * g + m / 2], pairs[4 * g + 2 + m / 2]);
        if m % 2 == 0 { _mm512_shuffle_ps::<0x44>(a, b) } else { _mm512_shuffle_ps::<0xEE>(a, b) }
    });
    // Column `4k + m` gathers lane `k` of `fours[m]`, `fours[4 + m]`, `fours[8 + m]` and
    // `fours[12 + m]`: lanes 0 and 2 (or 1 and 3) of two pairs, then of those.
    let mut columns = [_mm512_setzero_ps(); 16];
    for m in 0..4 {
        let even = _mm512_shuffle_f32x4::<0x88>(fours[m], fours[4 + m]);
        let odd = _mm512_shuffle_f32x4::<0xDD>(fours[m], fours[4 + m]);
        let even_high = _mm512_shuffle_f32x4::<0x88>(fours[8 + m], fours[12 + m]);
        let odd_high = _mm512_shuffle_f32x4::<0xDD>(fours[8 + m], fours[12 + m]);
        columns[m] = _mm512_shuffle_f32x4::<0x88>(even, even_high);
        columns[8 + m] = _mm512_shuffle_f32x4::<0xDD>(even, even_high);
        columns[4 + m] = _mm512_shuffle_f32x4::<0x88>(odd, odd_high);
        columns[12 + m] = _mm512_shuffle_f32x4::<0xDD>(odd, odd_high);
    }
    columns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_swap_rows_and_columns() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: the direct kernels need AVX-512F, which this CPU lacks");
            return;
        }
        let values: Vec<f32> = (0..256).map(|v| v as f32).collect();
        let mut out = vec![0f32; 256];
        // SAFETY: AVX-512F was detected; the buffers hold 16 rows of 16.
        unsafe {
            let rows = std::array::from_fn(|r| _mm512_loadu_ps(values[16 * r..].as_ptr()));
            for (r, column) in transpose(rows).into_iter().enumerate() {
                _mm512_storeu_ps(out[16 * r..].as_mut_ptr(), column);
            }
        }
        for (r, c) in (0..16).flat_map(|r| (0..16).map(move |c| (r, c))) {
            assert_eq!(out[16 * r + c], values[16 * c + r], "row {r} column {c}");
        }
    }
}
