//! The embedded cluster's server keeps the memory it frees (mimalloc's purge delay). The
//! binaries choose mimalloc as their allocator, since the server allocates and frees
//! small JSON values at a high rate from many threads; this crate links mimalloc for the
//! option.

// Linked for the `mi_option_*` symbols below.
use mimalloc as _;

/// `mi_option_purge_delay`'s place in mimalloc 3's `mi_option_t` (its default is 1,000 ms).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

unsafe extern "C" {
    #[cfg(test)]
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// Keeps the memory the process frees for its own later allocations instead of handing
/// it back to the OS a second after (mimalloc's purge). A process that allocates and
/// frees at a steady high rate, as the embedded cluster's server does, otherwise gets
/// back fresh pages the kernel must fault in and zero first, again and again at the same
/// peak. The process holds its peak until it exits.
pub fn keep_freed_memory() {
    // SAFETY: mimalloc's option setter takes any option and value, at any time.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_mimallocs() {
        // SAFETY: reading an option is always allowed.
        let delay = || unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // purge_delay's default in mimalloc 3; an option list that moved would
            // show another option's here.
            assert_eq!(delay(), 1000);
        }
        keep_freed_memory();
        assert_eq!(delay(), -1);
    }
}
