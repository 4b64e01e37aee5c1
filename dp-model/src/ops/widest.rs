//! Loops compiled for the widest vectors the CPU has. The crate builds for baseline x86-64,
//! so its plain element loops vectorize four lanes wide (SSE2); run through [`widest`] they
//! are compiled again inside a function with AVX-512F (or AVX2) enabled and run there when
//! the CPU has it. The arithmetic is the same, lane for lane (LLVM neither reassociates nor
//! fuses into FMAs without being told), so every build gives the same bits.

/// `body()`, compiled for and run on AVX-512 (F and DQ) or AVX2 where the CPU has them. `body` must be
/// inlined into the wrappers to be compiled for them: mark it `#[inline(always)]`.
#[inline(always)]
pub(crate) fn widest<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        // With DQ for 64-bit multiplies (dropout's hash), which every AVX-512 CPU since
        // Skylake-SP has.
        #[target_feature(enable = "avx512f,avx512dq")]
        fn avx512<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        #[target_feature(enable = "avx2")]
        fn avx2<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
        {
            // SAFETY: the CPU has AVX-512F and DQ.
            return unsafe { avx512(body) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { avx2(body) };
        }
    }
    body()
}
