// Causal multi-head self-attention as src/ops/attention: per head, softmax(q k^T / sqrt(hd)) v,
// each position attending to itself and those before it, over the q, k and v of each sample's
// qkv [t, 3d] (head h's columns h*hd.. of each third); y is [t, d]; lse [batch, heads, t] is
// each query row's log-sum-exp of its scaled scores, all backward needs.
//
// The streaming softmax of FlashAttention-2, one thread per query row (forward and the query
// gradient) or key row (the key and value gradients): a running maximum and sum rescale what
// has been summed so far, so no t x t matrix exists anywhere, and backward recomputes each
// probability from q, k and lse. Each thread gathers its own row's sums in order: no atomics,
// the same bits on every run. Not tiled through shared memory: a head dimension up to
// DP_MAX_HEAD_DIM, checked when the model is put on the GPU.

#define DP_MAX_HEAD_DIM 128
#define DP_LOWEST -3.402823466e38f

extern "C" {

__global__ void dp_attention(const float* qkv, float* y, float* lse, long long batch,
                             long long t, long long heads, long long hd, float scale) {
    long long d = heads * hd, row = 3 * d;
    DP_FOR_EACH(n, batch * heads * t) {
        long long b = n / (heads * t), h = n / t % heads, i = n % t;
        const float* q = qkv + (b * t + i) * row + h * hd;
        float acc[DP_MAX_HEAD_DIM];
        for (long long c = 0; c < hd; ++c) acc[c] = 0.0f;
        float m = DP_LOWEST, l = 0.0f;
        for (long long j = 0; j <= i; ++j) {
            const float* k = qkv + (b * t + j) * row + d + h * hd;
            const float* v = k + d;
            float s = 0.0f;
            for (long long c = 0; c < hd; ++c) s += q[c] * k[c];
            s *= scale;
            float top = s > m ? s : m;
            float rescale = expf(m - top), p = expf(s - top);
            l = l * rescale + p;
            for (long long c = 0; c < hd; ++c) acc[c] = acc[c] * rescale + p * v[c];
            m = top;
        }
        float* out = y + (b * t + i) * d + h * hd;
        for (long long c = 0; c < hd; ++c) out[c] = acc[c] / l;
        lse[n] = m + logf(l);
    }
}

// delta[n] = dy . y over query row n's head: the softmax gradient's row constant.
__global__ void dp_attention_delta(const float* y, const float* dy, float* delta,
                                   long long batch, long long t, long long heads, long long hd) {
    long long d = heads * hd;
    DP_FOR_EACH(n, batch * heads * t) {
        long long b = n / (heads * t), h = n / t % heads, i = n % t;
        long long at = (b * t + i) * d + h * hd;
        float sum = 0.0f;
        for (long long c = 0; c < hd; ++c) sum += dy[at + c] * y[at + c];
        delta[n] = sum;
    }
}

// The score gradient of query i and key j: p (dy_i . v_j - delta_i), with p recomputed from
// lse; `p` also returned.
__device__ float dp_attention_ds(const float* q, const float* k, const float* v,
                                 const float* dyi, float lse, float delta, long long hd,
                                 float scale, float* p) {
    float s = 0.0f, dp = 0.0f;
    for (long long c = 0; c < hd; ++c) {
        s += q[c] * k[c];
        dp += dyi[c] * v[c];
    }
    *p = expf(s * scale - lse);
    return *p * (dp - delta);
}

// dq_i = scale * sum over j <= i of ds_ij k_j, written into dqkv's query columns.
__global__ void dp_attention_query_grad(const float* qkv, const float* dy, const float* lse,
                                        const float* delta, float* dqkv, long long batch,
                                        long long t, long long heads, long long hd,
                                        float scale) {
    long long d = heads * hd, row = 3 * d;
    DP_FOR_EACH(n, batch * heads * t) {
        long long b = n / (heads * t), h = n / t % heads, i = n % t;
        const float* q = qkv + (b * t + i) * row + h * hd;
        const float* dyi = dy + (b * t + i) * d + h * hd;
        float acc[DP_MAX_HEAD_DIM];
        for (long long c = 0; c < hd; ++c) acc[c] = 0.0f;
        for (long long j = 0; j <= i; ++j) {
            const float* k = qkv + (b * t + j) * row + d + h * hd;
            float p;
            float ds = dp_attention_ds(q, k, k + d, dyi, lse[n], delta[n], hd, scale, &p);
            for (long long c = 0; c < hd; ++c) acc[c] += ds * k[c];
        }
        float* dq = dqkv + (b * t + i) * row + h * hd;
        for (long long c = 0; c < hd; ++c) dq[c] = acc[c] * scale;
    }
}

// dk_j = scale * sum over i >= j of ds_ij q_i and dv_j = sum over i >= j of p_ij dy_i,
// written into dqkv's key and value columns.
__global__ void dp_attention_key_grad(const float* qkv, const float* dy, const float* lse,
                                      const float* delta, float* dqkv, long long batch,
                                      long long t, long long heads, long long hd, float scale) {
    long long d = heads * hd, row = 3 * d;
    DP_FOR_EACH(n, batch * heads * t) {
        long long b = n / (heads * t), h = n / t % heads, j = n % t;
        const float* k = qkv + (b * t + j) * row + d + h * hd;
        float dk[DP_MAX_HEAD_DIM], dv[DP_MAX_HEAD_DIM];
        for (long long c = 0; c < hd; ++c) dk[c] = dv[c] = 0.0f;
        for (long long i = j; i < t; ++i) {
            const float* q = qkv + (b * t + i) * row + h * hd;
            const float* dyi = dy + (b * t + i) * d + h * hd;
            long long m = n - j + i;
            float p;
            float ds = dp_attention_ds(q, k, k + d, dyi, lse[m], delta[m], hd, scale, &p);
            for (long long c = 0; c < hd; ++c) {
                dk[c] += ds * q[c];
                dv[c] += p * dyi[c];
            }
        }
        float* out = dqkv + (b * t + j) * row + d + h * hd;
        for (long long c = 0; c < hd; ++c) {
            out[c] = dk[c] * scale;
            out[d + c] = dv[c];
        }
    }
}

// Decoding with a KV cache: the query `q` [d] of one new position against the `len` cached
// keys and values [len, d] (its own included), as src/ops/attention `decode`; one thread per
// head, the same streaming softmax as dp_attention. No key leaves y zero.
__global__ void dp_attention_decode(const float* q, const float* k, const float* v, float* y,
                                    long long len, long long heads, long long hd, float scale) {
    long long d = heads * hd;
    DP_FOR_EACH(h, heads) {
        float acc[DP_MAX_HEAD_DIM];
        for (long long c = 0; c < hd; ++c) acc[c] = 0.0f;
        float m = DP_LOWEST, l = 0.0f;
        for (long long j = 0; j < len; ++j) {
            const float* kj = k + j * d + h * hd;
            const float* vj = v + j * d + h * hd;
            float s = 0.0f;
            for (long long c = 0; c < hd; ++c) s += q[h * hd + c] * kj[c];
            s *= scale;
            float top = s > m ? s : m;
            float rescale = expf(m - top), p = expf(s - top);
            l = l * rescale + p;
            for (long long c = 0; c < hd; ++c) acc[c] = acc[c] * rescale + p * vj[c];
            m = top;
        }
        for (long long c = 0; c < hd; ++c) y[h * hd + c] = l > 0.0f ? acc[c] / l : 0.0f;
    }
}

}  // extern "C"
