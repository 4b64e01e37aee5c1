//! Kernels for x86-64. Register tiles keep rows of `c` in accumulators and broadcast a word of
//! `a` against whole vectors of `b`:
//!
//! * [`Avx512Wide`]: 64 `f32` columns (four zmm) by up to 6 rows, the fewest loads per FMA.
//! * [`Avx512`]: 32 columns (two zmm) by up to 12 rows, 24 of the 32 registers summing.
//! * [`Avx512Narrow`]: 16 columns by up to 24 rows, for outputs a few columns wide.
//! * [`Amx`]: `bf16` products summed in `f32` on the matrix unit, 32 x 32 per tile.
//! * [`Avx512Bf16`]: `bf16` pairs summed in `f32` by AVX512_BF16's `vdpbf16ps`, the tiles of
//!   [`Avx512`] with a pair of `k` per word: twice the products of an `f32` FMA per
//!   instruction, for CPUs with AVX512_BF16 but no AMX (AMD since Zen 4, Intel's Cooper
//!   Lake). (On the Xeons with AMX measured it issues at half the rate, no faster than `f32`.)
//! * [`Avx2`]: 16 columns (two ymm) by up to 6 rows, 12 of the 16 registers summing.
//!
//! and [`avx512_dots`] and [`avx2_dots`] sum dot products for a small output over a long `k`.
//! Each kernel is compiled for its features alone and only runs where they were detected.

use std::arch::x86_64::*;

use super::packed::{Panel, Strided, StridedMut, Tile, TileOut, bf16_pair, pack};
use crate::ops::register_transpose::transpose;

/// Chooses the instantiation for tile height `mr` (one of the kernel's `MRS`) and for `a`
/// packed (`line` 1, `step` `mr`: constant offsets) or read in place.
macro_rules! by_height {
    ($mr:expr, $kernel:ident, $($height:literal),+; ($words:expr, $a:expr, $b:expr, $out:expr)) => {
        match ($mr, $a.line == 1) {
            $(($height, true) => $kernel::<$height, true>($words, $a, $b, $out),)+
            $(($height, false) => $kernel::<$height, false>($words, $a, $b, $out),)+
            (other, _) => unreachable!("tile height {other} is not a kernel's"),
        }
    };
}

/// An `f32` [`Tile`] `$name`: `$nr` columns by the heights listed, on tile kernel `$kernel`,
/// packing through `$packer` (or the portable [`pack`]).
macro_rules! f32_tiles {
    ($(#[$doc:meta])* $name:ident: $nr:literal wide, $($height:literal),+ tall, $kernel:ident
     $(, packed by $packer:ident)?) => {
        $(#[$doc])*
        pub(crate) struct $name;

        impl Tile for $name {
            const NR: usize = $nr;
            const MRS: &'static [usize] = &[$($height),+];
            const K_PER_WORD: usize = 1;
            const PARTIAL: bool = true;

            fn word(lo: f32, _hi: f32) -> u32 {
                lo.to_bits()
            }

            $(
                unsafe fn pack(
                    src: *const f32,
                    strides: (isize, isize),
                    len: usize,
                    kc: usize,
                    width: usize,
                    out: &mut [u32],
                ) {
                    // SAFETY: passed on from the caller.
                    unsafe { $packer(src, strides, len, kc, width, out) }
                }
            )?

            unsafe fn tile(mr: usize, words: usize, a: Panel, b: Panel, out: TileOut) {
                // SAFETY: passed on from the caller.
                unsafe { by_height!(mr, $kernel, $($height),+; (words, a, b, out)) }
            }
        }
    };
}

f32_tiles!(
    /// `f32` tiles 32 columns wide on AVX-512F.
    Avx512: 32 wide, 12, 8, 6, 4 tall, avx512_f32, packed by pack_avx512_f32
);
f32_tiles!(
    /// `f32` tiles 64 columns wide on AVX-512F, 6 rows: four vectors of `b` per broadcast of
    /// `a`, the fewest loads per FMA, for outputs wide enough to fill them.
    Avx512Wide: 64 wide, 6, 4 tall, avx512_wide_f32, packed by pack_avx512_f32
);
f32_tiles!(
    /// `f32` tiles 16 columns wide on AVX-512F, up to 24 rows: for outputs a few columns wide
    /// (an output layer's 10 classes), where 32-wide tiles would be two-thirds padding.
    Avx512Narrow: 16 wide, 24, 16, 12, 8 tall, avx512_narrow_f32, packed by pack_avx512_f32
);
f32_tiles!(
    /// `f32` tiles 16 columns wide on AVX2 with FMA.
    Avx2: 16 wide, 6, 4 tall, avx2_f32
);

/// `bf16` tiles 32 columns wide on AVX512_BF16: [`Avx512`]'s register tiles, each word of `a`
/// and `b` a pair of `k` rounded to `bf16` (`b`'s pairs along `k`, as [`Amx`] packs them),
/// multiplied and summed into `f32` by `vdpbf16ps`.
pub(crate) struct Avx512Bf16;

impl Tile for Avx512Bf16 {
    const NR: usize = 32;
    const MRS: &'static [usize] = &[12, 8, 6, 4];
    const K_PER_WORD: usize = 2;
    const PARTIAL: bool = true;

    fn word(lo: f32, hi: f32) -> u32 {
        bf16_pair(lo, hi)
    }

    unsafe fn pack(
        src: *const f32,
        strides: (isize, isize),
        len: usize,
        kc: usize,
        width: usize,
        out: &mut [u32],
    ) {
        // SAFETY: passed on from the caller (AVX512_BF16 was detected).
        unsafe { pack_avx512_bf16::<Self>(src, strides, len, kc, width, out) }
    }

    unsafe fn tile(mr: usize, words: usize, a: Panel, b: Panel, out: TileOut) {
        // SAFETY: passed on from the caller.
        unsafe { by_height!(mr, avx512_bf16_pairs, 12, 8, 6, 4; (words, a, b, out)) }
    }
}

/// `sum + a . b` over each lane's `bf16` pair: `vdpbf16ps`, with the operands' bits as pairs.
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
fn dot_pairs(a: __m512, b: __m512, sum: __m512) -> __m512 {
    // SAFETY: reinterpreting 512 bits as 32 `bf16` changes no bit.
    let (a, b) = unsafe {
        (std::mem::transmute::<__m512, __m512bh>(a), std::mem::transmute::<__m512, __m512bh>(b))
    };
    _mm512_dpbf16_ps(sum, a, b)
}

/// An `f32` tile kernel `$name::<MR, PACKED>`: `MR` rows of `$vectors` vectors of `$lanes` lanes,
/// each a broadcast word of `a` times the vectors of `b` per `k`. A corner narrower than the
/// tile is loaded and stored through lane masks (`$mask` of a lane count).
macro_rules! f32_tile {
    ($name:ident, $features:literal, $vectors:literal x $lanes:literal, $zero:ident, $load:ident,
     $store:ident, $broadcast:ident, $fma:ident, $add:ident, $mask:ident, $masked_load:ident,
     $masked_store:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const MR: usize, const PACKED: bool>(
            words: usize,
            a: Panel,
            b: Panel,
            out: TileOut,
        ) {
            let (a_line, a_step) = if PACKED { (1, MR) } else { (a.line, a.step) };
            let a_ptr = a.ptr.cast::<f32>();
            let rows: [*const f32; MR] = std::array::from_fn(|i| a_ptr.wrapping_add(i * a_line));
            let (b_ptr, ldb) = (b.ptr.cast::<f32>(), b.step);
            let mut sums = [[$zero(); $vectors]; MR];
            let step = |p: usize, sums: &mut [[_; $vectors]; MR]| {
                // SAFETY: the panels hold `words` words of their width.
                unsafe {
                    let mut v = [$zero(); $vectors];
                    for (j, v) in v.iter_mut().enumerate() {
                        *v = $load(b_ptr.add(p * ldb + j * $lanes));
                    }
                    for (i, row) in sums.iter_mut().enumerate() {
                        let x = $broadcast(*rows[i].add(p * a_step));
                        for (sum, &v) in row.iter_mut().zip(&v) {
                            *sum = $fma(x, v, *sum);
                        }
                    }
                }
            };
            // Two words per turn: half the loop's counting and branching.
            let mut p = 0;
            while p + 2 <= words {
                step(p, &mut sums);
                step(p + 1, &mut sums);
                p += 2;
            }
            if p < words {
                step(p, &mut sums);
            }
            for (i, row) in sums.iter().enumerate().take(out.rows) {
                for (j, &sum) in row.iter().enumerate() {
                    // SAFETY: `out` holds `rows` rows of `cols` values, `ldc` apart; the mask
                    // keeps a narrower corner's loads and stores inside it.
                    unsafe {
                        let c = out.ptr.add(i * out.ldc + j * $lanes);
                        let mut sum = sum;
                        if out.cols == $vectors * $lanes {
                            if out.accumulate {
                                sum = $add(sum, $load(c));
                            }
                            $store(c, sum);
                        } else {
                            let mask = $mask(out.cols.saturating_sub(j * $lanes));
                            if out.accumulate {
                                sum = $add(sum, $masked_load(c, mask));
                            }
                            $masked_store(c, mask, sum);
                        }
                    }
                }
            }
        }
    };
}

/// The first `n` of 16 lanes.
#[target_feature(enable = "avx512f")]
fn mask16(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as u16
}

#[target_feature(enable = "avx512f")]
unsafe fn masked_load16(p: *const f32, mask: __mmask16) -> __m512 {
    // SAFETY: the caller keeps the unmasked lanes inside its buffer.
    unsafe { _mm512_maskz_loadu_ps(mask, p) }
}

#[target_feature(enable = "avx512f")]
unsafe fn masked_store16(p: *mut f32, mask: __mmask16, v: __m512) {
    // SAFETY: the caller keeps the unmasked lanes inside its buffer.
    unsafe { _mm512_mask_storeu_ps(p, mask, v) }
}

/// The first `n` of 8 lanes.
#[target_feature(enable = "avx2")]
fn mask8(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n.min(8) as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

#[target_feature(enable = "avx2")]
unsafe fn masked_load8(p: *const f32, mask: __m256i) -> __m256 {
    // SAFETY: the caller keeps the unmasked lanes inside its buffer.
    unsafe { _mm256_maskload_ps(p, mask) }
}

#[target_feature(enable = "avx2")]
unsafe fn masked_store8(p: *mut f32, mask: __m256i, v: __m256) {
    // SAFETY: the caller keeps the unmasked lanes inside its buffer.
    unsafe { _mm256_maskstore_ps(p, mask, v) }
}

/// An AVX-512 [`f32_tile!`] of `$vectors` vectors per row.
macro_rules! avx512_tile {
    ($name:ident, $vectors:literal) => {
        f32_tile!(
            $name,
            "avx512f",
            $vectors x 16,
            _mm512_setzero_ps,
            _mm512_loadu_ps,
            _mm512_storeu_ps,
            _mm512_set1_ps,
            _mm512_fmadd_ps,
            _mm512_add_ps,
            mask16,
            masked_load16,
            masked_store16
        );
    };
}

avx512_tile!(avx512_f32, 2);
avx512_tile!(avx512_wide_f32, 4);
avx512_tile!(avx512_narrow_f32, 1);
// `bf16` pairs: each word of `a` broadcast (its bits unchanged) against `b`'s pairs.
f32_tile!(
    avx512_bf16_pairs,
    "avx512f,avx512bf16",
    2 x 16,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    dot_pairs,
    _mm512_add_ps,
    mask16,
    masked_load16,
    masked_store16
);
f32_tile!(
    avx2_f32,
    "avx2,fma",
    2 x 8,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps,
    _mm256_add_ps,
    mask8,
    masked_load8,
    masked_store8
);

/// [`pack`] sixteen lines at a time. Lines whose values are contiguous (the operands a step
/// stores `k`-fastest: activations read straight, weights read transposed) are loaded 16
/// words at a time and turned around in registers; contiguous lines are loaded whole, a word
/// of 16 lines at once. `bf16` words round and pair up in registers. Other strides take
/// [`pack`].
#[target_feature(enable = "avx512f")]
unsafe fn pack_avx512_f32(
    src: *const f32,
    strides: (isize, isize),
    len: usize,
    kc: usize,
    width: usize,
    out: &mut [u32],
) {
    // SAFETY: passed on from the caller.
    unsafe { pack_avx512::<Avx512>(src, strides, len, kc, width, out) }
}

/// [`pack_avx512`] rounding to `bf16` pairs, for tile `K`'s panels.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_avx512_bf16<K: Tile>(
    src: *const f32,
    strides: (isize, isize),
    len: usize,
    kc: usize,
    width: usize,
    out: &mut [u32],
) {
    // SAFETY: passed on from the caller.
    unsafe { pack_avx512::<K>(src, strides, len, kc, width, out) }
}

/// The body of the two above, inlined into each so that its intrinsics compile with their
/// features (the `bf16` branches are dead in the `f32` one).
#[inline(always)]
unsafe fn pack_avx512<K: Tile>(
    src: *const f32,
    (line, along): (isize, isize),
    len: usize,
    kc: usize,
    width: usize,
    out: &mut [u32],
) {
    if along == 1 && line != 1 {
        // SAFETY: passed on from the caller.
        return unsafe { pack_k_contiguous::<K>(src, line, len, kc, width, out) };
    }
    if line != 1 {
        return pack::<K>(src, (line, along), len, kc, width, out);
    }
    let pairs = K::K_PER_WORD == 2;
    let used = kc.div_ceil(K::K_PER_WORD);
    let words = used.next_multiple_of(K::WORD_ALIGN);
    for (panel, packed) in out.chunks_exact_mut(width * words).take(len.div_ceil(width)).enumerate()
    {
        let lines = width.min(len - panel * width);
        for group in (0..width).step_by(16) {
            let read = lanes(lines.saturating_sub(group));
            let write = lanes(width - group);
            // Line `panel * width + group + t`, value `p`, for `t` under the read mask.
            let at = |p: usize| {
                src.wrapping_offset((panel * width + group) as isize + p as isize * along)
            };
            for w in 0..used {
                // SAFETY: the masked loads read the group's lines at values inside the block
                // (a second value past `k` reads nothing and is zero); the store stays inside
                // word `w`'s `width` slots.
                unsafe {
                    let v = if pairs {
                        let p = 2 * w;
                        let lo = _mm512_maskz_loadu_ps(read, at(p));
                        let hi =
                            _mm512_maskz_loadu_ps(if p + 1 < kc { read } else { 0 }, at(p + 1));
                        let lo = _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(
                            _mm512_cvtneps_pbh(lo),
                        ));
                        let hi = _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(
                            _mm512_cvtneps_pbh(hi),
                        ));
                        _mm512_castsi512_ps(_mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi)))
                    } else {
                        _mm512_maskz_loadu_ps(read, at(w))
                    };
                    _mm512_mask_storeu_ps(
                        packed.as_mut_ptr().add(w * width + group).cast(),
                        write,
                        v,
                    );
                }
            }
        }
        // Words past `k`, up to the kernel's multiple.
        packed[used * width..].fill(0);
    }
}

/// The first `n` of 16 lanes (all of them from 16 on).
#[inline(always)]
fn lanes(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// [`pack_avx512`] for lines with contiguous values: per group of 16 lines, the next 16 words
/// of each (16 values, or 32 rounded into `bf16` pairs) load as one vector per line, and a
/// 16 x 16 transpose in registers makes them one vector per word.
#[inline(always)]
unsafe fn pack_k_contiguous<K: Tile>(
    src: *const f32,
    line: isize,
    len: usize,
    kc: usize,
    width: usize,
    out: &mut [u32],
) {
    let pairs = K::K_PER_WORD == 2;
    let used = kc.div_ceil(K::K_PER_WORD);
    let words = used.next_multiple_of(K::WORD_ALIGN);
    for (panel, packed) in out.chunks_exact_mut(width * words).take(len.div_ceil(width)).enumerate()
    {
        let lines = width.min(len - panel * width);
        for group in (0..width).step_by(16) {
            let real = lines.saturating_sub(group).min(16);
            let write = lanes(width - group);
            for w0 in (0..used).step_by(16) {
                // SAFETY: the loads read `real` lines of the block, masked to values below
                // `kc`; the stores stay inside words `w0..w0 + 16`, masked to the panel's width.
                unsafe {
                    let mut rows = [_mm512_setzero_ps(); 16];
                    for (t, row) in rows.iter_mut().enumerate().take(real) {
                        let values =
                            src.wrapping_offset((panel * width + group + t) as isize * line);
                        let load = |p: usize| {
                            _mm512_maskz_loadu_ps(
                                lanes(kc.saturating_sub(p)),
                                values.wrapping_add(p),
                            )
                        };
                        *row = if pairs {
                            let p = 2 * w0;
                            std::mem::transmute::<__m512bh, __m512>(_mm512_cvtne2ps_pbh(
                                load(p + 16),
                                load(p),
                            ))
                        } else {
                            load(w0)
                        };
                    }
                    let rows = transpose(rows);
                    for (c, row) in rows.iter().enumerate().take((used - w0).min(16)) {
                        let at = packed.as_mut_ptr().add((w0 + c) * width + group);
                        _mm512_mask_storeu_ps(at.cast(), write, *row);
                    }
                }
            }
        }
        // Words past `k`, up to the kernel's multiple.
        packed[used * width..].fill(0);
    }
}

/// `bf16` products summed in `f32` on AMX: 32 x 32 of `c` in four 16 x 16 tile registers,
/// each `tdpbf16ps` 16 x 16 x 32 products (8,192 per instruction, where a `vdpbf16ps` does
/// 32). `b`'s panels are the pairs-along-`k` layout the unit reads; `a`'s are line-major.
/// Rust has no stable AMX intrinsics: the instructions are inline assembly.
pub(crate) struct Amx;

/// `tdpbf16ps` consumes 16 words (32 `k`) of each row per instruction.
const AMX_WORDS: usize = 16;

impl Tile for Amx {
    const NR: usize = 32;
    const MRS: &'static [usize] = &[32, 16];
    const K_PER_WORD: usize = 2;
    const WORD_ALIGN: usize = AMX_WORDS;
    const A_LINE_MAJOR: bool = true;

    fn word(lo: f32, hi: f32) -> u32 {
        bf16_pair(lo, hi)
    }

    unsafe fn pack(
        src: *const f32,
        strides: (isize, isize),
        len: usize,
        kc: usize,
        width: usize,
        out: &mut [u32],
    ) {
        // SAFETY: passed on from the caller (`amx_ready` checked AVX512_BF16).
        unsafe { pack_avx512_bf16::<Self>(src, strides, len, kc, width, out) }
    }

    unsafe fn pack_rows(
        src: *const f32,
        line: isize,
        len: usize,
        kc: usize,
        width: usize,
        out: &mut [u32],
    ) {
        // SAFETY: passed on from the caller.
        unsafe { pack_rows_bf16(src, line, len, kc, width, out) }
    }

    unsafe fn begin() {
        /// Palette 1: eight tiles of 16 rows of 64 bytes.
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        let mut config = Config([0; 64]);
        config.0[0] = 1;
        for tile in 0..8 {
            config.0[16 + 2 * tile] = 64;
            config.0[48 + tile] = 16;
        }
        // SAFETY: the CPU has AMX and the process may use it (`amx_ready`).
        unsafe { std::arch::asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack)) };
    }

    unsafe fn end() {
        // SAFETY: after `begin`.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
    }

    /// Tile stores write whole 16 x 16 blocks.
    const PARTIAL: bool = false;

    unsafe fn tile(mr: usize, words: usize, a: Panel, b: Panel, out: TileOut) {
        use std::arch::asm;
        let TileOut { ptr: c, ldc, accumulate, .. } = out;
        let (a_line, a, b, ldb) = (a.line, a.ptr, b.ptr, b.step);
        let (c_stride, a_stride, b_stride) = (ldc * 4, a_line * 4, ldb * 4);
        let lower = mr == 32;
        // SAFETY: `c` holds `mr` rows of 32 values `ldc` apart; `a` `mr` lines of `words`, `b`
        // `words` rows of 32, `words` a multiple of 16; `begin` configured the tiles. tmm0-3
        // sum `c`'s four quarters, tmm4/5 hold `a`'s upper and lower halves, tmm6/7 `b`'s left
        // and right.
        unsafe {
            let c_low = c.add(16 * ldc);
            if accumulate {
                asm!("tileloadd tmm0, [{0} + {1}*1]", in(reg) c, in(reg) c_stride, options(nostack));
                asm!("tileloadd tmm1, [{0} + {1}*1]", in(reg) c.add(16), in(reg) c_stride, options(nostack));
                if lower {
                    asm!("tileloadd tmm2, [{0} + {1}*1]", in(reg) c_low, in(reg) c_stride, options(nostack));
                    asm!("tileloadd tmm3, [{0} + {1}*1]", in(reg) c_low.add(16), in(reg) c_stride, options(nostack));
                }
            } else {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
            }
            for w in (0..words).step_by(AMX_WORDS) {
                let (a_w, b_w) = (a.add(w), b.add(w * ldb));
                asm!(
                    "tileloadd tmm4, [{a} + {sa}*1]",
                    "tileloadd tmm6, [{b} + {sb}*1]",
                    "tileloadd tmm7, [{b_right} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    a = in(reg) a_w,
                    sa = in(reg) a_stride,
                    b = in(reg) b_w,
                    b_right = in(reg) b_w.add(16),
                    sb = in(reg) b_stride,
                    options(nostack, readonly),
                );
                if lower {
                    asm!(
                        "tileloadd tmm5, [{a} + {sa}*1]",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a = in(reg) a_w.add(16 * a_line),
                        sa = in(reg) a_stride,
                        options(nostack, readonly),
                    );
                }
            }
            asm!("tilestored [{0} + {1}*1], tmm0", in(reg) c, in(reg) c_stride, options(nostack));
            asm!("tilestored [{0} + {1}*1], tmm1", in(reg) c.add(16), in(reg) c_stride, options(nostack));
            if lower {
                asm!("tilestored [{0} + {1}*1], tmm2", in(reg) c_low, in(reg) c_stride, options(nostack));
                asm!("tilestored [{0} + {1}*1], tmm3", in(reg) c_low.add(16), in(reg) c_stride, options(nostack));
            }
        }
    }
}

/// [`Tile::pack_rows`] for `bf16` words: 32 values of a row round into 16 words per step.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_rows_bf16(
    src: *const f32,
    line: isize,
    len: usize,
    kc: usize,
    width: usize,
    out: &mut [u32],
) {
    let words = kc.div_ceil(2).next_multiple_of(AMX_WORDS);
    for (i, row) in out.chunks_exact_mut(words).take(len.next_multiple_of(width)).enumerate() {
        if i >= len {
            row.fill(0);
            continue;
        }
        // SAFETY: row `i < len` of the block.
        let values = unsafe { src.offset(i as isize * line) };
        for w in (0..words).step_by(16) {
            let p = 2 * w;
            let take = |from: usize| {
                let n = kc.saturating_sub(from).min(16);
                ((1u32 << n) - 1) as u16
            };
            // SAFETY: the masks keep the loads inside the row's `kc` values; the store writes
            // words `w..w + 16` of a row `words` long (a multiple of 16).
            unsafe {
                let lo = _mm512_maskz_loadu_ps(take(p), values.add(p.min(kc)));
                let hi = _mm512_maskz_loadu_ps(take(p + 16), values.add((p + 16).min(kc)));
                let packed: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_si512(row.as_mut_ptr().add(w).cast(), packed);
            }
        }
    }
}

/// Values of `k` per block of [`avx512_dots`]: a block of `a`'s rows and `b`'s columns stays
/// in L2 while every dot product over it is summed.
const DOT_BLOCK: usize = 1024;

/// A dot-product kernel `$name`: `c (+)= a b` as dot products of `a`'s rows with `b`'s
/// columns, both contiguous along `k`, `$rows` rows by `$cols` columns at a time (as many sums
/// as the registers hold beside one vector of each), each sum a vector of `$lanes` lanes added
/// up at the end. For a small output over a long `k` (a convolution's
/// weight gradient), where packing an operand for tiles would cost more than the products.
macro_rules! dots {
    ($(#[$doc:meta])* $name:ident, $features:literal, $lanes:literal lanes, $rows:literal x
     $cols:literal, $zero:ident, $mask:ident, $masked_load:ident, $fma:ident, $reduce:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU has the kernel's features; `a` (rows `k` contiguous values long) addresses
        /// `m x k` values, `b` (columns `k` contiguous values long) `k x n`, and `c` `m x n`
        /// writable ones aliasing neither.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(
            (m, k, n): (usize, usize, usize),
            a: Strided,
            b: Strided,
            c: StridedMut,
            accumulate: bool,
            _workspace: &mut [u32],
        ) {
            if m == 0 || n == 0 {
                return;
            }
            for p0 in (0..k.max(1)).step_by(DOT_BLOCK) {
                let kc = DOT_BLOCK.min(k - p0);
                let add = accumulate || p0 > 0;
                for i0 in (0..m).step_by($rows) {
                    for j0 in (0..n).step_by($cols) {
                        // A block at the edge repeats its last row or column; only the real
                        // ones are written.
                        let rows: [*const f32; $rows] = std::array::from_fn(|r| {
                            let row = (i0 + r).min(m - 1) as isize;
                            a.ptr.wrapping_offset(row * a.rows + p0 as isize)
                        });
                        let cols: [*const f32; $cols] = std::array::from_fn(|q| {
                            let col = (j0 + q).min(n - 1) as isize;
                            b.ptr.wrapping_offset(col * b.cols + p0 as isize)
                        });
                        let mut sums = [[$zero(); $cols]; $rows];
                        for p in (0..kc).step_by($lanes) {
                            let mask = $mask(kc - p);
                            // SAFETY: the masks keep every load inside the rows' and columns'
                            // `kc` values of this block.
                            unsafe {
                                let x: [_; $rows] =
                                    std::array::from_fn(|r| $masked_load(rows[r].add(p), mask));
                                for (q, col) in cols.iter().enumerate() {
                                    let y = $masked_load(col.add(p), mask);
                                    for (sum, &x) in sums.iter_mut().zip(&x) {
                                        sum[q] = $fma(x, y, sum[q]);
                                    }
                                }
                            }
                        }
                        for (r, row) in sums.iter().enumerate().take(m - i0) {
                            for (q, &sum) in row.iter().enumerate().take(n - j0) {
                                let at = (i0 + r) as isize * c.rows + (j0 + q) as isize * c.cols;
                                // SAFETY: `(i0 + r, j0 + q)` is inside `c`.
                                unsafe {
                                    let out = &mut *c.ptr.offset(at);
                                    let dot = $reduce(sum);
                                    *out = if add { *out + dot } else { dot };
                                }
                            }
                        }
                    }
                }
            }
        }
    };
}

dots!(
    /// Dot products on AVX-512F, 16 lanes.
    avx512_dots, "avx512f", 16 lanes, 4 x 4, _mm512_setzero_ps, mask16, masked_load16, _mm512_fmadd_ps,
    _mm512_reduce_add_ps
);
dots!(
    /// Dot products on AVX2 with FMA, 8 lanes.
    avx2_dots, "avx2,fma", 8 lanes, 3 x 4, _mm256_setzero_ps, mask8, masked_load8, _mm256_fmadd_ps,
    sum8
);

/// The sum of a vector's 8 lanes.
#[target_feature(enable = "avx2")]
fn sum8(v: __m256) -> f32 {
    let half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)))
}

/// Whether this CPU has AVX512_BF16 (`vdpbf16ps`).
pub(crate) fn avx512_bf16_ready() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bf16")
}

/// Whether this CPU has AMX with `bf16` and the kernel lets this process use it (Linux asks
/// each process to request the tile state, which is 8 KiB per thread to save and restore).
pub(crate) fn amx_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        // CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE. Packing uses AVX512_BF16,
        // which every CPU with AMX has.
        let leaf = __cpuid_count(7, 0);
        let has = leaf.edx & (1 << 22) != 0
            && leaf.edx & (1 << 24) != 0
            && std::arch::is_x86_feature_detected!("avx512bf16");
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call; it fails cleanly where the kernel lacks it.
        has && unsafe {
            libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
        } == 0
    })
}
