//! A seeded permutation of `0..n` that is computed, not stored: a four-round Feistel network
//! over the smallest power-of-two domain that holds `n`, with cycle walking to stay below `n`.
//! O(1) memory whatever `n`, so a shuffle never needs an O(records) array.

/// A bijection of `0..n`, fixed by its key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

/// SplitMix64's finalizer: a fast, well-mixed 64-bit hash.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hashes several words into one.
pub(crate) fn hash(words: &[u64]) -> u64 {
    words.iter().fold(0x005E_ED0F_DA7A, |acc, &w| mix(acc ^ mix(w)))
}

impl Permutation {
    pub(crate) fn new(n: u64, key: u64) -> Self {
        // Two halves of `half_bits` each cover 0..4^half_bits >= n (at least 1 bit per half).
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let keys = [mix(key), mix(key ^ 1), mix(key ^ 2), mix(key ^ 3)];
        Permutation { n, half_bits, keys }
    }

    /// Where `i < n` goes.
    pub(crate) fn apply(&self, mut i: u64) -> u64 {
        debug_assert!(i < self.n);
        // Cycle walking: a bijection of the larger domain, applied until the value falls back
        // into 0..n, is a bijection of 0..n. The domain is under 4n, so few steps are needed.
        loop {
            i = self.round_trip(i);
            if i < self.n {
                return i;
            }
        }
    }

    fn round_trip(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for key in self.keys {
            let next = left ^ (mix(right ^ key) & mask);
            left = right;
            right = next;
        }
        (left << self.half_bits) | right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_bijection_for_many_sizes() {
        for n in [1u64, 2, 3, 7, 64, 100, 1000, 4097] {
            let p = Permutation::new(n, 42);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = p.apply(i);
                assert!(j < n);
                assert!(!seen[j as usize], "n={n}: {j} hit twice");
                seen[j as usize] = true;
            }
        }
    }

    #[test]
    fn different_keys_give_different_orders() {
        let (a, b) = (Permutation::new(1000, 1), Permutation::new(1000, 2));
        let same = (0..1000).filter(|&i| a.apply(i) == b.apply(i)).count();
        assert!(same < 20, "{same} fixed points in common");
        // And a permutation is not close to the identity.
        let fixed = (0..1000).filter(|&i| a.apply(i) == i).count();
        assert!(fixed < 20, "{fixed} fixed points");
    }
}
