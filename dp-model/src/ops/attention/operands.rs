//! What a block product reads and where a register tile of it sits, shared by the generic
//! tiles and the AVX-512 ones.

/// The left operand of a block product: element `(r, p)` at `data[r * row + p * col]`, so a
/// block of `qkv` (rows `3d` apart) and a transposed scratch block read alike.
#[derive(Clone, Copy)]
pub(super) struct Left<'a, T> {
    pub(super) data: &'a [T],
    pub(super) row: usize,
    pub(super) col: usize,
}

/// Where a tile sits: output rows from `r0`, columns from `j0`, summing over `k0..k1`.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub(super) r0: usize,
    pub(super) j0: usize,
    pub(super) k0: usize,
    pub(super) k1: usize,
}
