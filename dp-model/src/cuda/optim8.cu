// 8-bit optimizer state as src/optim/quantized.rs: blocks of DP_STATE_BLOCK values, each with
// one f32 scale (its largest magnitude) and a byte per value, the code of value / scale in a
// 256-entry codebook (src/optim/codebook.rs), with the updates of src/optim/adam.rs and
// src/optim/sgd.rs in between.
//
// An update takes two launches of DP_STATE_LANES threads per block, neighbouring threads
// reading neighbouring values (coalesced): the first computes each lane's largest new
// magnitude and keeps the block's old scale aside; the second takes the block's new scale from
// its lanes' and computes the update again, writing the parameters and the new codes. Computing
// it twice reads the gradients and codes twice but keeps no f32 copy of the state, which is
// what 8 bits are for; no thread waits for another, so it needs no shared memory or atomics.
//
// Each state buffer has a work area (`work`): the codebook as src/optim/codebook.rs
// `device_table` lays it out, the blocks' old scales, then their lanes' maxima.

extern "C" {

#define DP_STATE_BLOCK 2048
#define DP_STATE_LANES 32
#define DP_BOOK_LEN 306

// The values of lane `t % DP_STATE_LANES` of block `t / DP_STATE_LANES`: every
// DP_STATE_LANES-th from the lane's first, to the end of the block or of all `n`.
#define DP_LANE_VALUES(i, t, n)                                                          \
    for (long long i = (t) / DP_STATE_LANES * DP_STATE_BLOCK + (t) % DP_STATE_LANES,       \
                   i##_end = ((t) / DP_STATE_LANES + 1) * DP_STATE_BLOCK < (n)             \
                                 ? ((t) / DP_STATE_LANES + 1) * DP_STATE_BLOCK             \
                                 : (n);                                                    \
         i < i##_end; i += DP_STATE_LANES)

__device__ long long dp_state_blocks(long long n) {
    return (n + DP_STATE_BLOCK - 1) / DP_STATE_BLOCK;
}

// The blocks' old scales and their lanes' maxima in a work area.
__device__ float* dp_old_scales(float* work) { return work + DP_BOOK_LEN; }
__device__ float* dp_lane_maxima(float* work, long long blocks) {
    return work + DP_BOOK_LEN + blocks;
}

// The value of `code` at `scale`, as src/optim/quantized.rs `dequantize`.
__device__ float dp_decode(const float* book, unsigned char code, float scale) {
    return book[code] * scale;
}

// The code of `y` (a value over its block's scale), as src/optim/codebook.rs `Grids::encode`,
// operation for operation: the product and sum are rounded apart (no fused multiply-add), so
// the codes are the CPU's.
__device__ unsigned char dp_encode(const float* book, float y) {
    const float* g = book + 256;
    float is_signed = g[0], zero_below = g[1], zero = g[2];
    const float *starts = g + 3, *first = g + 10, *per_step = g + 18, *last = g + 26;
    const float *up = g + 34, *down = g + 42;
    float a = is_signed != 0.0f ? fabsf(y) : fmaxf(y, 0.0f);
    if (a != a || a < zero_below) return (unsigned char)zero;
    int grid = 0;
    for (int s = 0; s < 7; ++s) grid += a >= starts[s] ? 1 : 0;
    float place = __fadd_rn(__fmul_rn(a - first[grid], per_step[grid]), 0.5f);
    float k = (float)(int)fminf(fmaxf(place, 0.0f), last[grid]);
    float base = signbit(y) ? down[grid] : up[grid];
    return (unsigned char)(int)(base + copysignf(k, y));
}

// The largest of block `block`'s lane maxima: its new scale.
__device__ float dp_block_scale(float* work, long long blocks, long long block) {
    const float* maxima = dp_lane_maxima(work, blocks) + block * DP_STATE_LANES;
    float scale = 0.0f;
    for (int lane = 0; lane < DP_STATE_LANES; ++lane) scale = fmaxf(scale, maxima[lane]);
    return scale;
}

// What multiplies a value to give its place in the codebook's [-1, 1].
__device__ float dp_inverse_scale(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }

// Adam's new moments of value i from their codes at the old scales.
__device__ void dp_adam8_moments(const float* p, const float* grad, long long i,
                                 const unsigned char* m_codes, float m_scale, const float* m_book,
                                 const unsigned char* v_codes, float v_scale, const float* v_book,
                                 float b1, float b2, float wd, float* m, float* v) {
    float g = grad[i] + wd * p[i];
    *m = b1 * dp_decode(m_book, m_codes[i], m_scale) + (1.0f - b1) * g;
    *v = b2 * dp_decode(v_book, v_codes[i], v_scale) + (1.0f - b2) * g * g;
}

__global__ void dp_adam8_maxima(const float* p, const float* grad, long long n,
                                const unsigned char* m_codes, const float* m_scales,
                                float* m_work, const unsigned char* v_codes,
                                const float* v_scales, float* v_work, float b1, float b2,
                                float coupled_wd, const long long* decayed, long long ranges) {
    long long blocks = dp_state_blocks(n);
    DP_FOR_EACH(t, blocks * DP_STATE_LANES) {
        long long block = t / DP_STATE_LANES;
        float m_scale = m_scales[block], v_scale = v_scales[block];
        if (t % DP_STATE_LANES == 0) {
            dp_old_scales(m_work)[block] = m_scale;
            dp_old_scales(v_work)[block] = v_scale;
        }
        float m_max = 0.0f, v_max = 0.0f;
        DP_LANE_VALUES(i, t, n) {
            float wd = dp_decays(decayed, ranges, i) ? coupled_wd : 0.0f;
            float m, v;
            dp_adam8_moments(p, grad, i, m_codes, m_scale, m_work, v_codes, v_scale, v_work, b1,
                             b2, wd, &m, &v);
            m_max = fmaxf(m_max, fabsf(m));
            v_max = fmaxf(v_max, fabsf(v));
        }
        dp_lane_maxima(m_work, blocks)[t] = m_max;
        dp_lane_maxima(v_work, blocks)[t] = v_max;
    }
}

__global__ void dp_adam8_step(float* p, const float* grad, long long n, unsigned char* m_codes,
                              float* m_scales, float* m_work, unsigned char* v_codes,
                              float* v_scales, float* v_work, float step_size, float sqrt_c2,
                              float b1, float b2, float eps, float coupled_wd, float shrink,
                              const long long* decayed, long long ranges) {
    long long blocks = dp_state_blocks(n);
    DP_FOR_EACH(t, blocks * DP_STATE_LANES) {
        long long block = t / DP_STATE_LANES;
        float m_old = dp_old_scales(m_work)[block], v_old = dp_old_scales(v_work)[block];
        float m_scale = dp_block_scale(m_work, blocks, block);
        float v_scale = dp_block_scale(v_work, blocks, block);
        float m_inverse = dp_inverse_scale(m_scale), v_inverse = dp_inverse_scale(v_scale);
        DP_LANE_VALUES(i, t, n) {
            bool decay = dp_decays(decayed, ranges, i);
            float m, v;
            dp_adam8_moments(p, grad, i, m_codes, m_old, m_work, v_codes, v_old, v_work, b1, b2,
                             decay ? coupled_wd : 0.0f, &m, &v);
            p[i] = p[i] * (decay ? shrink : 1.0f) - step_size * m / (sqrtf(v) / sqrt_c2 + eps);
            m_codes[i] = dp_encode(m_work, m * m_inverse);
            v_codes[i] = dp_encode(v_work, v * v_inverse);
        }
        if (t % DP_STATE_LANES == 0) {
            m_scales[block] = m_scale;
            v_scales[block] = v_scale;
        }
    }
}

// SGD's gradient with decay and new velocity of value i, from its code at the old scale.
__device__ float dp_sgd8_velocity(const float* p, const float* grad, long long i,
                                  const unsigned char* codes, float scale, const float* book,
                                  float mu, float wd, float* g) {
    *g = grad[i] + wd * p[i];
    return mu * dp_decode(book, codes[i], scale) + *g;
}

__global__ void dp_sgd8_maxima(const float* p, const float* grad, long long n,
                               const unsigned char* codes, const float* scales, float* work,
                               float wd, float mu, const long long* decayed, long long ranges) {
    long long blocks = dp_state_blocks(n);
    DP_FOR_EACH(t, blocks * DP_STATE_LANES) {
        long long block = t / DP_STATE_LANES;
        float scale = scales[block];
        if (t % DP_STATE_LANES == 0) dp_old_scales(work)[block] = scale;
        float most = 0.0f, g;
        DP_LANE_VALUES(i, t, n) {
            float decay = dp_decays(decayed, ranges, i) ? wd : 0.0f;
            most = fmaxf(most, fabsf(dp_sgd8_velocity(p, grad, i, codes, scale, work, mu, decay, &g)));
        }
        dp_lane_maxima(work, blocks)[t] = most;
    }
}

__global__ void dp_sgd8_step(float* p, const float* grad, long long n, unsigned char* codes,
                             float* scales, float* work, float lr, float wd, float mu,
                             int nesterov, const long long* decayed, long long ranges) {
    long long blocks = dp_state_blocks(n);
    DP_FOR_EACH(t, blocks * DP_STATE_LANES) {
        long long block = t / DP_STATE_LANES;
        float old = dp_old_scales(work)[block];
        float scale = dp_block_scale(work, blocks, block);
        float inverse = dp_inverse_scale(scale);
        DP_LANE_VALUES(i, t, n) {
            float decay = dp_decays(decayed, ranges, i) ? wd : 0.0f, g;
            float v = dp_sgd8_velocity(p, grad, i, codes, old, work, mu, decay, &g);
            p[i] -= lr * (nesterov ? g + mu * v : v);
            codes[i] = dp_encode(work, v * inverse);
        }
        if (t % DP_STATE_LANES == 0) scales[block] = scale;
    }
}

}  // extern "C"
