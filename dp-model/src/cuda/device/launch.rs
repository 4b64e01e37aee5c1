//! How the step launches a kernel: its arguments' addresses, as `cuLaunchKernel` takes them,
//! handed to the [`Device`](super::Device).

/// Launches kernel `$kernel` of model `$m` over `$n` elements with the arguments, which must
/// be local variables of the kernel's parameter types (a launch reads them through their
/// addresses while it is queued).
macro_rules! launch {
    ($m:ident, $kernel:literal, $n:expr; $($arg:ident),+ $(,)?) => {{
        let mut params = [$((&raw const $arg).cast_mut().cast::<std::ffi::c_void>()),+];
        // SAFETY: the arguments match the kernel's parameters in the CUDA source one for one,
        // and every address among them is a live device buffer of the sizes the kernel reads
        // and writes.
        unsafe { $m.device.launch($kernel, $n, &mut params) }?;
    }};
}
