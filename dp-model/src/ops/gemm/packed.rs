//! A blocked GEMM over packed panels, the loop nest BLIS made standard, around the register
//! tiles of [`super::x86`].
//!
//! `c [m, n] (+)= a [m, k] b [k, n]`, every operand through any strides. Blocks of `b` (`KC`
//! words of `k` by `NC` columns) are packed into `NR`-wide panels and blocks of `a` (`MC` rows)
//! into `MR`-tall ones, so the tile kernel reads both operands contiguously whatever their
//! layout: the transposed operands of backward cost one packing pass, like the straight ones.
//! Operands already laid out as a kernel reads them are read in place instead. A packed word
//! is one `f32`, or two `bf16` along `k` for the AMX kernel, which rounds while it packs (f32
//! operands in, f32 sums out, as PyTorch's CPU autocast does). The packing buffers are the
//! caller's ([`workspace_words`]), so a call allocates nothing.

/// A read-only matrix: element `(i, j)` at `ptr + i * rows + j * cols`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strided {
    pub(crate) ptr: *const f32,
    pub(crate) rows: isize,
    pub(crate) cols: isize,
}

impl Strided {
    /// The same elements read transposed.
    fn t(self) -> Self {
        Self { ptr: self.ptr, rows: self.cols, cols: self.rows }
    }
}

/// The output: element `(i, j)` at `ptr + i * rows + j * cols`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StridedMut {
    pub(crate) ptr: *mut f32,
    pub(crate) rows: isize,
    pub(crate) cols: isize,
}

/// A register tile: `MR x NR` of `c` from an `MR`-tall panel of `a` and an `NR`-wide panel of
/// `b`, both packed `words` deep.
pub(crate) trait Tile: Sized {
    /// Columns of the tile (whole vectors).
    const NR: usize;
    /// The tile heights the kernel has, tallest first.
    const MRS: &'static [usize];
    /// `k` values per packed word: 1 (`f32`) or 2 (a `bf16` pair).
    const K_PER_WORD: usize;
    /// Packed panels hold a multiple of this many words (zeros past `k`).
    const WORD_ALIGN: usize = 1;
    /// `a`'s panels are line after line (each row's words contiguous, as a matrix unit
    /// loads them) instead of word after word.
    const A_LINE_MAJOR: bool = false;
    /// Packs `len` rows of `kc` contiguous values, `line` apart, line-major (for
    /// [`Tile::A_LINE_MAJOR`]): row `i`'s words at `i * words`, rows up to a multiple of
    /// `width` zeros. Kernels override it with vector code for their CPU.
    ///
    /// # Safety
    /// The CPU has the kernel's features; `src` addresses the `len x kc` block.
    unsafe fn pack_rows(
        src: *const f32,
        line: isize,
        len: usize,
        kc: usize,
        width: usize,
        out: &mut [u32],
    ) {
        let words = kc.div_ceil(Self::K_PER_WORD).next_multiple_of(Self::WORD_ALIGN);
        for (i, row) in out.chunks_exact_mut(words).take(len.next_multiple_of(width)).enumerate() {
            row.fill(0);
            if i < len {
                // SAFETY: row `i < len` of the block, `kc` values long.
                let values =
                    unsafe { std::slice::from_raw_parts(src.offset(i as isize * line), kc) };
                for (w, pair) in values.chunks(Self::K_PER_WORD).enumerate() {
                    row[w] = Self::word(pair[0], pair.get(1).copied().unwrap_or(0.0));
                }
            }
        }
    }
    /// Readies the CPU for tiles (a matrix unit's configuration); [`Tile::end`] undoes it.
    ///
    /// # Safety
    /// The CPU has the kernel's features.
    unsafe fn begin() {}
    /// Releases what [`Tile::begin`] took.
    ///
    /// # Safety
    /// After [`Tile::begin`] on this thread.
    unsafe fn end() {}
    /// The word that holds `k` values `lo` and `hi` (`hi` unused when one fits).
    fn word(lo: f32, hi: f32) -> u32;
    /// Packs as [`pack`] does; kernels override it with vector code for their CPU.
    ///
    /// # Safety
    /// The CPU has the kernel's features; `src` addresses the `len x kc` block.
    unsafe fn pack(
        src: *const f32,
        strides: (isize, isize),
        len: usize,
        kc: usize,
        width: usize,
        out: &mut [u32],
    ) {
        pack::<Self>(src, strides, len, kc, width, out);
    }
    /// Whether [`Tile::tile`] writes a corner of a tile itself (`out` smaller than `mr x NR`).
    const PARTIAL: bool;
    /// `out (+)= a b` for one tile of height `mr`, `words` deep. A kernel takes `b` with `line`
    /// 1 and `a` as [`Tile::A_LINE_MAJOR`] says (`step` 1 if so, else any strides).
    ///
    /// # Safety
    /// The CPU has the kernel's features; `a` addresses `mr` lines and `b` `NR` of `words`
    /// words; `out` is writable and whole unless the kernel is `PARTIAL`.
    unsafe fn tile(mr: usize, words: usize, a: Panel, b: Panel, out: TileOut);
}

/// A tile's view of an operand: word `w` of line `t` (a row of `a`, a column of `b`) at
/// `ptr + w * step + t * line`. Packed panels have `line` 1 and `step` their width (or, for
/// line-major `a`, `line` the words and `step` 1); in place, the matrix's own strides.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Panel {
    pub(crate) ptr: *const u32,
    pub(crate) line: usize,
    pub(crate) step: usize,
}

/// Where a tile's sums go: its `rows x cols` corner (at most `mr x NR`), rows `ldc` apart and
/// each contiguous, written or added to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TileOut {
    pub(crate) ptr: *mut f32,
    pub(crate) ldc: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) accumulate: bool,
}

/// Packed words of `k` per block: a `b` panel (`KC x NR`) stays in L1 while the tiles of a
/// block of `a` pass by.
const KC: usize = 256;
/// Rows of `a` per packed block (`MC x KC` words, 192 KiB, well inside L2): a multiple of
/// every tile height.
const MC: usize = 192;
/// Columns of `b` per packed block (`KC x NC` words, 1 MiB): a multiple of every tile width.
const NC: usize = 1024;

/// Words of packing buffer any product needs: one block of each operand, and room to turn
/// a block of `a` line-major.
pub(crate) const fn workspace_words() -> usize {
    (2 * MC + NC) * KC
}

/// The tile height for `m` rows: the tallest whose padding wastes at most 5% more rows than
/// the least wasteful. Taller tiles reuse each loaded vector of `b` for more rows, and short
/// ones have too few sums in flight to cover the FMA latency.
fn tile_height<K: Tile>(m: usize) -> usize {
    let used = |mr: usize| m as f64 / (m.div_ceil(mr) * mr) as f64;
    let best = K::MRS.iter().map(|&mr| used(mr)).fold(0.0, f64::max);
    K::MRS.iter().copied().find(|&mr| used(mr) >= best - 0.05).unwrap_or(K::MRS[0])
}

/// Whether `m` rows make at most two rows of `K`'s tiles: few enough that `b`, when its rows
/// are contiguous, is read in place rather than packed (see [`gemm`]).
pub(crate) fn short<K: Tile>(m: usize) -> bool {
    m.div_ceil(tile_height::<K>(m)) <= 2
}

/// The share of an `m x n` tiling that holds real values.
fn tiling_use<K: Tile>(m: usize, n: usize) -> f64 {
    let mr = tile_height::<K>(m);
    (m * n) as f64 / (m.div_ceil(mr) * mr * n.div_ceil(K::NR) * K::NR) as f64
}

/// How much a transposed product's tiles count less: they go to `c` through a buffer,
/// element by element, and its operands' roles swap, so the one read in place gets packed.
const TRANSPOSED_COST: f64 = 1.5;

/// Whether [`gemm`] runs an `m x n` product transposed: a narrow result (the 10 classes of an
/// output layer) fills tiles far better as `c^T = b^T a^T`, rows for columns.
pub(crate) fn transposes<K: Tile>(m: usize, n: usize) -> bool {
    tiling_use::<K>(n, m) > TRANSPOSED_COST * tiling_use::<K>(m, n)
}

/// How well kernel `K` fills an `m x n` product: its tiling's use in the orientation [`gemm`]
/// takes, the transposed one discounted by [`TRANSPOSED_COST`]. Chooses between kernels.
pub(crate) fn fill<K: Tile>(m: usize, n: usize) -> f64 {
    match transposes::<K>(m, n) {
        true => tiling_use::<K>(n, m) / TRANSPOSED_COST,
        false => tiling_use::<K>(m, n),
    }
}

/// One way to run a product: [`gemm`] on a tile kernel, or another kernel with its signature.
pub(crate) type Product =
    unsafe fn((usize, usize, usize), Strided, Strided, StridedMut, bool, &mut [u32]);

/// `c = a b`, or `c += a b` with `accumulate`, on tile kernel `K`.
///
/// # Safety
/// The CPU has `K`'s features; `a` addresses `m x k` readable values, `b` `k x n`, `c` `m x n`
/// writable ones aliasing neither; `workspace` holds [`workspace_words`].
pub(crate) unsafe fn gemm<K: Tile>(
    (m, k, n): (usize, usize, usize),
    a: Strided,
    b: Strided,
    c: StridedMut,
    accumulate: bool,
    workspace: &mut [u32],
) {
    if m == 0 || n == 0 {
        return;
    }
    // The same elements, read and written transposed when that fills tiles better.
    let ((m, n), a, b, c) = if transposes::<K>(m, n) {
        ((n, m), b.t(), a.t(), StridedMut { ptr: c.ptr, rows: c.cols, cols: c.rows })
    } else {
        ((m, n), a, b, c)
    };
    assert!(workspace.len() >= workspace_words(), "GEMM workspace sized at build");
    if k == 0 {
        // SAFETY: `c` is `m x n` writable values, as the caller promised.
        return unsafe { empty_product(c, m, n, accumulate) };
    }
    let mr = tile_height::<K>(m);
    let (packed_a, rest) = workspace.split_at_mut(MC * KC);
    let (line_major, packed_b) = rest.split_at_mut(MC * KC);
    let k_block = KC * K::K_PER_WORD;
    // Operands already laid out as a kernel reads them are read where they lie: rows of `a`
    // with contiguous `k` (a word is then one value, broadcast from any address), and rows of
    // `b` with contiguous columns. A panel of `b` read in place is `kc` rows a whole row of `b`
    // apart, which L1 keeps poorly (rows a power of two apart share few sets): only worth it
    // when few tiles reuse it, where packing would cost a pass over `b` that a short `a` does
    // not pay back. A last, narrower panel of either is packed (zero-padded) all the same.
    let a_in_place = K::K_PER_WORD == 1 && !K::A_LINE_MAJOR && a.cols == 1 && a.rows > 0;
    let b_in_place = K::K_PER_WORD == 1 && b.cols == 1 && b.rows > 0 && short::<K>(m);
    // SAFETY: the caller promised the features; `end` follows below.
    unsafe { K::begin() };
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        for p0 in (0..k).step_by(k_block) {
            let kc = k_block.min(k - p0);
            let words = kc.div_ceil(K::K_PER_WORD).next_multiple_of(K::WORD_ALIGN);
            // SAFETY: the block lies inside `b`.
            let b_block = unsafe { b.ptr.offset(p0 as isize * b.rows + j0 as isize * b.cols) };
            let whole_b = if b_in_place { nc / K::NR } else { 0 };
            // SAFETY: the block (or its last panel) lies inside `b`; the CPU has `K`'s features.
            unsafe {
                let rest = b_block.offset((whole_b * K::NR) as isize * b.cols);
                K::pack(rest, (b.cols, b.rows), nc - whole_b * K::NR, kc, K::NR, packed_b)
            };
            let accumulate = accumulate || p0 > 0;
            for i0 in (0..m).step_by(MC) {
                let mc = MC.min(m - i0);
                // SAFETY: the block lies inside `a`.
                let a_block = unsafe { a.ptr.offset(i0 as isize * a.rows + p0 as isize * a.cols) };
                let whole_a = if a_in_place { mc / mr } else { 0 };
                // SAFETY: the block (or its last panel) lies inside `a`.
                let rest = unsafe { a_block.offset((whole_a * mr) as isize * a.rows) };
                let rest_len = mc - whole_a * mr;
                let strides = (a.rows, a.cols);
                let panel_shape = (rest_len, kc, mr, words);
                // SAFETY: the rows lie inside `a`; the CPU has `K`'s features.
                let packed_a =
                    unsafe { pack_a::<K>(rest, strides, panel_shape, packed_a, line_major) };
                // Tiles column panel by column panel, so that a panel of `b` stays in L1 while
                // the tiles of `a` pass by; with few words a tile is mostly its reads and writes
                // of `c`, which then go row panel by row panel, along `c`'s rows.
                let (panels_a, panels_b) = (mc.div_ceil(mr), nc.div_ceil(K::NR));
                let along_rows = words <= 64;
                let (outer, inner) =
                    if along_rows { (panels_a, panels_b) } else { (panels_b, panels_a) };
                for o in 0..outer {
                    for q in 0..inner {
                        let (ir, jr) = if along_rows { (o, q) } else { (q, o) };
                        let a_panel = match ir.checked_sub(whole_a) {
                            None => Panel {
                                // SAFETY: a whole panel's rows lie inside the block.
                                ptr: unsafe { a_block.offset((ir * mr) as isize * a.rows) }.cast(),
                                line: a.rows as usize,
                                step: 1,
                            },
                            Some(ir) if K::A_LINE_MAJOR => {
                                let ptr = packed_a[ir * mr * words..].as_ptr();
                                Panel { ptr, line: words, step: 1 }
                            }
                            Some(ir) => {
                                let ptr = packed_a[ir * mr * words..].as_ptr();
                                Panel { ptr, line: 1, step: mr }
                            }
                        };
                        let b_panel = match jr.checked_sub(whole_b) {
                            None => Panel {
                                // SAFETY: a whole panel's columns lie inside the block.
                                ptr: unsafe { b_block.add(jr * K::NR) }.cast(),
                                line: 1,
                                step: b.rows as usize,
                            },
                            Some(jr) => {
                                let ptr = packed_b[jr * K::NR * words..].as_ptr();
                                Panel { ptr, line: 1, step: K::NR }
                            }
                        };
                        let (i, j) = (i0 + ir * mr, j0 + jr * K::NR);
                        let (rows, cols) = (mr.min(m - i), K::NR.min(n - j));
                        // SAFETY: `(i, j)` is inside `c`.
                        let corner =
                            unsafe { c.ptr.offset(i as isize * c.rows + j as isize * c.cols) };
                        let tile = (a_panel, b_panel, words);
                        // SAFETY: the panels hold `words` of their width; the tile is inside `c`.
                        unsafe { write_tile::<K>(tile, mr, (rows, cols), corner, c, accumulate) };
                    }
                }
            }
        }
    }
    // SAFETY: after `begin` above.
    unsafe { K::end() };
}

/// A product with no terms to sum (`k` is 0): `c` is zero, or stays as it is with
/// `accumulate`.
///
/// # Safety
/// `c` addresses `m x n` writable values.
unsafe fn empty_product(c: StridedMut, m: usize, n: usize, accumulate: bool) {
    if accumulate {
        return;
    }
    for i in 0..m {
        for j in 0..n {
            // SAFETY: inside `c`, as the caller promised.
            unsafe { *c.ptr.offset(i as isize * c.rows + j as isize * c.cols) = 0.0 };
        }
    }
}

/// Packs `len` rows of a block of `a` (from `src`, `strides` its row and column steps, `kc`
/// deep) into panels `mr` tall of `words` words each, as kernel `K` reads them: into `packed`,
/// or for a line-major kernel reading a transposed `a`, through `packed` into `line_major`.
///
/// # Safety
/// The rows lie inside `a`; the CPU has `K`'s features.
unsafe fn pack_a<'a, K: Tile>(
    src: *const f32,
    strides: (isize, isize),
    (len, kc, mr, words): (usize, usize, usize, usize),
    packed: &'a mut [u32],
    line_major: &'a mut [u32],
) -> &'a [u32] {
    match (K::A_LINE_MAJOR, strides.1 == 1) {
        (true, true) => {
            // SAFETY: the rows lie inside `a`; the CPU has `K`'s features.
            unsafe { K::pack_rows(src, strides.0, len, kc, mr, packed) };
            &*packed
        }
        (true, false) => {
            // SAFETY: as above.
            unsafe { K::pack(src, strides, len, kc, mr, packed) };
            line_majored(packed, mr, words, len.div_ceil(mr), line_major)
        }
        (false, _) => {
            // SAFETY: as above.
            unsafe { K::pack(src, strides, len, kc, mr, packed) };
            &*packed
        }
    }
}

/// `panels` packed panels of `a` (`width` lines, word after word) rewritten line after line
/// into `out`.
fn line_majored<'a>(
    packed: &[u32],
    width: usize,
    words: usize,
    panels: usize,
    out: &'a mut [u32],
) -> &'a [u32] {
    let size = width * words;
    for (from, to) in packed.chunks_exact(size).zip(out.chunks_exact_mut(size)).take(panels) {
        for (w, column) in from.chunks_exact(width).enumerate() {
            for (t, &v) in column.iter().enumerate() {
                to[t * words + w] = v;
            }
        }
    }
    &out[..panels * size]
}

/// Runs one tile: straight into `c` when its rows are contiguous and it is whole (or the
/// kernel writes corners), otherwise through a buffer whose `rows x cols` corner is then added
/// or copied.
unsafe fn write_tile<K: Tile>(
    (a, b, words): (Panel, Panel, usize),
    mr: usize,
    (rows, cols): (usize, usize),
    corner: *mut f32,
    c: StridedMut,
    accumulate: bool,
) {
    let whole = rows == mr && cols == K::NR;
    if (whole || K::PARTIAL) && c.cols == 1 && c.rows > 0 {
        let out = TileOut { ptr: corner, ldc: c.rows as usize, rows, cols, accumulate };
        // SAFETY: passed on from the caller.
        return unsafe { K::tile(mr, words, a, b, out) };
    }
    let mut buffer = [0f32; 32 * 32];
    assert!(mr * K::NR <= buffer.len(), "tile fits its buffer");
    let out =
        TileOut { ptr: buffer.as_mut_ptr(), ldc: K::NR, rows: mr, cols: K::NR, accumulate: false };
    // SAFETY: the buffer holds `mr` rows of `NR`.
    unsafe { K::tile(mr, words, a, b, out) };
    for (i, row) in buffer.chunks_exact(K::NR).take(rows).enumerate() {
        for (j, &v) in row[..cols].iter().enumerate() {
            // SAFETY: `(i, j)` is inside the tile's valid corner, inside `c`.
            let out = unsafe { &mut *corner.offset(i as isize * c.rows + j as isize * c.cols) };
            *out = if accumulate { *out + v } else { v };
        }
    }
}

/// Packs `len` lines of `kc` values (line `d`, value `p` at `src + d * strides.0 + p *
/// strides.1`) into panels `width` lines wide: panel after panel, each word after word of `k`,
/// each word the `width` lines side by side; lines and values past the ends are zeros.
pub(crate) fn pack<K: Tile>(
    src: *const f32,
    (line, along): (isize, isize),
    len: usize,
    kc: usize,
    width: usize,
    out: &mut [u32],
) {
    let words = kc.div_ceil(K::K_PER_WORD).next_multiple_of(K::WORD_ALIGN);
    let at = |d: usize, p: usize| {
        // SAFETY: every caller reads line `d < len`, value `p < kc`, inside the block.
        unsafe { *src.offset(d as isize * line + p as isize * along) }
    };
    let value = |d: usize, p: usize| if p < kc { at(d, p) } else { 0.0 };
    for (panel, packed) in out.chunks_exact_mut(width * words).take(len.div_ceil(width)).enumerate()
    {
        let lines = width.min(len - panel * width);
        let first = panel * width;
        if line == 1 {
            // Lines side by side in memory (`b` row-major, `a` read transposed): each word's
            // `width` values are one contiguous run.
            for (w, dst) in packed.chunks_exact_mut(width).enumerate() {
                let p = w * K::K_PER_WORD;
                for (t, d) in dst[..lines].iter_mut().enumerate() {
                    let hi = if K::K_PER_WORD == 2 { value(first + t, p + 1) } else { 0.0 };
                    *d = K::word(value(first + t, p), hi);
                }
                dst[lines..].fill(0);
            }
        } else {
            // Each line's values contiguous (or strided): walk a line at a time.
            for t in 0..lines {
                for w in 0..words {
                    let p = w * K::K_PER_WORD;
                    let hi = if K::K_PER_WORD == 2 { value(first + t, p + 1) } else { 0.0 };
                    packed[w * width + t] = K::word(value(first + t, p), hi);
                }
            }
            for w in 0..words {
                packed[w * width + lines..(w + 1) * width].fill(0);
            }
        }
    }
}

/// The word of a `bf16` pair of `k`: `lo` in its low half, `hi` in its high half.
pub(crate) fn bf16_pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | (bf16_bits(hi) << 16)
}

/// `x` rounded to the nearest `bf16` (ties to even), as its 16 bits, as `vcvtneps2bf16` does:
/// NaN stays NaN and subnormals flush to zero.
pub(crate) fn bf16_bits(x: f32) -> u32 {
    let bits = x.to_bits();
    if x.is_nan() {
        return (bits >> 16) | 0x40;
    }
    if x.is_subnormal() {
        return (bits >> 16) & 0x8000;
    }
    (bits + 0x7fff + ((bits >> 16) & 1)) >> 16
}
