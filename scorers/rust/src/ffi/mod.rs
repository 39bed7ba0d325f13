//! The C ABI (docs/specs/c-abi.md; header `include/replaylab.h`): demand hints, routing and
//! the session binder for hosts that are not Rust (C, C++, Go through cgo, Python through
//! ctypes). Built into `libreplaylab_scorer.so` and `.a` (crate-type cdylib + staticlib).
//!
//! Rules, all enforced here:
//! - `*_json` inputs use the Python runtime's argument names; outputs are the JSON lines
//!   the CLI writes (`hint_line`, `Router::decision_json`, the binder's canonical record),
//!   NUL-terminated in the caller's buffer;
//! - return codes: 0 ok, > 0 the buffer size needed (bytes, NUL included) when `cap` is
//!   too small (nothing written; `out` may be NULL to ask), < 0 an error (`RL_ERR_*`)
//!   whose reason `rl_last_error()` gives on the same thread;
//! - no panic crosses the boundary (`guard`: catch_unwind -> RL_ERR_PANIC);
//! - demand and router handles are immutable after load (Send + Sync, shared freely);
//!   a binder is a `Mutex<Binder>`, callable from any number of threads;
//! - load verifies as `Router::load` / `Demand::load` do, then checks the golden vectors
//!   (as the CLI's `route` / `demand` and the Python loaders do by default).

mod handles;

pub use handles::*;

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::util::error::Error;

/// A NULL handle or argument.
pub const RL_ERR_NULL: c_int = -1;
/// Input that is not UTF-8, not JSON, or a field of the wrong type.
pub const RL_ERR_INPUT: c_int = -2;
/// A Rust panic, caught at the boundary (a bug: please report it).
pub const RL_ERR_PANIC: c_int = -3;
/// An answer longer than INT_MAX bytes (its size cannot be returned).
pub const RL_ERR_TOO_LARGE: c_int = -4;
/// The handle cannot answer this call (e.g. route text on a router without a text encoder,
/// an embedding of the wrong dimension).
pub const RL_ERR_UNSUPPORTED: c_int = -5;
/// A binder whose lock was poisoned by an earlier panic; a failed load.
pub const RL_ERR_STATE: c_int = -6;
/// The host's encoder does not reproduce the artifact's golden embeddings.
pub const RL_ERR_DRIFT: c_int = -7;

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_error(message: String) {
    // an interior NUL cannot travel in a C string: shown as U+FFFD
    let c = CString::new(message.replace('\0', "\u{fffd}")).expect("no NUL");
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(c));
}

/// This thread's last error ("<reason>: <message>"), or NULL when the last call on this
/// thread succeeded. Valid until the next rl_* call on the same thread.
#[no_mangle]
pub extern "C" fn rl_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
}

/// A failed call: its code and why.
pub(crate) struct Fail(pub c_int, pub String);

impl Fail {
    pub(crate) fn input(e: impl std::fmt::Display) -> Fail {
        Fail(RL_ERR_INPUT, e.to_string())
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail(RL_ERR_INPUT, e.to_string())
    }
}

/// Run `f` at the boundary: clear this thread's error, catch a panic, map a failure to
/// its code and message.
pub(crate) fn guard<T>(on_error: T, f: impl FnOnce() -> Result<T, Fail>) -> (T, c_int) {
    LAST_ERROR.with(|e| *e.borrow_mut() = None);
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => (v, 0),
        Ok(Err(Fail(code, m))) => {
            set_error(m);
            (on_error, code)
        }
        Err(p) => {
            let what = p.downcast_ref::<&str>().map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
            set_error(format!("panic: {what}"));
            (on_error, RL_ERR_PANIC)
        }
    }
}

/// `guard` for a call that returns a code.
pub(crate) fn code(f: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
    match guard(0, f) {
        (v, 0) => v,
        (_, e) => e,
    }
}

/// A C string argument as &str (NULL or not UTF-8: a failure naming `what`).
///
/// # Safety
/// `p` is NULL or points at a NUL-terminated string that outlives the call.
pub(crate) unsafe fn arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(Fail(RL_ERR_NULL, format!("null_argument: {what} is NULL")));
    }
    CStr::from_ptr(p).to_str().map_err(|_| Fail(RL_ERR_INPUT, format!("bad_input: {what} is not UTF-8")))
}

/// Copy `s` and a NUL into `out[..cap]`: 0; the size needed when it does not fit (or
/// `out` is NULL); RL_ERR_TOO_LARGE past INT_MAX.
///
/// # Safety
/// `out` is NULL or points at `cap` writable bytes.
pub(crate) unsafe fn write_out(s: &str, out: *mut c_char, cap: usize) -> Result<c_int, Fail> {
    let need = s.len() + 1;
    let Ok(need_c) = c_int::try_from(need) else {
        return Err(Fail(RL_ERR_TOO_LARGE, format!("too_large: the answer is {need} bytes")));
    };
    if out.is_null() || cap < need {
        return Ok(need_c);
    }
    std::ptr::copy_nonoverlapping(s.as_ptr(), out.cast::<u8>(), s.len());
    *out.add(s.len()) = 0;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> Option<String> {
        let p = rl_last_error();
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string())
    }

    #[test]
    fn a_panic_stops_at_the_boundary() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {})); // quiet: the panic is expected
        let rc = code(|| panic!("boom"));
        std::panic::set_hook(prev);
        assert_eq!(rc, RL_ERR_PANIC);
        assert_eq!(last().as_deref(), Some("panic: boom"));
        assert_eq!(code(|| Ok(0)), 0);
        assert_eq!(last(), None); // a good call clears the thread's error
    }

    #[test]
    fn errors_are_per_thread() {
        assert_eq!(code(|| Err(Fail(RL_ERR_INPUT, "bad_input: here".into()))), RL_ERR_INPUT);
        let other = std::thread::spawn(|| {
            let before = last();
            code(|| Err(Fail(RL_ERR_NULL, "null_argument: there".into())));
            (before, last())
        }).join().unwrap();
        assert_eq!(other, (None, Some("null_argument: there".to_string())));
        assert_eq!(last().as_deref(), Some("bad_input: here"));
    }

    #[test]
    fn the_buffer_protocol() {
        let mut buf = [0x55u8; 8];
        let p = buf.as_mut_ptr().cast::<c_char>();
        unsafe {
            assert_eq!(write_out("abcdefg", std::ptr::null_mut(), 0).ok(), Some(8)); // size asked
            assert_eq!(write_out("abcdefgh", p, 8).ok(), Some(9)); // one short: nothing written
            assert_eq!(buf, [0x55u8; 8]);
            assert_eq!(write_out("abcdefg", p, 8).ok(), Some(0));
        }
        assert_eq!(&buf, b"abcdefg\0");
        let nul = unsafe { arg(c"x\xff".as_ptr(), "s") };
        assert!(matches!(nul, Err(Fail(RL_ERR_INPUT, _))));
    }
}
