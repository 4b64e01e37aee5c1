//! Whether the process can still get memory it will need later: asked before work that would
//! be lost, or leave files behind, if an allocation failed part way through it.

use std::alloc::Layout;
use std::sync::Mutex;

use crate::backend::BLOCK_ALIGN;
use crate::error::{Error, Result};
use crate::tag::Tag;

/// Callers ask one at a time, so that two asking at once for what only one could have both
/// hear yes.
static ASKING: Mutex<()> = Mutex::new(());

/// Checks that the system allocator can give `bytes` more (for `tag`) now, by taking them
/// and giving them back untouched: pages never written take no physical memory, but count
/// against an address-space limit (`ulimit -v`) and an allocator that refuses to overcommit,
/// which is where a later allocation would fail. Errs as the pools do when the system refuses
/// ([`Error::Backend`]), without allocating to say so.
pub fn check_headroom(bytes: u64, tag: Tag) -> Result<()> {
    let refused = |message: &'static str| Error::Backend {
        backend: "system",
        bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
        message: message.into(),
        tag: Some(tag),
    };
    let Ok(size) = usize::try_from(bytes) else {
        return Err(refused("more than the address space holds"));
    };
    if size == 0 {
        return Ok(());
    }
    let layout = Layout::from_size_align(size, BLOCK_ALIGN)
        .map_err(|_| refused("more than the address space holds"))?;
    let _one = ASKING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // SAFETY: the layout has a non-zero size; the block is freed below with the same layout.
    // Through `black_box`, or the compiler, seeing the block unused, removes the request.
    let ptr = std::hint::black_box(unsafe { std::alloc::alloc(layout) });
    if ptr.is_null() {
        return Err(refused("the system allocator returned null"));
    }
    // SAFETY: `ptr` came from `alloc` with `layout` just above.
    unsafe { std::alloc::dealloc(ptr, layout) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_system_has_is_granted_and_what_no_address_space_holds_is_refused() {
        check_headroom(64 << 20, Tag::Data).unwrap();
        check_headroom(0, Tag::Data).unwrap();
        for absurd in [1 << 60, u64::MAX / 2] {
            let error = check_headroom(absurd, Tag::Data).unwrap_err();
            assert!(matches!(error, Error::Backend { tag: Some(Tag::Data), .. }), "{error}");
        }
    }
}
