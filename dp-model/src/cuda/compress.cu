// Gradient compression on the GPU, in dp-comm's wire format (its compress.rs): a piece of a
// gradient bucket, with the error-feedback residual added, rounded to bf16, or to int8 at the
// piece's scale (its largest finite magnitude over 127, in the payload's first four bytes,
// little-endian); the residual keeps what rounding dropped. After an all-gather of every rank's
// payload, the piece is their sum in rank order, so every rank gets the same bits. Products and
// sums are rounded apart (no fused multiply-add), as the CPU computes them.

extern "C" {

__global__ void dp_compress_bf16(const float* g, float* residual, unsigned short* out,
                                 long long n) {
    DP_FOR_EACH(i, n) {
        float v = g[i] + residual[i];
        unsigned short h = dp_bf16(v);
        residual[i] = v - __uint_as_float((unsigned int)h << 16);
        out[i] = h;
    }
}

// `parts` threads each take the largest finite magnitude of every `parts`-th value.
__global__ void dp_compress_absmax(const float* g, const float* residual, long long n,
                                   float* partials, long long parts) {
    DP_FOR_EACH(t, parts) {
        float most = 0.0f;
        for (long long i = t; i < n; i += parts) {
            float a = fabsf(g[i] + residual[i]);
            if (isfinite(a)) most = fmaxf(most, a);
        }
        partials[t] = most;
    }
}

// The piece's scale from the partial maxima, into the payload's first four bytes.
__global__ void dp_compress_scale(const float* partials, long long parts,
                                  unsigned char* payload) {
    DP_FOR_EACH(t, 1) {
        float most = 0.0f;
        for (long long p = 0; p < parts; ++p) most = fmaxf(most, partials[p]);
        unsigned int bits = __float_as_uint(most / 127.0f);
        for (int b = 0; b < 4; ++b) payload[b] = (unsigned char)(bits >> (8 * b));
    }
}

// The scale at the head of an int8 payload (which may lie at any byte).
__device__ float dp_payload_scale(const unsigned char* payload) {
    unsigned int bits = 0;
    for (int b = 0; b < 4; ++b) bits |= (unsigned int)payload[b] << (8 * b);
    return __uint_as_float(bits);
}

__global__ void dp_compress_int8(const float* g, float* residual, unsigned char* payload,
                                 long long n) {
    float scale = dp_payload_scale(payload);
    float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
    DP_FOR_EACH(i, n) {
        float v = g[i] + residual[i];
        float r = roundf(v * inverse);
        // NaN becomes 0, as Rust's conversion makes it.
        float q = r != r ? 0.0f : fminf(fmaxf(r, -127.0f), 127.0f);
        residual[i] = v - __fmul_rn(q, scale);
        payload[4 + i] = (unsigned char)(signed char)q;
    }
}

// `out` as the sum of the `ranks` payloads of `stride` bytes each in `gathered`, in rank
// order; `int8` says which format they are in.
__global__ void dp_decompress_sum(const unsigned char* gathered, long long ranks,
                                  long long stride, int int8, float* out, long long n) {
    DP_FOR_EACH(i, n) {
        float sum = 0.0f;
        for (long long r = 0; r < ranks; ++r) {
            const unsigned char* part = gathered + r * stride;
            if (int8) {
                float q = (float)(signed char)part[4 + i];
                sum = __fadd_rn(sum, __fmul_rn(q, dp_payload_scale(part)));
            } else {
                unsigned int h = (unsigned int)part[2 * i] | ((unsigned int)part[2 * i + 1] << 8);
                sum += __uint_as_float(h << 16);
            }
        }
        out[i] = sum;
    }
}

}  // extern "C"
