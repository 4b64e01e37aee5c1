// Batch normalization as src/ops/batch_norm.rs, over channel c's values at c * cs + i * es
// (i < count): channel-major images [C, B * HW] have cs = count, es = 1; flat features
// [B, F] have cs = 1, es = F.
//
// A channel's sums are taken in two passes so that every kernel runs one thread at a time
// (the CPU check runs them so) and every sum comes out the same on every run: `parts` threads
// per channel each sum every `parts`-th value in f32 (neighbouring threads read neighbouring
// values), about the shift the CPU uses (the channel's first value for the moments, its mean
// for the gradient), then one thread per channel adds those partial sums in f64. Statistics
// reduced across replicas (`--sync-bn`) are the f64 `sums`, between the two halves.

extern "C" {

// Per channel and part, [sum d, sum d^2] of d = x - x[first] (forward), or with dy
// [sum dy, sum dy * (x - mean)] (backward).
__global__ void dp_bn_partials(const float* x, const float* dy, const float* mean,
                               float* partials, long long channels, long long count,
                               long long cs, long long es, long long parts) {
    DP_FOR_EACH(t, channels * parts) {
        long long c = t / parts, part = t % parts;
        float shift = dy ? mean[c] : x[c * cs];
        float a = 0.0f, b = 0.0f;
        for (long long i = part; i < count; i += parts) {
            long long at = c * cs + i * es;
            float d = x[at] - shift;
            if (dy) {
                a += dy[at];
                b += dy[at] * d;
            } else {
                a += d;
                b += d * d;
            }
        }
        partials[2 * t] = a;
        partials[2 * t + 1] = b;
    }
}

// Sums a channel's `parts` pairs of partial sums in f64.
__device__ void dp_bn_total(const float* partials, long long c, long long parts, double* first,
                            double* second) {
    double a = 0.0, b = 0.0;
    for (long long p = 0; p < parts; ++p) {
        a += (double)partials[2 * (c * parts + p)];
        b += (double)partials[2 * (c * parts + p) + 1];
    }
    *first = a;
    *second = b;
}

// sums = [sum x per channel, sum x^2 per channel, count] from the forward partial sums.
__global__ void dp_bn_moments(const float* partials, const float* x, double* sums,
                              long long channels, long long parts, long long cs,
                              double count) {
    DP_FOR_EACH(c, channels) {
        double first, second;
        dp_bn_total(partials, c, parts, &first, &second);
        double k = (double)x[c * cs];
        sums[c] = first + count * k;
        sums[channels + c] = second + k * (2.0 * first + count * k);
        if (c == 0) sums[2 * channels] = count;
    }
}

// The batch's mean and 1 / sqrt(var + eps) from the (reduced) sums, saved for backward, and
// the running statistics moved towards them (the variance unbiased), as `record`.
__global__ void dp_bn_record(const double* sums, float* mean, float* inv_std,
                             float* running_mean, float* running_var, long long channels,
                             double momentum, double eps) {
    DP_FOR_EACH(c, channels) {
        double count = sums[2 * channels];
        double unbiased = count > 1.0 ? count / (count - 1.0) : 1.0;
        double m = sums[c] / count;
        double var = sums[channels + c] / count - m * m;
        if (var < 0.0) var = 0.0;
        mean[c] = (float)m;
        inv_std[c] = (float)(1.0 / sqrt(var + eps));
        running_mean[c] = (float)((1.0 - momentum) * (double)running_mean[c] + momentum * m);
        running_var[c] =
            (float)((1.0 - momentum) * (double)running_var[c] + momentum * var * unbiased);
    }
}

// Evaluation normalizes by the running statistics.
__global__ void dp_bn_running(const float* running_mean, const float* running_var, float* mean,
                              float* inv_std, long long channels, double eps) {
    DP_FOR_EACH(c, channels) {
        mean[c] = running_mean[c];
        inv_std[c] = (float)(1.0 / sqrt((double)running_var[c] + eps));
    }
}

// Each channel's [scale, shift] (affine[c], affine[C + c]), computed in f64 as `affine`.
__global__ void dp_bn_affine(const float* gamma, const float* beta, const float* mean,
                             const float* inv_std, float* affine, long long channels) {
    DP_FOR_EACH(c, channels) {
        double scale = (double)gamma[c] * (double)inv_std[c];
        affine[c] = (float)scale;
        affine[channels + c] = (float)((double)beta[c] - (double)mean[c] * scale);
    }
}

// y = x * scale + shift over `channels * count` values.
__global__ void dp_bn_apply(const float* x, float* y, const float* affine, long long channels,
                            long long count, long long cs) {
    DP_FOR_EACH(i, channels * count) {
        long long c = i / cs % channels;
        y[i] = x[i] * affine[c] + affine[channels + c];
    }
}

// From the backward partial sums: the parameter gradients (written, or added with
// `accumulate`) and sums = [sum dy, sum dy * xhat, count] for the input gradient.
__global__ void dp_bn_grad_sums(const float* partials, const float* inv_std, float* dgamma,
                                float* dbeta, double* sums, long long channels, long long parts,
                                double count, int accumulate) {
    DP_FOR_EACH(c, channels) {
        double sum_dy, sum_dy_xm;
        dp_bn_total(partials, c, parts, &sum_dy, &sum_dy_xm);
        double sum_dy_xhat = sum_dy_xm * (double)inv_std[c];
        dgamma[c] = accumulate ? dgamma[c] + (float)sum_dy_xhat : (float)sum_dy_xhat;
        dbeta[c] = accumulate ? dbeta[c] + (float)sum_dy : (float)sum_dy;
        sums[c] = sum_dy;
        sums[channels + c] = sum_dy_xhat;
        if (c == 0) sums[2 * channels] = count;
    }
}

// Each channel's input-gradient constants [k, mean_dy, b] (consts[c], [C + c], [2C + c]) from
// the (reduced) sums, as `grad_consts`.
__global__ void dp_bn_grad_consts(const double* sums, const float* gamma, const float* inv_std,
                                  float* consts, long long channels) {
    DP_FOR_EACH(c, channels) {
        double count = sums[2 * channels];
        consts[c] = gamma[c] * inv_std[c];
        consts[channels + c] = (float)(sums[c] / count);
        consts[2 * channels + c] = (float)((double)inv_std[c] * (sums[channels + c] / count));
    }
}

// dx = k * ((dy - mean_dy) - (x - mean) * b), written over dx or added with `add`.
__global__ void dp_bn_input_grad(const float* x, const float* dy, float* dx, const float* mean,
                                 const float* consts, long long channels, long long count,
                                 long long cs, int add) {
    DP_FOR_EACH(i, channels * count) {
        long long c = i / cs % channels;
        float k = consts[c], mean_dy = consts[channels + c], b = consts[2 * channels + c];
        float v = k * ((dy[i] - mean_dy) - (x[i] - mean[c]) * b);
        dx[i] = add ? dx[i] + v : v;
    }
}

}  // extern "C"
