//! Register tiles for x86-64, one per vector width: rows of `c` in accumulators, a packed word
//! of `a` broadcast against whole vectors of `b`.
//!
//! * [`Avx512`]: 32 `f32` columns (two zmm) by up to 12 rows, 24 of the 32 registers summing.
//! * [`Amx`]: `bf16` products summed in `f32` on the matrix unit, 32 x 32 per tile. (AVX512_BF16's
//!   `vdpbf16ps` does twice the products of an `f32` FMA per instruction, but on the Xeons
//!   measured it issues at half the rate: no faster than `f32`, so it has no kernel here.)
//! * [`Avx2`]: 16 columns (two ymm) by up to 6 rows, 12 of the 16 registers summing.
//!
//! Each kernel is compiled for its features alone and only runs where they were detected.

use std::arch::x86_64::*;

use super::packed::{Panel, Tile, TileOut, bf16_bits, pack};

/// Chooses the instantiation for tile height `mr` (one of the kernel's `MRS`).
macro_rules! by_height {
    ($mr:expr, $kernel:ident, $($height:literal),+; $args:tt) => {
        match $mr {
            $($height => $kernel::<$height> $args,)+
            other => unreachable!("tile height {other} is not a kernel's"),
        }
    };
}

/// `f32` tiles 32 columns wide on AVX-512F.
pub(crate) struct Avx512;

impl Tile for Avx512 {
    const NR: usize = 32;
    const MRS: &'static [usize] = &[12, 8, 6, 4];
    const K_PER_WORD: usize = 1;

    fn word(lo: f32, _hi: f32) -> u32 {
        lo.to_bits()
    }

    unsafe fn pack(
        src: *const f32,
        strides: (isize, isize),
        len: usize,
        kc: usize,
        width: usize,
        out: &mut [u32],
    ) {
        // SAFETY: passed on from the caller.
        unsafe { pack_avx512_f32(src, strides, len, kc, width, out) }
    }

    const PARTIAL: bool = true;

    unsafe fn tile(mr: usize, words: usize, a: Panel, b: Panel, out: TileOut) {
        // SAFETY: passed on from the caller.
        unsafe { by_height!(mr, avx512_f32, 12, 8, 6, 4; (words, a, b, out)) }
    }
}

/// An `f32` tile kernel `$name::<MR>`: `MR` rows of two vectors of `$lanes` lanes, each a
/// broadcast word of `a` times the two vectors of `b` per `k`. A corner narrower than the tile
/// is loaded and stored through lane masks (`$mask` of a lane count).
macro_rules! f32_tile {
    ($name:ident, $features:literal, $lanes:literal, $zero:ident, $load:ident, $store:ident,
     $broadcast:ident, $fma:ident, $add:ident, $mask:ident, $masked_load:ident,
     $masked_store:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const MR: usize>(words: usize, a: Panel, b: Panel, out: TileOut) {
            let (a_ptr, a_line, a_step) = (a.ptr.cast::<f32>(), a.line, a.step);
            let (b_ptr, ldb) = (b.ptr.cast::<f32>(), b.step);
            let mut sums = [[$zero(); 2]; MR];
            for p in 0..words {
                // SAFETY: the panels hold `words` words of their width.
                unsafe {
                    let b0 = $load(b_ptr.add(p * ldb));
                    let b1 = $load(b_ptr.add(p * ldb + $lanes));
                    for (i, row) in sums.iter_mut().enumerate() {
                        let x = $broadcast(*a_ptr.add(p * a_step + i * a_line));
                        row[0] = $fma(x, b0, row[0]);
                        row[1] = $fma(x, b1, row[1]);
                    }
                }
            }
            let masks = ($mask(out.cols), $mask(out.cols.saturating_sub($lanes)));
            for (i, row) in sums.iter().enumerate().take(out.rows) {
                // SAFETY: `out` holds `rows` rows of `cols` values, `ldc` apart; the masks keep
                // a narrower corner's loads and stores inside it.
                unsafe {
                    let c = out.ptr.add(i * out.ldc);
                    let (mut lo, mut hi) = (row[0], row[1]);
                    if out.cols == 2 * $lanes {
                        if out.accumulate {
                            lo = $add(lo, $load(c));
                            hi = $add(hi, $load(c.add($lanes)));
                        }
                        $store(c, lo);
                        $store(c.add($lanes), hi);
                    } else {
                        if out.accumulate {
                            lo = $add(lo, $masked_load(c, masks.0));
                            hi = $add(hi, $masked_load(c.add($lanes), masks.1));
                        }
                        $masked_store(c, masks.0, lo);
                        $masked_store(c.add($lanes), masks.1, hi);
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

f32_tile!(
    avx512_f32,
    "avx512f",
    16,
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
f32_tile!(
    avx2_f32,
    "avx2,fma",
    8,
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

/// [`pack`] sixteen lines at a time: lines whose values are contiguous (the operands a step
/// stores `k`-fastest: activations read straight, weights read transposed) are gathered a
/// word of every line at once, contiguous lines are loaded whole; `bf16` words round and pair
/// up in registers. Anything else (an odd `k`'s last word, unusual strides) takes [`pack`].
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

/// [`pack_avx512`] rounding to `bf16` pairs.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_avx512_bf16(
    src: *const f32,
    strides: (isize, isize),
    len: usize,
    kc: usize,
    width: usize,
    out: &mut [u32],
) {
    // SAFETY: passed on from the caller.
    unsafe { pack_avx512::<Amx>(src, strides, len, kc, width, out) }
}

/// The body of the two above, inlined into each so that its intrinsics compile with their
/// features (the `bf16` branch is dead in the `f32` one).
#[inline(always)]
unsafe fn pack_avx512<K: Tile>(
    src: *const f32,
    (line, along): (isize, isize),
    len: usize,
    kc: usize,
    width: usize,
    out: &mut [u32],
) {
    let pairs = K::K_PER_WORD == 2;
    // Gather offsets are 32-bit element counts.
    let gatherable = along == 1 && line > 1 && line.saturating_mul(16) < i32::MAX as isize / 8;
    if !(gatherable || line == 1) {
        return pack::<K>(src, (line, along), len, kc, width, out);
    }
    let (used, words) =
        (kc.div_ceil(K::K_PER_WORD), kc.div_ceil(K::K_PER_WORD).next_multiple_of(K::WORD_ALIGN));
    let whole_words = kc / K::K_PER_WORD;
    // SAFETY: the callers enable AVX-512F.
    let offsets = unsafe {
        let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        _mm512_mullo_epi32(lane, _mm512_set1_epi32(line as i32))
    };
    for (panel, packed) in out.chunks_exact_mut(width * words).take(len.div_ceil(width)).enumerate()
    {
        let lines = width.min(len - panel * width);
        for group in (0..width).step_by(16) {
            let real = lines.saturating_sub(group).min(16);
            let read: __mmask16 = ((1u32 << real) - 1) as u16;
            let write: __mmask16 = ((1u32 << (width - group).min(16)) - 1) as u16;
            // SAFETY: line `panel * width + group + t` for `t < real` lies inside the block.
            let first = unsafe { src.offset((panel * width + group) as isize * line) };
            for w in 0..whole_words {
                // SAFETY: word `w` of each of the `real` lines is inside the block; the masked
                // lanes read nothing; the store stays inside word `w`'s `width` slots.
                let v = unsafe {
                    match (pairs, line == 1) {
                        (false, true) => {
                            _mm512_maskz_loadu_ps(read, first.offset(w as isize * along))
                        }
                        (false, false) => _mm512_mask_i32gather_ps::<4>(
                            _mm512_setzero_ps(),
                            read,
                            offsets,
                            first.add(w),
                        ),
                        (true, true) => {
                            let lo =
                                _mm512_maskz_loadu_ps(read, first.offset(2 * w as isize * along));
                            let hi = _mm512_maskz_loadu_ps(
                                read,
                                first.offset((2 * w + 1) as isize * along),
                            );
                            let lo = _mm512_cvtepu16_epi32(
                                std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(lo)),
                            );
                            let hi = _mm512_cvtepu16_epi32(
                                std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(hi)),
                            );
                            _mm512_castsi512_ps(_mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi)))
                        }
                        (true, false) => {
                            // Each line's two values of the word are adjacent: gather them as
                            // one 64-bit value, eight lines per gather.
                            let base = first.add(2 * w).cast::<i64>();
                            let low = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64::<4>(
                                _mm512_setzero_si512(),
                                read as u8,
                                _mm512_castsi512_si256(offsets),
                                base,
                            ));
                            let high = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64::<4>(
                                _mm512_setzero_si512(),
                                (read >> 8) as u8,
                                _mm512_extracti64x4_epi64::<1>(offsets),
                                base,
                            ));
                            std::mem::transmute::<__m512bh, __m512>(_mm512_cvtne2ps_pbh(high, low))
                        }
                    }
                };
                // SAFETY: `group + 16` slots of word `w`, masked to the panel's width.
                unsafe {
                    _mm512_mask_storeu_ps(
                        packed.as_mut_ptr().add(w * width + group).cast(),
                        write,
                        v,
                    )
                };
            }
        }
        if whole_words < words {
            // An odd `k`: the last word holds one value and a zero.
            let p = 2 * whole_words;
            for t in 0..width {
                packed[whole_words * width + t] = if t < lines {
                    // SAFETY: line `t` of this panel, value `p < kc`, inside the block.
                    let x = unsafe {
                        *src.offset((panel * width + t) as isize * line + p as isize * along)
                    };
                    K::word(x, 0.0)
                } else {
                    0
                };
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
        bf16_bits(lo) | (bf16_bits(hi) << 16)
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
        unsafe { pack_avx512_bf16(src, strides, len, kc, width, out) }
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

/// `f32` tiles 16 columns wide on AVX2 with FMA.
pub(crate) struct Avx2;

impl Tile for Avx2 {
    const NR: usize = 16;
    const MRS: &'static [usize] = &[6, 4];
    const K_PER_WORD: usize = 1;

    fn word(lo: f32, _hi: f32) -> u32 {
        lo.to_bits()
    }

    const PARTIAL: bool = true;

    unsafe fn tile(mr: usize, words: usize, a: Panel, b: Panel, out: TileOut) {
        // SAFETY: passed on from the caller.
        unsafe { by_height!(mr, avx2_f32, 6, 4; (words, a, b, out)) }
    }
}
