// The image layers' kernels besides their GEMMs, on the CPU's channel-major activations
// `[C, B, H, W]` (src/ops/conv.rs): unfolding and folding a convolution's patches, pooling,
// the layout change into and out of channel-major, and the residual sum. One thread per
// output element; a thread that sums (a folded patch, a pooling window) gathers what it needs
// rather than scattering with atomics, so every result is the same bit for bit on every run.

extern "C" {

// The unfolded input of images [first, first + images) of x [C, B, H, W]: row
// r = (c * k + ki) * k + kj, column j = (b - first) * OH * OW + oy * OW + ox, holding
// x[c, b, oy * s + ki - p, ox * s + kj - p], or 0 where that reads padding. In f32, and in
// bf16 for the tensor cores' GEMM. `dp_patch_value` is element i of it.
__device__ float dp_patch_value(const float* x, long long i, long long batch, long long height,
                                long long width, int kernel, int stride, int padding,
                                long long out_h, long long out_w, long long first,
                                long long images) {
    long long plane = out_h * out_w, n = images * plane;
    long long r = i / n, j = i % n;
    long long c = r / (kernel * kernel), ki = r / kernel % kernel, kj = r % kernel;
    long long b = first + j / plane, oy = j % plane / out_w, ox = j % out_w;
    long long iy = oy * stride + ki - padding, ix = ox * stride + kj - padding;
    bool inside = iy >= 0 && iy < height && ix >= 0 && ix < width;
    return inside ? x[((c * batch + b) * height + iy) * width + ix] : 0.0f;
}

__global__ void dp_im2col(const float* x, float* cols, long long channels, long long batch,
                          long long height, long long width, int kernel, int stride,
                          int padding, long long out_h, long long out_w, long long first,
                          long long images) {
    DP_FOR_EACH(i, channels * kernel * kernel * images * out_h * out_w) {
        cols[i] = dp_patch_value(x, i, batch, height, width, kernel, stride, padding, out_h,
                                 out_w, first, images);
    }
}

__global__ void dp_im2col_bf16(const float* x, unsigned short* cols, long long channels,
                               long long batch, long long height, long long width, int kernel,
                               int stride, int padding, long long out_h, long long out_w,
                               long long first, long long images) {
    DP_FOR_EACH(i, channels * kernel * kernel * images * out_h * out_w) {
        cols[i] = dp_bf16(dp_patch_value(x, i, batch, height, width, kernel, stride, padding,
                                         out_h, out_w, first, images));
    }
}

// The inverse of dp_im2col: each input element of images [first, first + images) of
// dx [C, B, H, W] sums the unfolded gradients of every patch that read it, written over dx,
// or added to it with `add`.
__global__ void dp_col2im(const float* cols, float* dx, long long channels, long long batch,
                          long long height, long long width, int kernel, int stride,
                          int padding, long long out_h, long long out_w, long long first,
                          long long images, int add) {
    long long plane_in = height * width, n = images * out_h * out_w;
    DP_FOR_EACH(i, channels * images * plane_in) {
        long long c = i / (images * plane_in), rest = i % (images * plane_in);
        long long image = rest / plane_in, iy = rest % plane_in / width, ix = rest % width;
        float sum = 0.0f;
        for (long long ki = 0; ki < kernel; ++ki) {
            long long ty = iy + padding - ki;
            if (ty < 0 || ty % stride != 0 || ty / stride >= out_h) continue;
            for (long long kj = 0; kj < kernel; ++kj) {
                long long tx = ix + padding - kj;
                if (tx < 0 || tx % stride != 0 || tx / stride >= out_w) continue;
                long long row = (c * kernel + ki) * kernel + kj;
                long long column = (image * out_h + ty / stride) * out_w + tx / stride;
                sum += cols[row * n + column];
            }
        }
        long long at = (c * batch + first + image) * plane_in + rest % plane_in;
        dx[at] = add ? dx[at] + sum : sum;
    }
}

// y[c * run + j] += bias[c]: a convolution's bias over its [OC, B * OH * OW] output.
__global__ void dp_add_channel_bias(float* y, const float* bias, long long channels,
                                    long long run) {
    DP_FOR_EACH(i, channels * run) { y[i] += bias[i / run]; }
}

// The first largest input of output (oy, ox)'s window in one plane, as src/ops/pool.rs
// `argmax` (padding is never a window's largest: a window always covers some of the image).
__device__ long long dp_window_argmax(const float* plane, long long height, long long width,
                                      int kernel, int stride, int padding, long long oy,
                                      long long ox) {
    long long y0 = oy * stride - padding, x0 = ox * stride - padding;
    long long y1 = y0 + kernel < height ? y0 + kernel : height;
    long long x1 = x0 + kernel < width ? x0 + kernel : width;
    if (y0 < 0) y0 = 0;
    if (x0 < 0) x0 = 0;
    long long best = y0 * width + x0;
    for (long long y = y0; y < y1; ++y) {
        for (long long x = x0; x < x1; ++x) {
            if (plane[y * width + x] > plane[best]) best = y * width + x;
        }
    }
    return best;
}

// Max pooling of `planes` planes (C * B) of [H, W] into [OH, OW].
__global__ void dp_max_pool(const float* x, float* y, long long planes, long long height,
                            long long width, int kernel, int stride, int padding,
                            long long out_h, long long out_w) {
    DP_FOR_EACH(i, planes * out_h * out_w) {
        long long p = i / (out_h * out_w), oy = i % (out_h * out_w) / out_w, ox = i % out_w;
        const float* plane = x + p * height * width;
        y[i] = plane[dp_window_argmax(plane, height, width, kernel, stride, padding, oy, ox)];
    }
}

// Each input's gradient: the sum of the output gradients of the windows it won (found again,
// not stored), written over dx.
__global__ void dp_max_pool_backward(const float* x, const float* dy, float* dx,
                                     long long planes, long long height, long long width,
                                     int kernel, int stride, int padding, long long out_h,
                                     long long out_w) {
    DP_FOR_EACH(i, planes * height * width) {
        long long p = i / (height * width), at = i % (height * width);
        long long iy = at / width, ix = at % width;
        const float* plane = x + p * height * width;
        // The windows that cover (iy, ix): oy * s - p <= iy < oy * s - p + k.
        long long lo_y = iy + padding - kernel + 1, lo_x = ix + padding - kernel + 1;
        lo_y = lo_y > 0 ? (lo_y + stride - 1) / stride : 0;
        lo_x = lo_x > 0 ? (lo_x + stride - 1) / stride : 0;
        long long hi_y = (iy + padding) / stride, hi_x = (ix + padding) / stride;
        float sum = 0.0f;
        for (long long oy = lo_y; oy <= hi_y && oy < out_h; ++oy) {
            for (long long ox = lo_x; ox <= hi_x && ox < out_w; ++ox) {
                long long best =
                    dp_window_argmax(plane, height, width, kernel, stride, padding, oy, ox);
                if (best == at) sum += dy[(p * out_h + oy) * out_w + ox];
            }
        }
        dx[i] = sum;
    }
}

// Global average pooling of x [C, B, plane] into y [B, C].
__global__ void dp_avg_pool(const float* x, float* y, long long channels, long long batch,
                            long long plane) {
    DP_FOR_EACH(i, batch * channels) {
        long long b = i / channels, c = i % channels;
        const float* values = x + (c * batch + b) * plane;
        float sum = 0.0f;
        for (long long q = 0; q < plane; ++q) sum += values[q];
        y[i] = sum * (1.0f / (float)plane);
    }
}

__global__ void dp_avg_pool_backward(const float* dy, float* dx, long long channels,
                                     long long batch, long long plane) {
    DP_FOR_EACH(i, channels * batch * plane) {
        long long c = i / (batch * plane), b = i % (batch * plane) / plane;
        dx[i] = dy[b * channels + c] * (1.0f / (float)plane);
    }
}

// dst [inner, outer, plane] = src [outer, inner, plane]: images between [B, C, HW] and the
// channel-major [C, B, HW], as src/ops/transpose.rs.
__global__ void dp_swap_axes(const float* src, float* dst, long long outer, long long inner,
                             long long plane) {
    DP_FOR_EACH(i, inner * outer * plane) {
        long long in = i / (outer * plane), o = i % (outer * plane) / plane, q = i % plane;
        dst[i] = src[(o * inner + in) * plane + q];
    }
}

// y = a + b: a residual block's sum.
__global__ void dp_add(const float* a, const float* b, float* y, long long n) {
    DP_FOR_EACH(i, n) { y[i] = a[i] + b[i]; }
}

// dst = src, or dst += src with `add`: a gradient handed to a second consumer's.
__global__ void dp_copy_add(const float* src, float* dst, long long n, int add) {
    DP_FOR_EACH(i, n) { dst[i] = add ? dst[i] + src[i] : src[i]; }
}

}  // extern "C"
