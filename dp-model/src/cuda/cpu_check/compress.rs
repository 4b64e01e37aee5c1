//! Gradient compression: each rank's payload and residual against dp-comm's encoding (the
//! wire format), and the sum of the gathered payloads against its accumulation, bit for bit,
//! with NaN and infinities among the values.

use dp_comm::Compression;
use rand_xoshiro::Xoshiro256PlusPlus;

use super::{Grid, Kernels, SIZES, random};

/// The kernels [`check`] covers.
pub(super) const KERNELS: &[&str] = &[
    "dp_compress_bf16",
    "dp_compress_absmax",
    "dp_compress_scale",
    "dp_compress_int8",
    "dp_decompress_sum",
];

/// Ranks whose payloads are summed.
const RANKS: usize = 3;

/// Threads taking the int8 scale's partial maxima.
const PARTS: usize = 5;

type Bf16 = unsafe extern "C" fn(*const f32, *mut f32, *mut u16, i64);
type Absmax = unsafe extern "C" fn(*const f32, *const f32, i64, *mut f32, i64);
type Scale = unsafe extern "C" fn(*const f32, i64, *mut u8);
type Int8 = unsafe extern "C" fn(*const f32, *mut f32, *mut u8, i64);
type Sum = unsafe extern "C" fn(*const u8, i64, i64, i32, *mut f32, i64);

/// Both formats over every size, the odd values in every rank's but the first.
pub(super) fn check(k: &Kernels, grid: Grid, rng: &mut Xoshiro256PlusPlus) {
    for kind in
        [Compression::Bf16 { error_feedback: true }, Compression::Int8 { error_feedback: true }]
    {
        for n in SIZES {
            let mut gathered = Vec::new();
            for rank in 0..RANKS {
                let mut values = random(n, rng);
                if rank > 0 {
                    let odd = [f32::NAN, f32::INFINITY, -0.0, 1e-30, -f32::INFINITY];
                    for (v, odd) in values.iter_mut().step_by(7).zip(odd) {
                        *v = odd;
                    }
                }
                let residual: Vec<f32> = random(n, rng).iter().map(|r| r * 0.01).collect();
                gathered.extend(encode(k, grid, kind, &values, &residual));
            }
            let mut want = vec![0f32; n];
            let stride = kind.payload_bytes(n);
            for part in gathered.chunks_exact(stride.max(1)).take(RANKS) {
                kind.accumulate(part, &mut want);
            }
            let sum = k.get::<Sum>("dp_decompress_sum");
            let mut got = vec![f32::NAN; n];
            let int8 = i32::from(matches!(kind, Compression::Int8 { .. }));
            k.launch(grid, || {
                // SAFETY: `gathered` holds `RANKS` payloads of `stride` bytes, `got` `n` values.
                unsafe {
                    sum(
                        gathered.as_ptr(),
                        RANKS as i64,
                        stride as i64,
                        int8,
                        got.as_mut_ptr(),
                        n as i64,
                    )
                }
            });
            same_bits(&got, &want, &format!("{kind:?}: the sum of {RANKS} payloads of {n}"));
        }
    }
}

/// One rank's payload of `values` with `residual` through the kernels, checked against
/// dp-comm's encoding (payload and new residual).
fn encode(k: &Kernels, grid: Grid, kind: Compression, values: &[f32], residual: &[f32]) -> Vec<u8> {
    let n = values.len();
    let (mut want, mut want_residual) = (vec![0u8; kind.payload_bytes(n)], residual.to_vec());
    kind.encode(values, Some(&mut want_residual), &mut want);
    let (mut payload, mut kept) = (vec![0xAAu8; want.len()], residual.to_vec());
    match kind {
        Compression::Bf16 { .. } => {
            let bf16 = k.get::<Bf16>("dp_compress_bf16");
            let mut halves = vec![0u16; n];
            k.launch(grid, || {
                // SAFETY: every buffer holds `n` values.
                unsafe { bf16(values.as_ptr(), kept.as_mut_ptr(), halves.as_mut_ptr(), n as i64) }
            });
            payload = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        }
        _ => {
            let (absmax, scale, int8) = (
                k.get::<Absmax>("dp_compress_absmax"),
                k.get::<Scale>("dp_compress_scale"),
                k.get::<Int8>("dp_compress_int8"),
            );
            let mut partials = vec![f32::NAN; PARTS];
            k.launch(grid, || {
                // SAFETY: `values` and `kept` hold `n` values, `partials` `PARTS`.
                unsafe {
                    absmax(
                        values.as_ptr(),
                        kept.as_ptr(),
                        n as i64,
                        partials.as_mut_ptr(),
                        PARTS as i64,
                    )
                }
            });
            k.launch(grid, || {
                // SAFETY: `payload` holds at least four bytes.
                unsafe { scale(partials.as_ptr(), PARTS as i64, payload.as_mut_ptr()) }
            });
            k.launch(grid, || {
                // SAFETY: `payload` holds 4 + `n` bytes, the others `n` values.
                unsafe { int8(values.as_ptr(), kept.as_mut_ptr(), payload.as_mut_ptr(), n as i64) }
            });
        }
    }
    let what = format!("{kind:?} of {n} values");
    assert_eq!(payload, want, "{what}: payload");
    same_bits(&kept, &want_residual, &format!("{what}: residual"));
    payload
}

/// Whether `got` is `want` bit for bit (any NaN for a NaN).
fn same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(same, "{what}: element {i} is {g:e}, dp-comm's {w:e}");
    }
}
