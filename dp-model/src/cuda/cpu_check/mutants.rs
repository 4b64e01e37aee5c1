//! Deliberate bugs ("mutants"): a check that passes proves little until it is seen to fail.
//! Every kernel gets at least one realistic bug (an off-by-one bound, a wrong stride, a
//! dropped term, swapped arguments, a missing accumulate, a comparison that breaks ties the
//! other way), each made by replacing one exact piece of the source; the mutated source is
//! compiled and the kernel's family check must fail on it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::SeedableRng;

use super::suite::{FAMILIES, family};
use super::{Grid, Kernels, Unbuilt, build};
use crate::cuda::{CUDA_KERNEL_SOURCE, CUDA_KERNELS};

/// `(kernel, piece of the source, its replacement)`. Each piece occurs exactly once in
/// `CUDA_KERNEL_SOURCE` (the test asserts it). A bug in a helper two kernels share is listed
/// under the kernel whose check it must trip.
const MUTANTS: &[(&str, &str, &str)] = &[
    (
        "dp_activation_forward",
        "DP_FOR_EACH(i, n) { y[i] = dp_activate(x[i], kind); }",
        "DP_FOR_EACH(i, n - 1) { y[i] = dp_activate(x[i], kind); }",
    ),
    ("dp_bias_activation", "float v = y[i] + bias[i % cols];", "float v = y[i] + bias[i / rows];"),
    (
        "dp_activation_backward",
        "dx[i] = dy[i] * (1.0f - y[i] * y[i]);",
        "dx[i] = dy[i] * (1.0f - y[i]);",
    ),
    ("dp_dropout", "dp_mix(key ^ (unsigned long long)i)", "dp_mix(key + (unsigned long long)i)"),
    (
        "dp_add_bias",
        "DP_FOR_EACH(i, rows * cols) { y[i] += bias[i % cols]; }",
        "DP_FOR_EACH(i, rows * cols) { y[i] += bias[i / rows]; }",
    ),
    (
        "dp_softmax_cross_entropy",
        "float mean = smoothing > 0.0f ? total * spread : 0.0f;",
        "float mean = smoothing > 0.0f ? total / (float)cols : 0.0f;",
    ),
    (
        "dp_softmax_cross_entropy",
        "grad[r * cols + label] -= keep * inv_denominator;",
        "grad[r * cols + label] -= inv_denominator;",
    ),
    ("dp_squared_error", "row_loss[r] = sum / (float)cols;", "row_loss[r] = sum / (float)rows;"),
    (
        "dp_sgd_step",
        "(dp_decays(decayed, ranges, i) ? wd : 0.0f)",
        "(dp_decays(decayed, ranges, i + 1) ? wd : 0.0f)",
    ),
    (
        "dp_sgd_step",
        "return lo < count && ranges[2 * lo] <= i;",
        "return lo < count && ranges[2 * lo] < i;",
    ),
    (
        "dp_adam_step",
        "bool decays = dp_decays(decayed, ranges, i);",
        "bool decays = dp_decays(decayed, ranges - 1, i);",
    ),
    (
        "dp_square_partials",
        "for (long long i = t; i < n; i += parts) sum +=",
        "for (long long i = t; i < n - 1; i += parts) sum +=",
    ),
    (
        "dp_norm",
        "for (long long p = 0; p < parts; ++p) sum += partials[p];",
        "for (long long p = 0; p < parts - 1; ++p) sum += partials[p];",
    ),
    ("dp_clip", "if (isfinite(total) && total > max_norm)", "if (total > max_norm)"),
    ("dp_fill", "DP_FOR_EACH(i, n) { x[i] = value; }", "DP_FOR_EACH(i, n - 1) { x[i] = value; }"),
    ("dp_to_bf16", "(bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16", "(bits + 0x8000u) >> 16"),
    (
        "dp_to_bf16",
        "return (unsigned short)((bits >> 16) | 0x40);",
        "return (unsigned short)(bits >> 16);",
    ),
    (
        "dp_apply_mask",
        "if ((mask[i / 64] >> (i % 64)) & 1ULL)",
        "if ((mask[i / 64] >> (i % 63)) & 1ULL)",
    ),
    ("dp_adam8_maxima", "m_max = fmaxf(m_max, fabsf(m));", "m_max = fmaxf(m_max, m);"),
    (
        "dp_adam8_maxima",
        "dp_old_scales(v_work)[block] = v_scale;",
        "dp_old_scales(v_work)[block] = m_scale;",
    ),
    (
        "dp_adam8_step",
        "p[i] = p[i] * (decay ? shrink : 1.0f) - step_size * m / (sqrtf(v) / sqrt_c2 + eps);",
        "p[i] = p[i] - step_size * m / (sqrtf(v) / sqrt_c2 + eps);",
    ),
    (
        "dp_adam8_step",
        "v_codes[i] = dp_encode(v_work, v * v_inverse);",
        "v_codes[i] = dp_encode(m_work, v * v_inverse);",
    ),
    (
        "dp_adam8_step",
        "float base = signbit(y) ? down[grid] : up[grid];",
        "float base = signbit(y) ? up[grid] : down[grid];",
    ),
    ("dp_adam8_step", "return book[code] * scale;", "return book[code];"),
    (
        "dp_adam8_step",
        "for (int lane = 0; lane < DP_STATE_LANES; ++lane)",
        "for (int lane = 0; lane < DP_STATE_LANES - 1; ++lane)",
    ),
    (
        "dp_sgd8_maxima",
        "if (t % DP_STATE_LANES == 0) dp_old_scales(work)[block] = scale;",
        "if (t % DP_STATE_LANES == 0 && block > 0) dp_old_scales(work)[block] = scale;",
    ),
    (
        "dp_sgd8_maxima",
        "i < i##_end; i += DP_STATE_LANES)",
        "i < i##_end; i += DP_STATE_LANES + 1)",
    ),
    (
        "dp_sgd8_step",
        "p[i] -= lr * (nesterov ? g + mu * v : v);",
        "p[i] -= lr * (nesterov ? g + v : v);",
    ),
    ("dp_sgd8_step", "float old = dp_old_scales(work)[block];", "float old = scales[block];"),
    (
        "dp_compress_bf16",
        "residual[i] = v - __uint_as_float((unsigned int)h << 16);",
        "residual[i] = g[i] - __uint_as_float((unsigned int)h << 16);",
    ),
    ("dp_compress_absmax", "if (isfinite(a)) most = fmaxf(most, a);", "most = fmaxf(most, a);"),
    (
        "dp_compress_scale",
        "unsigned int bits = __float_as_uint(most / 127.0f);",
        "unsigned int bits = __float_as_uint(most / 128.0f);",
    ),
    (
        "dp_compress_int8",
        "float q = r != r ? 0.0f : fminf(fmaxf(r, -127.0f), 127.0f);",
        "float q = fminf(fmaxf(r, -127.0f), 127.0f);",
    ),
    ("dp_compress_int8", "float r = roundf(v * inverse);", "float r = truncf(v * inverse);"),
    (
        "dp_decompress_sum",
        "const unsigned char* part = gathered + r * stride;",
        "const unsigned char* part = gathered + r * n;",
    ),
    (
        "dp_decompress_sum",
        "for (int b = 0; b < 4; ++b) bits |= (unsigned int)payload[b] << (8 * b);",
        "for (int b = 0; b < 4; ++b) bits |= (unsigned int)payload[b] << (8 * (3 - b));",
    ),
    (
        "dp_attention_decode",
        "const float* vj = v + j * d + h * hd;",
        "const float* vj = v + j * hd + h * hd;",
    ),
    (
        "dp_attention_decode",
        "y[h * hd + c] = l > 0.0f ? acc[c] / l : 0.0f;",
        "y[h * hd + c] = acc[c] / l;",
    ),
    ("dp_from_bf16", "(unsigned int)x[i] << 16", "(unsigned int)x[i] << 15"),
    (
        "dp_im2col",
        "cols[i] = dp_patch_value(x, i, batch, height, width,",
        "cols[i] = dp_patch_value(x, i, batch, width, height,",
    ),
    ("dp_im2col", "ix = ox * stride + kj - padding;", "ix = ox * stride + kj;"),
    ("dp_im2col_bf16", "out_h, out_w, first, images))", "out_h, out_w, 0, images))"),
    (
        "dp_col2im",
        "long long at = (c * batch + first + image) * plane_in",
        "long long at = (c * batch + image) * plane_in",
    ),
    ("dp_col2im", "dx[at] = add ? dx[at] + sum : sum;", "dx[at] = sum;"),
    ("dp_add_channel_bias", "y[i] += bias[i / run];", "y[i] += bias[i % channels];"),
    (
        "dp_max_pool",
        "long long x1 = x0 + kernel < width ? x0 + kernel : width;",
        "long long x1 = x0 + kernel - 1 < width ? x0 + kernel - 1 : width;",
    ),
    (
        "dp_max_pool_backward",
        "if (plane[y * width + x] > plane[best])",
        "if (plane[y * width + x] >= plane[best])",
    ),
    (
        "dp_max_pool_backward",
        "long long hi_y = (iy + padding) / stride,",
        "long long hi_y = iy / stride,",
    ),
    (
        "dp_avg_pool",
        "const float* values = x + (c * batch + b) * plane;",
        "const float* values = x + (b * channels + c) * plane;",
    ),
    (
        "dp_avg_pool_backward",
        "dx[i] = dy[b * channels + c] * (1.0f / (float)plane);",
        "dx[i] = dy[c * batch + b] * (1.0f / (float)plane);",
    ),
    (
        "dp_swap_axes",
        "dst[i] = src[(o * inner + in) * plane + q];",
        "dst[i] = src[(in * outer + o) * plane + q];",
    ),
    ("dp_add", "y[i] = a[i] + b[i];", "y[i] = a[i] + a[i];"),
    ("dp_copy_add", "dst[i] = add ? dst[i] + src[i] : src[i];", "dst[i] = src[i];"),
    (
        "dp_bn_partials",
        "float shift = dy ? mean[c] : x[c * cs];",
        "float shift = dy ? mean[c] : x[c];",
    ),
    ("dp_bn_partials", "b += dy[at] * d;", "b += dy[at] * x[at];"),
    (
        "dp_bn_moments",
        "sums[channels + c] = second + k * (2.0 * first + count * k);",
        "sums[channels + c] = second + k * (first + count * k);",
    ),
    (
        "dp_bn_record",
        "double unbiased = count > 1.0 ? count / (count - 1.0) : 1.0;",
        "double unbiased = count > 1.0 ? (count - 1.0) / count : 1.0;",
    ),
    ("dp_bn_running", "mean[c] = running_mean[c];", "mean[c] = running_var[c];"),
    (
        "dp_bn_affine",
        "(float)((double)beta[c] - (double)mean[c] * scale);",
        "(float)((double)beta[c] - (double)mean[c] * (double)gamma[c]);",
    ),
    (
        "dp_bn_apply",
        "y[i] = x[i] * affine[c] + affine[channels + c];",
        "y[i] = x[i] * affine[c] + affine[c];",
    ),
    (
        "dp_bn_grad_sums",
        "dgamma[c] = accumulate ? dgamma[c] + (float)sum_dy_xhat : (float)sum_dy_xhat;",
        "dgamma[c] = (float)sum_dy_xhat;",
    ),
    (
        "dp_bn_grad_consts",
        "consts[channels + c] = (float)(sums[c] / count);",
        "consts[channels + c] = (float)(sums[c] / (count - 1.0));",
    ),
    ("dp_bn_input_grad", "dx[i] = add ? dx[i] + v : v;", "dx[i] = v;"),
    ("dp_layer_norm_stats", "stats[3 * r + 1] = (float)lo;", "stats[3 * r + 1] = 0.0f;"),
    (
        "dp_layer_norm_stats",
        "double var = b / (double)f - lo * lo;",
        "double var = b / (double)(f - 1) - lo * lo;",
    ),
    ("dp_layer_norm_apply", "* gamma[i % f] + beta[i % f]; }", "* beta[i % f] + gamma[i % f]; }"),
    (
        "dp_layer_norm_row_sums",
        "float g = dy[r * f + c] * gamma[c];",
        "float g = dy[c] * gamma[c];",
    ),
    (
        "dp_layer_norm_row_sums",
        "sums[2 * r + 1] = (float)(inv_std * inv_std * (b / (double)f));",
        "sums[2 * r + 1] = (float)(inv_std * (b / (double)f));",
    ),
    (
        "dp_layer_norm_input_grad",
        "dx[i] = s[2] * dy[i] * gamma[i % f] - sums[2 * r]",
        "dx[i] = dy[i] * gamma[i % f] - sums[2 * r]",
    ),
    ("dp_layer_norm_param_grad", "float v = dy[r * f + c];", "float v = dy[c * rows + r];"),
    (
        "dp_layer_norm_param_grad",
        "dbeta[c] = accumulate ? dbeta[c] + (float)db : (float)db;",
        "dbeta[c] = (float)db;",
    ),
    ("dp_embedding", "positions[(r % t) * dim + c]", "positions[(r / t) * dim + c]"),
    (
        "dp_embedding_position_grad",
        "dpositions[i] = accumulate ? dpositions[i] + sum : sum;",
        "dpositions[i] = sum;",
    ),
    (
        "dp_embedding_position_grad",
        "sum += dy[(b * t + p) * dim + c];",
        "sum += dy[(p * batch + b) * dim + c];",
    ),
    (
        "dp_embedding_table_grad",
        "for (long long k = starts[s]; k < starts[s + 1]; ++k)",
        "for (long long k = starts[s] + 1; k < starts[s + 1]; ++k)",
    ),
    ("dp_embedding_table_grad", "sum += dy[order[k] * dim + c];", "sum += dy[k * dim + c];"),
    (
        "dp_embedding_table_grad",
        "dtable[segment_ids[s] * dim + c] += sum;",
        "dtable[segment_ids[s] * dim + c] = sum;",
    ),
    (
        "dp_attention",
        "l = 0.0f;\n        for (long long j = 0; j <= i; ++j)",
        "l = 0.0f;\n        for (long long j = 0; j < i; ++j)",
    ),
    ("dp_attention", "lse[n] = m + logf(l);", "lse[n] = logf(l);"),
    ("dp_attention", "const float* v = k + d;", "const float* v = k - d;"),
    (
        "dp_attention_delta",
        "long long at = (b * t + i) * d + h * hd;",
        "long long at = (b * t + i) * d + h;",
    ),
    (
        "dp_attention_query_grad",
        "j <= i; ++j) {\n            const float* k = qkv + (b * t + j) * row + d + h * hd;\n            float p;",
        "j < i; ++j) {\n            const float* k = qkv + (b * t + j) * row + d + h * hd;\n            float p;",
    ),
    (
        "dp_attention_query_grad",
        "dp_attention_ds(q, k, k + d, dyi, lse[n], delta[n]",
        "dp_attention_ds(q, k + d, k, dyi, lse[n], delta[n]",
    ),
    ("dp_attention_query_grad", "return *p * (dp - delta);", "return *p * dp;"),
    (
        "dp_attention_key_grad",
        "for (long long i = j; i < t; ++i)",
        "for (long long i = j + 1; i < t; ++i)",
    ),
    ("dp_attention_key_grad", "long long m = n - j + i;", "long long m = n;"),
    ("dp_attention_key_grad", "*p = expf(s * scale - lse);", "*p = expf(s - lse);"),
];

/// The grid the mutants run on: several blocks, a block size no size is a multiple of.
const GRID: Grid = (3, 7);

/// Runs `check` on `k`; the panic's message where it fails.
fn run_check(k: &Kernels, check: super::suite::Check) -> Result<(), String> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
    catch_unwind(AssertUnwindSafe(|| check(k, GRID, &mut rng))).map_err(|payload| {
        let text = payload.downcast_ref::<String>().cloned();
        text.or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// What is wrong with mutant `i` (it did not compile, or its check passed), if anything;
/// else the first line of the check's failure.
fn try_mutant(i: usize) -> Result<String, String> {
    let (kernel, from, to) = MUTANTS[i];
    let (name, check) = family(kernel).ok_or(format!("{kernel}: no family checks it"))?;
    let source = CUDA_KERNEL_SOURCE.replacen(from, to, 1);
    let k = match Kernels::build(&source, "-O0") {
        Ok(k) => k,
        Err(Unbuilt::Compile(log)) => {
            return Err(format!("{kernel}: `{to}` does not compile: {log}"));
        }
        Err(Unbuilt::NoCompiler(why)) => return Err(format!("{kernel}: {why}")),
    };
    match run_check(&k, check) {
        Ok(()) => Err(format!("{kernel}: the {name} check passes with `{from}` made `{to}`")),
        Err(message) => Ok(message.lines().next().unwrap_or_default().to_string()),
    }
}

#[test]
fn the_mutant_table_covers_every_kernel_with_pieces_that_occur_once() {
    for &(kernel, from, to) in MUTANTS {
        let found = CUDA_KERNEL_SOURCE.matches(from).count();
        assert_eq!(found, 1, "{kernel}: `{from}` occurs {found} times in the source, not once");
        assert_ne!(from, to, "{kernel}: a mutant that changes nothing");
        assert!(CUDA_KERNELS.contains(&kernel), "{kernel} is not in CUDA_KERNELS");
    }
    for name in CUDA_KERNELS {
        assert!(MUTANTS.iter().any(|m| m.0 == *name), "{name} has no mutant");
    }
}

#[test]
fn every_mutant_fails_its_kernels_check() {
    // The unmutated source passes every family at -O0, so that a failure below is the bug's.
    let Some(k) = build(CUDA_KERNEL_SOURCE, "-O0") else { return };
    for (name, _, check) in FAMILIES {
        if let Err(message) = run_check(&k, check) {
            panic!("the {name} check fails on the unmutated kernels at -O0: {message}");
        }
    }
    drop(k);
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let outcomes = Mutex::new(vec![None; MUTANTS.len()]);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= MUTANTS.len() {
                        break;
                    }
                    let outcome = try_mutant(i);
                    outcomes.lock().expect("no thread panics holding it")[i] = Some(outcome);
                }
            });
        }
    });
    let outcomes = outcomes.into_inner().expect("no thread panicked holding it");
    let mut survivors = Vec::new();
    for (&(kernel, _, to), outcome) in MUTANTS.iter().zip(outcomes) {
        match outcome.expect("every mutant ran") {
            Ok(caught) => eprintln!("{kernel} with `{to}`: caught: {caught}"),
            Err(why) => survivors.push(why),
        }
    }
    eprintln!("{} mutants in {:.1?} on {threads} threads", MUTANTS.len(), start.elapsed());
    assert!(survivors.is_empty(), "mutants the checks miss:\n{}", survivors.join("\n"));
}
