//! The 256-entry codebooks of 8-bit optimizer state (bitsandbytes' *dynamic* map, as in
//! "8-bit Optimizers via Block-wise Quantization", Dettmers et al. 2022) and the search for a
//! value's code.
//!
//! The dynamic map spends its codes on a logarithmic-like grid: for each decimal exponent `e`
//! in `-6..=0`, an even grid over `[0.1, 1] * 10^e`, finer in the higher decades; then 0 and 1.
//! Values from about 1e-6 of a block's largest up to it stay non-zero (within 4% in the top
//! decade, 8% in the next, coarser below); a linear code would round most of Adam's second
//! moment, which spans many orders of magnitude within a block, to zero. The signed codebook
//! (Adam's first moment, SGD's velocity) mirrors its grids below zero; the unsigned one (Adam's
//! second moment, never negative) spends the sign bit on grids twice as fine.
//!
//! A value's code is defined by arithmetic ([`Grids::encode`]): its magnitude picks a grid by
//! comparison with the seven thresholds between grids, and its place on that grid is rounded.
//! Every step is an `f32` operation with one correct result, so the AVX2 kernel
//! ([`super::quantized_avx2`]), which does them eight lanes at a time, gives the same codes.
//! Without AVX2, one operation at a time is slow; [`Codebook::encode`] looks the code up in
//! tables built from that definition instead, and gives the same codes again, so replicas and
//! processes agree bit for bit whatever their CPUs.

use std::sync::LazyLock;

/// The codebook of signed state (Adam's first moment, SGD's velocity).
pub(crate) static SIGNED: LazyLock<Codebook> = LazyLock::new(|| Codebook::dynamic(true));
/// The codebook of non-negative state (Adam's second moment).
pub(crate) static UNSIGNED: LazyLock<Codebook> = LazyLock::new(|| Codebook::dynamic(false));

/// Which codebook an 8-bit state buffer quantises in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateCodebook {
    /// Values of either sign: Adam's first moment, SGD's velocity.
    Signed,
    /// Values never below zero: Adam's second moment.
    Unsigned,
}

impl StateCodebook {
    /// Its codebook.
    #[cfg(any(feature = "cuda", test))]
    pub(crate) fn codebook(self) -> &'static Codebook {
        match self {
            StateCodebook::Signed => &SIGNED,
            StateCodebook::Unsigned => &UNSIGNED,
        }
    }
}

/// Grids per codebook: the seven decades, then the single value 1 (zero is apart).
pub(crate) const GRIDS: usize = 8;

/// A codebook's grids, as its encoding reads them: a magnitude `a` at or above
/// `starts[g - 1]` (and below `starts[g]`) is on grid `g`, at place
/// `k = trunc((a - first[g]) * per_step[g] + 0.5)` clamped to `0..=last[g]`, code `up[g] + k`
/// (or, below zero, `down[g] - k`); a magnitude below `zero_below`, or NaN, is `zero`'s.
#[derive(Debug)]
pub(crate) struct Grids {
    pub(crate) signed: bool,
    pub(crate) zero_below: f32,
    pub(crate) zero: f32,
    pub(crate) starts: [f32; GRIDS - 1],
    pub(crate) first: [f32; GRIDS],
    pub(crate) per_step: [f32; GRIDS],
    pub(crate) last: [f32; GRIDS],
    pub(crate) up: [f32; GRIDS],
    pub(crate) down: [f32; GRIDS],
}

impl Grids {
    /// The code of `y`: the nearest (up to `f32` rounding at the midpoints between codes; for
    /// the unsigned codebook, any positive `y` at least its smallest positive code, any
    /// negative one zero's); values beyond `[-1, 1]` take the end codes, NaN zero's code.
    pub(crate) fn encode(&self, y: f32) -> u8 {
        // The AVX2 kernel's operations, in its order.
        let a = if self.signed { y.abs() } else { y.max(0.0) };
        if a.is_nan() || a < self.zero_below {
            return self.zero as u8;
        }
        let g = self.starts.iter().filter(|&&start| a >= start).count();
        let place = (a - self.first[g]) * self.per_step[g] + 0.5;
        // Truncated by conversion (the kernel rounds toward zero): within `0..=255` both
        // are exact.
        let k = place.max(0.0).min(self.last[g]) as u8 as f32;
        let base = if y.is_sign_negative() { self.down[g] } else { self.up[g] };
        (base + k.copysign(y)) as u8
    }
}

/// A sorted 256-entry codebook over `[-1, 1]` (or `[0, 1]`), its grids, and the tables that
/// make finding a code one load and one comparison.
#[derive(Debug)]
pub(crate) struct Codebook {
    values: [f32; 256],
    /// Byte `j` of each value, in `planes[j]`: the table of the AVX-512 decoding kernel.
    planes: [[u8; 256]; 4],
    pub(crate) grids: Grids,
    /// `bounds[k]` is the lowest float whose code is above `k`; the last is NaN.
    bounds: [f32; 256],
    /// For each run of floats sharing their top [`LOOKUP_BITS`] bits (sign, exponent and 8
    /// bits of mantissa), the code of its lowest value. No run holds two bounds (codes are at
    /// least 0.35% apart, a run is under 0.4% of its values wide; `Codebook::dynamic` checks
    /// it), so a value's code is that one or the next.
    lookup: Box<[u8]>,
}

/// Values of [`Codebook::device_table`] (`DP_BOOK_LEN` in `optim8.cu`). Always compiled:
/// the GPU's memory is predicted without the `cuda` feature (`cuda/device_memory.rs`).
pub(crate) const DEVICE_TABLE_LEN: usize = 256 + 3 + (GRIDS - 1) + 5 * GRIDS;

/// Bits of a float's representation that index [`Codebook::lookup`].
const LOOKUP_BITS: u32 = 17;

impl Codebook {
    /// The dynamic tree codebook of bitsandbytes' `create_dynamic_map(signed, 7, 8)`: for each
    /// decimal exponent `e` in `-6..=0`, `2^(e+6)` (signed: each sign) or `2^(e+7)` (unsigned)
    /// midpoints of an even split of `[0.1, 1]`, times `10^e`; then 0 and 1.
    fn dynamic(signed: bool) -> Self {
        // Each grid's first value and step, and its number of values.
        let grids: Vec<(f64, f64, usize)> = (0..7)
            .map(|i| {
                let items = if signed { 1usize << i } else { 1usize << (i + 1) };
                let (scale, step) = (10f64.powi(i - 6), 0.9 / items as f64);
                // The midpoint of the first of `items` equal parts of [0.1, 1].
                (scale * (0.1 + step / 2.0), scale * step, items)
            })
            .chain([(1.0, 0.0, 1)])
            .collect();
        let magnitudes: Vec<f64> = grids
            .iter()
            .flat_map(|&(first, step, items)| (0..items).map(move |k| first + k as f64 * step))
            .collect();
        let mut values = magnitudes.clone();
        if signed {
            // 1 has no negative counterpart: the codebook holds 256 values.
            values.extend(magnitudes[..magnitudes.len() - 1].iter().map(|m| -m));
        }
        values.push(0.0);
        values.sort_by(f64::total_cmp);
        debug_assert_eq!(values.len(), 256);
        let code_of = |value: f64| values.iter().position(|&v| v == value).unwrap() as f32;
        let last_magnitude = |g: usize| grids[g].0 + (grids[g].2 - 1) as f64 * grids[g].1;
        let midpoint = |low: f64, high: f64| ((low + high) / 2.0) as f32;
        let grids = Grids {
            signed,
            // The unsigned codebook rounds no positive value to zero: Adam's second moment
            // rounded to zero under a first moment that is not would make the step `m / eps`.
            // Rounded up to the smallest code instead, it only shortens that step.
            zero_below: if signed { midpoint(0.0, grids[0].0) } else { f32::from_bits(1) },
            zero: code_of(0.0),
            starts: std::array::from_fn(|g| midpoint(last_magnitude(g), grids[g + 1].0)),
            first: std::array::from_fn(|g| grids[g].0 as f32),
            per_step: std::array::from_fn(|g| match grids[g].1 {
                0.0 => 0.0,
                step => (1.0 / step) as f32,
            }),
            last: std::array::from_fn(|g| (grids[g].2 - 1) as f32),
            up: std::array::from_fn(|g| code_of(grids[g].0)),
            // Below zero: the mirrored grid, or (for 1, and in the unsigned codebook, where no
            // negative value is on a grid) the lowest code.
            down: std::array::from_fn(|g| {
                if signed && g < GRIDS - 1 { code_of(-grids[g].0) } else { 0.0 }
            }),
        };
        let bounds = std::array::from_fn(|k| lowest_above(&grids, k as u8));
        let shift = 32 - LOOKUP_BITS;
        let lookup = (0..1u32 << LOOKUP_BITS)
            .map(|run| {
                // The run's lowest value: its first float if positive, its last if negative.
                let (first, last) =
                    (f32::from_bits(run << shift), f32::from_bits(!(!run << shift)));
                let (low, high) =
                    if first.is_sign_negative() { (last, first) } else { (first, last) };
                let code = if low.is_nan() { 0 } else { grids.encode(low) };
                debug_assert!(
                    high.is_nan() || grids.encode(high) <= code.saturating_add(1),
                    "run {run:#x} holds two bounds"
                );
                code
            })
            .collect();
        let values: [f32; 256] = std::array::from_fn(|k| values[k] as f32);
        let planes = std::array::from_fn(|j| values.map(|v| (v.to_bits() >> (8 * j)) as u8));
        Codebook { values, planes, grids, bounds, lookup }
    }

    /// The value of `code`.
    #[inline]
    pub(crate) fn decode(&self, code: u8) -> f32 {
        self.values[usize::from(code)]
    }

    /// Byte `j` of each entry, in `[j]`.
    pub(crate) fn byte_planes(&self) -> &[[u8; 256]; 4] {
        &self.planes
    }

    /// The lowest value of each code's successor (NaN for the last), where codes change.
    #[cfg(test)]
    pub(crate) fn bounds(&self) -> &[f32; 256] {
        &self.bounds
    }

    /// The codebook's entries, in ascending order.
    #[cfg(test)]
    pub(crate) fn values(&self) -> &[f32; 256] {
        &self.values
    }

    /// The codebook as the GPU's 8-bit state kernels read it (`optim8.cu`, [`DEVICE_TABLE_LEN`]
    /// values): its 256 values, then its grids as [`Grids::encode`] uses them: whether it is
    /// signed (1 or 0), `zero_below`, `zero`, `starts`, `first`, `per_step`, `last`, `up`,
    /// `down`.
    #[cfg(any(feature = "cuda", test))]
    pub(crate) fn device_table(&self) -> Vec<f32> {
        let g = &self.grids;
        let mut table = self.values.to_vec();
        table.extend([f32::from(u8::from(g.signed)), g.zero_below, g.zero]);
        table.extend(g.starts);
        for row in [g.first, g.per_step, g.last, g.up, g.down] {
            table.extend(row);
        }
        debug_assert_eq!(table.len(), DEVICE_TABLE_LEN);
        table
    }

    /// [`Grids::encode`]'s code of `y`, by its tables.
    #[inline]
    pub(crate) fn encode(&self, y: f32) -> u8 {
        if y.is_nan() {
            // (Its run may hold infinity, whose code it does not share.)
            return self.grids.zero as u8;
        }
        let code = self.lookup[(y.to_bits() >> (32 - LOOKUP_BITS)) as usize];
        code + u8::from(self.bounds[usize::from(code)] <= y)
    }
}

/// The lowest float whose code is above `code` (NaN if none), by a binary search over the
/// floats in order: codes rise with values, as each step of [`Grids::encode`] is monotonic.
fn lowest_above(grids: &Grids, code: u8) -> f32 {
    // Floats in ascending order as integers: negatives' bits flipped, positives' sign set.
    let key = |v: f32| if v.is_sign_negative() { !v.to_bits() } else { v.to_bits() | 1 << 31 };
    let float = |key: u32| f32::from_bits(if key >> 31 == 1 { key & !(1 << 31) } else { !key });
    let (mut low, mut high) = (key(f32::NEG_INFINITY), key(f32::INFINITY));
    if grids.encode(float(high)) <= code {
        return f32::NAN;
    }
    // Invariant: `high`'s code is above `code`, and no float below `low` has one.
    while low < high {
        let mid = low + (high - low) / 2;
        if grids.encode(float(mid)) > code { high = mid } else { low = mid + 1 }
    }
    float(high)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn codebooks_are_sorted_span_the_unit_range_and_hold_zero() {
        for (book, low) in [(&*SIGNED, -1.0f32), (&*UNSIGNED, 0.0)] {
            let v = book.values();
            assert!(v.windows(2).all(|w| w[0] < w[1]), "strictly ascending");
            assert_eq!(v[255], 1.0);
            assert!(v[0] >= low && v[0] < low + 0.01, "lowest {}", v[0]);
            assert!(v.contains(&0.0));
            // Out of range, values take the end codes; NaN takes zero's.
            assert_eq!((book.encode(f32::INFINITY), book.encode(5.0)), (255, 255));
            assert_eq!((book.encode(f32::NEG_INFINITY), book.encode(-5.0)), (0, 0));
            assert_eq!(book.decode(book.encode(f32::NAN)), 0.0);
            // Every code decodes to a value that encodes back to it.
            for code in 0..=255u8 {
                assert_eq!(book.encode(book.decode(code)), code);
            }
        }
        // The finest non-zero magnitude is below a millionth.
        let smallest = SIGNED.values().iter().filter(|v| **v > 0.0).fold(1f32, |a, &b| a.min(b));
        assert!(smallest < 1e-6 && smallest > 1e-7, "{smallest}");
        // The unsigned codebook has no negative values: they take zero's code.
        assert_eq!(UNSIGNED.decode(UNSIGNED.encode(-0.5)), 0.0);
    }

    #[test]
    fn encode_finds_the_nearest_code() {
        let mut seed = 7;
        for book in [&*SIGNED, &*UNSIGNED] {
            // Values of every magnitude the codebooks hold, below and beyond.
            for _ in 0..50_000 {
                let y = lcg(&mut seed) * 10f32.powf(lcg(&mut seed) * 4.0 - 3.0);
                if !book.grids.signed && y > 0.0 && y < book.values()[1] {
                    // (The unsigned codebook's floor, tested below.)
                    continue;
                }
                let code = book.encode(y);
                let best =
                    (0..=255u8).map(|c| (book.decode(c) - y).abs()).fold(f32::INFINITY, f32::min);
                // Nearest, but for a rounding of the place on the grid: within a
                // millionth of the value (a grid's steps are over 0.35% of its values).
                let error = (book.decode(code) - y).abs();
                assert!(error <= best + 1e-6 * y.abs(), "y = {y}: {error} > {best}");
            }
        }
        // Any positive value of the unsigned codebook is at least its smallest positive code.
        for y in [f32::from_bits(1), 1e-30, 1e-9, UNSIGNED.values()[1] * 0.99] {
            assert_eq!(UNSIGNED.encode(y), 1, "{y}");
        }
        assert_eq!((UNSIGNED.encode(0.0), UNSIGNED.encode(-0.0)), (0, 0));
    }

    #[test]
    fn the_tables_give_the_codes_of_the_grids() {
        let mut seed = 11;
        for book in [&*SIGNED, &*UNSIGNED] {
            let check = |y: f32| {
                assert_eq!(book.encode(y), book.grids.encode(y), "y = {y:e} ({:#x})", y.to_bits());
            };
            // Where codes change, on both sides.
            for &bound in book.bounds().iter().filter(|b| !b.is_nan()) {
                for y in [
                    bound,
                    f32::from_bits(bound.to_bits() + 1),
                    f32::from_bits(bound.to_bits() - 1),
                ] {
                    check(y);
                }
            }
            // Values of every magnitude, and the odd ones.
            for _ in 0..100_000 {
                check(lcg(&mut seed) * 10f32.powf(lcg(&mut seed) * 20.0 - 10.0));
            }
            let odd = [0.0, -0.0, f32::MIN_POSITIVE, -f32::from_bits(1), f32::MAX, f32::MIN];
            for y in odd.into_iter().chain([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN])
            {
                check(y);
            }
        }
    }
}
