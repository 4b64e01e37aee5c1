// Layer normalization over each row's `features` values, as src/ops/layer_norm.rs: the mean
// taken in two passes (`hi`, the first pass's mean rounded to f32, then `lo`, the mean of the
// deviations from it), the variance from the deviations, values centred as (x - hi) - lo.
// Each row's statistics (and in backward its two gradient sums) by one thread per row into a
// small buffer, [hi, lo, inv_std] per row; the elementwise work by one thread per value; the
// parameters' gradients, sums over the rows, by one thread per feature. Every sum gathers in
// a fixed order: no atomics.

extern "C" {

// stats[3r..3r+3] = hi, lo and 1 / sqrt(var + eps) of row r, as `Stats::of`.
__global__ void dp_layer_norm_stats(const float* x, float* stats, long long rows, long long f,
                                    double eps) {
    DP_FOR_EACH(r, rows) {
        const float* xr = x + r * f;
        double sum = 0.0;
        for (long long c = 0; c < f; ++c) sum += (double)xr[c];
        float hi = (float)(sum / (double)f);
        double a = 0.0, b = 0.0;
        for (long long c = 0; c < f; ++c) {
            float d = xr[c] - hi;
            a += (double)d;
            b += (double)(d * d);
        }
        double lo = a / (double)f;
        double var = b / (double)f - lo * lo;
        if (var < 0.0) var = 0.0;
        stats[3 * r] = hi;
        stats[3 * r + 1] = (float)lo;
        stats[3 * r + 2] = (float)(1.0 / sqrt(var + eps));
    }
}

// x's value centred and scaled by its row's statistics.
__device__ float dp_ln_xhat(const float* x, const float* stats, long long i, long long f) {
    const float* s = stats + 3 * (i / f);
    return ((x[i] - s[0]) - s[1]) * s[2];
}

// y = xhat * gamma + beta.
__global__ void dp_layer_norm_apply(const float* x, float* y, const float* gamma,
                                    const float* beta, const float* stats, long long rows,
                                    long long f) {
    DP_FOR_EACH(i, rows * f) { y[i] = dp_ln_xhat(x, stats, i, f) * gamma[i % f] + beta[i % f]; }
}

// Per row, with g = dy gamma: sums[2r] = shift = inv_std mean(g) and
// sums[2r + 1] = slope = inv_std^2 mean(g xhat).
__global__ void dp_layer_norm_row_sums(const float* x, const float* dy, const float* gamma,
                                       const float* stats, float* sums, long long rows,
                                       long long f) {
    DP_FOR_EACH(r, rows) {
        double a = 0.0, b = 0.0;
        for (long long c = 0; c < f; ++c) {
            float g = dy[r * f + c] * gamma[c];
            a += (double)g;
            b += (double)(g * dp_ln_xhat(x, stats, r * f + c, f));
        }
        double inv_std = (double)stats[3 * r + 2];
        sums[2 * r] = (float)(inv_std * (a / (double)f));
        sums[2 * r + 1] = (float)(inv_std * inv_std * (b / (double)f));
    }
}

// dx = inv_std dy gamma - shift - (x - mean) slope, written over dx.
__global__ void dp_layer_norm_input_grad(const float* x, const float* dy, const float* gamma,
                                         const float* stats, const float* sums, float* dx,
                                         long long rows, long long f) {
    DP_FOR_EACH(i, rows * f) {
        long long r = i / f;
        const float* s = stats + 3 * r;
        float centred = (x[i] - s[0]) - s[1];
        dx[i] = s[2] * dy[i] * gamma[i % f] - sums[2 * r] - centred * sums[2 * r + 1];
    }
}

// dgamma[c] = sum over rows of dy xhat, dbeta[c] = sum of dy: written, or added with
// `accumulate`.
__global__ void dp_layer_norm_param_grad(const float* x, const float* dy, const float* stats,
                                         float* dgamma, float* dbeta, long long rows,
                                         long long f, int accumulate) {
    DP_FOR_EACH(c, f) {
        double dg = 0.0, db = 0.0;
        for (long long r = 0; r < rows; ++r) {
            float v = dy[r * f + c];
            dg += (double)(v * dp_ln_xhat(x, stats, r * f + c, f));
            db += (double)v;
        }
        dgamma[c] = accumulate ? dgamma[c] + (float)dg : (float)dg;
        dbeta[c] = accumulate ? dbeta[c] + (float)db : (float)db;
    }
}

}  // extern "C"
