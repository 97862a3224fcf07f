//! Typed function pointers in atomics ([`FnSlot`]): the one place where `*mut c_void`
//! becomes a function pointer. Call sites get `Option<F>` and never cast by hand.
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

/// An atomic slot holding a function pointer of type `F` (an `unsafe extern "C" fn`), or null.
/// `repr(C)`: the pointer is the first word, which [`crate::exports::dl`]'s assembly reads.
#[repr(C)]
pub struct FnSlot<F> {
    ptr: AtomicPtr<c_void>,
    _f: PhantomData<F>,
}

impl<F: Copy> FnSlot<F> {
    const SIZE_OK: () = assert!(size_of::<F>() == size_of::<*mut c_void>());

    pub const fn empty() -> FnSlot<F> {
        FnSlot {
            ptr: AtomicPtr::new(null_mut()),
            _f: PhantomData,
        }
    }

    /// The pointer as an address, for comparisons and sentinels.
    #[inline(always)]
    pub fn raw(&self, order: Ordering) -> *mut c_void {
        self.ptr.load(order)
    }

    #[inline(always)]
    pub fn set_raw(&self, p: *mut c_void, order: Ordering) {
        self.ptr.store(p, order)
    }

    /// The function, None while null.
    #[inline(always)]
    pub fn get(&self, order: Ordering) -> Option<F> {
        // SAFETY: see `as_fn`; only addresses of `F`s (or null) are ever stored.
        unsafe { as_fn(self.ptr.load(order)) }
    }

    pub fn set(&self, f: Option<F>, order: Ordering) {
        self.set_raw(f.map_or(null_mut(), |f| address(f)), order)
    }
}

/// `f`'s address.
pub fn address<F: Copy>(f: F) -> *mut c_void {
    let () = FnSlot::<F>::SIZE_OK;
    // SAFETY: F is a function pointer type of pointer size (checked above).
    unsafe { std::mem::transmute_copy::<F, *mut c_void>(&f) }
}

/// The function at address `p`, None for null.
///
/// # Safety
/// `p` must be null or the address of a function of type `F`.
#[inline(always)]
pub unsafe fn as_fn<F: Copy>(p: *mut c_void) -> Option<F> {
    let () = FnSlot::<F>::SIZE_OK;
    (!p.is_null()).then(|| std::mem::transmute_copy::<*mut c_void, F>(&p))
}
