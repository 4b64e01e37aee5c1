// dp-model's CUDA kernels for f32 (the image layers' are in image.cu, batch norm's in
// batch_norm.cu, bf16 rounding in bf16.cu): the same arithmetic as the CPU ops in src/ops, so that a
// model trained on one device continues on the other. GEMMs go through cuBLAS; everything
// else is here. One thread per element (grid-stride loops) unless a kernel says otherwise.
// Compiled once per process by NVRTC.

extern "C" {

// SplitMix64's finalizer, as src/ops/dropout.rs `mix`.
__device__ unsigned long long dp_mix(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define DP_FOR_EACH(i, n) \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)

// The tanh approximation of GELU, as src/ops/activation.rs.
#define DP_GELU_C 0.7978845608028654f
#define DP_GELU_A 0.044715f

// Activation kinds: 0 ReLU, 1 GELU, 2 tanh.
__device__ float dp_activate(float v, int kind) {
    if (kind == 0) return v > 0.0f ? v : 0.0f;
    if (kind == 1) {
        float t = tanhf(DP_GELU_C * (v + DP_GELU_A * v * v * v));
        return 0.5f * v * (1.0f + t);
    }
    return tanhf(v);
}

__global__ void dp_activation_forward(const float* x, float* y, long long n, int kind) {
    DP_FOR_EACH(i, n) { y[i] = dp_activate(x[i], kind); }
}

// A linear layer's bias and the activation after it in one pass over its [rows, cols] output:
// y += bias (the activation's input, which backward reads) and out = act(y). One launch and
// one read of y instead of two: small layers are bound by launches and memory, not FLOPs.
__global__ void dp_bias_activation(float* y, const float* bias, float* out, long long rows,
                                   long long cols, int kind) {
    DP_FOR_EACH(i, rows * cols) {
        float v = y[i] + bias[i % cols];
        y[i] = v;
        out[i] = dp_activate(v, kind);
    }
}

// ReLU and tanh read the output, GELU the input, as on the CPU.
__global__ void dp_activation_backward(const float* x, const float* y, const float* dy,
                                       float* dx, long long n, int kind) {
    DP_FOR_EACH(i, n) {
        if (kind == 0) {
            dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
        } else if (kind == 1) {
            float v = x[i];
            float t = tanhf(DP_GELU_C * (v + DP_GELU_A * v * v * v));
            float du = DP_GELU_C * (1.0f + 3.0f * DP_GELU_A * v * v);
            dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
        } else {
            dx[i] = dy[i] * (1.0f - y[i] * y[i]);
        }
    }
}

// Inverted dropout with the CPU's counter-based mask: element i is kept when
// mix(key ^ i) >= threshold. Forward and backward are this same kernel.
__global__ void dp_dropout(const float* src, float* dst, long long n, unsigned long long key,
                           unsigned long long threshold, float scale) {
    DP_FOR_EACH(i, n) {
        bool keep = dp_mix(key ^ (unsigned long long)i) >= threshold;
        dst[i] = keep ? src[i] * scale : 0.0f;
    }
}

// y[r, c] += bias[c] for a row-major [rows, cols] output.
__global__ void dp_add_bias(float* y, const float* bias, long long rows, long long cols) {
    DP_FOR_EACH(i, rows * cols) { y[i] += bias[i % cols]; }
}

// Softmax cross-entropy over row-major logits [rows, cols], one thread per row, as
// src/ops/loss.rs: a negative label means "ignore this sample" (zero gradient, not counted).
// With label smoothing s the target is 1 - s on the label plus s / cols on every class.
// Writes each row's loss, whether it counts and whether its argmax is the label; with grad,
// the gradient of the loss divided by the denominator. `grad` may be `logits` itself (a
// language model's logits take no second buffer): a row is read whole before its gradient
// is written over it.
__global__ void dp_softmax_cross_entropy(const float* logits, const long long* labels,
                                         float* grad, float* row_loss, int* row_counted,
                                         int* row_correct, long long rows, long long cols,
                                         float inv_denominator, float smoothing) {
    DP_FOR_EACH(r, rows) {
        const float* z = logits + r * cols;
        long long label = labels[r];
        long long best = 0;
        float max = z[0];
        for (long long c = 1; c < cols; ++c) {
            if (z[c] > max) { max = z[c]; best = c; }
        }
        if (label < 0 || label >= cols) {
            if (grad) for (long long c = 0; c < cols; ++c) grad[r * cols + c] = 0.0f;
            row_loss[r] = 0.0f;
            row_counted[r] = 0;
            row_correct[r] = 0;
            continue;
        }
        float sum = 0.0f, total = 0.0f;
        for (long long c = 0; c < cols; ++c) {
            sum += expf(z[c] - max);
            total += z[c];
        }
        float keep = 1.0f - smoothing, spread = smoothing / (float)cols;
        float mean = smoothing > 0.0f ? total * spread : 0.0f;
        row_loss[r] = max + logf(sum) - keep * z[label] - mean;
        row_counted[r] = 1;
        row_correct[r] = best == label;
        if (grad) {
            float scale = inv_denominator / sum;
            for (long long c = 0; c < cols; ++c) {
                grad[r * cols + c] = expf(z[c] - max) * scale - spread * inv_denominator;
            }
            grad[r * cols + label] -= keep * inv_denominator;
        }
    }
}

// Mean squared error per row of [rows, cols] outputs against targets, one thread per row; its
// gradient divided by the denominator, and whether the row's argmax matches the target's.
// `grad` may be `z` itself: a row is read whole before its gradient is written over it.
__global__ void dp_squared_error(const float* z, const float* t, float* grad, float* row_loss,
                                 int* row_correct, long long rows, long long cols,
                                 float inv_denominator) {
    DP_FOR_EACH(r, rows) {
        float sum = 0.0f;
        long long best_z = 0, best_t = 0;
        for (long long c = 0; c < cols; ++c) {
            long long i = r * cols + c;
            float d = z[i] - t[i];
            sum += d * d;
            if (z[i] > z[r * cols + best_z]) best_z = c;
            if (t[i] > t[r * cols + best_t]) best_t = c;
        }
        row_loss[r] = sum / (float)cols;
        row_correct[r] = best_z == best_t;
        if (!grad) continue;
        for (long long i = r * cols; i < (r + 1) * cols; ++i) {
            grad[i] = (z[i] - t[i]) * (2.0f * inv_denominator / (float)cols);
        }
    }
}

// Whether weight decay applies to parameter i: `ranges` holds `count` sorted, disjoint
// [start, end) pairs (the layout's decayed ranges, which leave out biases and norms); a
// negative count decays every parameter.
__device__ bool dp_decays(const long long* ranges, long long count, long long i) {
    if (count < 0) return true;
    long long lo = 0, hi = count;
    while (lo < hi) {
        long long mid = (lo + hi) / 2;
        if (ranges[2 * mid + 1] <= i) lo = mid + 1; else hi = mid;
    }
    return lo < count && ranges[2 * lo] <= i;
}

// SGD as src/optim/sgd.rs: g = grad + wd * p; v = mu * v + g; p -= lr * (nesterov ? g + mu * v : v).
// Without momentum, v is null.
__global__ void dp_sgd_step(float* p, const float* grad, float* v, long long n, float lr,
                            float wd, float mu, int nesterov, const long long* decayed,
                            long long ranges) {
    DP_FOR_EACH(i, n) {
        float g = grad[i] + (dp_decays(decayed, ranges, i) ? wd : 0.0f) * p[i];
        if (v) {
            float vi = mu * v[i] + g;
            v[i] = vi;
            p[i] -= lr * (nesterov ? g + mu * vi : vi);
        } else {
            p[i] -= lr * g;
        }
    }
}

// Adam and AdamW as src/optim/adam.rs, with the bias corrections folded into step_size and
// sqrt_c2 by the caller, as PyTorch does; a parameter without decay has neither the coupled
// decay nor the decoupled shrink.
__global__ void dp_adam_step(float* p, const float* grad, float* m, float* v, long long n,
                             float step_size, float sqrt_c2, float b1, float b2, float eps,
                             float coupled_wd, float shrink, const long long* decayed,
                             long long ranges) {
    DP_FOR_EACH(i, n) {
        bool decays = dp_decays(decayed, ranges, i);
        float g = grad[i] + (decays ? coupled_wd : 0.0f) * p[i];
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * (decays ? shrink : 1.0f) - step_size * mi / (sqrtf(vi) / sqrt_c2 + eps);
    }
}

// Gradient clipping by global norm, as src/optim/clip.rs, in three launches: `parts` threads
// each sum the squares of every `parts`-th gradient in f64; one thread adds those and takes
// the root; every gradient is scaled by max_norm / (norm + 1e-6) when the norm is finite and
// above max_norm.
__global__ void dp_square_partials(const float* g, long long n, double* partials,
                                   long long parts) {
    DP_FOR_EACH(t, parts) {
        double sum = 0.0;
        for (long long i = t; i < n; i += parts) sum += (double)g[i] * (double)g[i];
        partials[t] = sum;
    }
}

__global__ void dp_norm(const double* partials, long long parts, double* norm) {
    DP_FOR_EACH(t, 1) {
        double sum = 0.0;
        for (long long p = 0; p < parts; ++p) sum += partials[p];
        *norm = sqrt(sum);
    }
}

__global__ void dp_clip(float* g, long long n, const double* norm, double max_norm) {
    DP_FOR_EACH(i, n) {
        double total = *norm;
        if (isfinite(total) && total > max_norm) g[i] *= (float)(max_norm / (total + 1e-6));
    }
}

// Zeroes the pruned parameters: bit i % 64 of mask[i / 64] set, as src/prune.rs `apply`.
__global__ void dp_apply_mask(float* p, const unsigned long long* mask, long long n) {
    DP_FOR_EACH(i, n) {
        if ((mask[i / 64] >> (i % 64)) & 1ULL) p[i] = 0.0f;
    }
}

// x[i] = value: the vector of ones the bias gradients' GEMM multiplies by.
__global__ void dp_fill(float* x, long long n, float value) {
    DP_FOR_EACH(i, n) { x[i] = value; }
}

}  // extern "C"
