//! A GEMM as the GPU step asks for it, whatever runs it (cuBLAS, or the CPU emulating a device
//! in tests).

/// One GEMM `C = op(A) op(B) + beta C` in cuBLAS's column-major terms: `C` is `m x n`, the
/// inner dimension `k`, each matrix with its leading dimension; `a` and `b` hold bf16 values
/// with `half`, else `f32`; `c` is `f32`.
pub struct Gemm {
    pub half: bool,
    pub trans: (bool, bool),
    pub mnk: (usize, usize, usize),
    pub a: (u64, usize),
    pub b: (u64, usize),
    pub beta: f32,
    pub c: (u64, usize),
}
