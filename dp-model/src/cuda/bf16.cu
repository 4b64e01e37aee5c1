// Mixed precision: the f32 values a tensor-core GEMM reads, rounded to bf16 (the GEMM sums in
// f32 and writes f32, and the master weights stay f32, as PyTorch's autocast does); and
// activations kept for backward in bf16, rounded and widened.

extern "C" {

// `v` rounded to the nearest bf16 (ties to even) as its bits; NaN stays a quiet NaN and
// subnormals are kept, as src/saved.rs `to_bf16`.
__device__ unsigned short dp_bf16(float v) {
    unsigned int bits = __float_as_uint(v);
    if (v != v) return (unsigned short)((bits >> 16) | 0x40);
    return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

__global__ void dp_to_bf16(const float* x, unsigned short* y, long long n) {
    DP_FOR_EACH(i, n) { y[i] = dp_bf16(x[i]); }
}

// bf16 widened to f32, exactly: an activation stored in bf16 read back for backward.
__global__ void dp_from_bf16(const unsigned short* x, float* y, long long n) {
    DP_FOR_EACH(i, n) { y[i] = __uint_as_float((unsigned int)x[i] << 16); }
}

}  // extern "C"
