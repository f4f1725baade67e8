//! Bindings that rdma-sys 0.3 does not generate, and small FFI helpers.
//!
//! `ibv_query_gid_ex` is a `static inline` wrapper in `<infiniband/verbs.h>` around the
//! exported `_ibv_query_gid_ex` (libibverbs IBVERBS_1.11); bindgen's `ibv_.*` allowlist does
//! not match the leading underscore, so it is declared here with the C prototype.
//! The `RDMA_OPTION_*` values are anonymous enums in `<rdma/rdma_cma.h>` that bindgen drops.

pub use rdma_sys::*;

/// `RDMA_OPTION_ID` from `<rdma/rdma_cma.h>`: option level for the cm id itself.
pub const RDMA_OPTION_ID: i32 = 0;
/// `RDMA_OPTION_ID_ACK_TIMEOUT` from `<rdma/rdma_cma.h>`: `uint8_t` local ACK timeout
/// exponent (4.096 µs × 2^value) that the CM applies when it computes RTS attributes.
pub const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;
/// `IBV_GID_TYPE_ROCE_V2` from `enum ibv_gid_type` in `<infiniband/verbs.h>`.
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `IBV_GID_TYPE_ROCE_V1` from `enum ibv_gid_type` in `<infiniband/verbs.h>`.
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
/// `IBV_GID_TYPE_IB` from `enum ibv_gid_type` in `<infiniband/verbs.h>`.
pub const IBV_GID_TYPE_IB: u32 = 0;

unsafe extern "C" {
    /// Exported by libibverbs since rdma-core v32 (`IBVERBS_1.11`).
    pub fn _ibv_query_gid_ex(
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> libc::c_int;
}

/// The calling thread's `errno` as an `io::Error`.
pub fn last_os_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Turns a verbs return code into an `io::Error`: verbs functions return either `-1` with
/// `errno` set, or a positive errno value directly (`ibv_modify_qp`, `ibv_post_send`).
pub fn rc_error(rc: libc::c_int) -> std::io::Error {
    if rc > 0 {
        std::io::Error::from_raw_os_error(rc)
    } else {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error().unwrap_or(0) == 0 {
            std::io::Error::from_raw_os_error(libc::EIO)
        } else {
            e
        }
    }
}

/// Sets `O_NONBLOCK` on a file descriptor owned by libibverbs or librdmacm, so every wait on
/// it goes through `poll(2)` with a timeout instead of blocking forever.
pub fn set_nonblocking(fd: libc::c_int) -> std::io::Result<()> {
    // SAFETY: fcntl on an fd we were handed by the library; F_GETFL/F_SETFL only touch flags
    // and cannot invalidate memory. A bad fd surfaces as -1/EBADF, which we return.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(last_os_error());
    }
    // SAFETY: as above; we only add O_NONBLOCK to the flags we just read.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if rc < 0 {
        return Err(last_os_error());
    }
    Ok(())
}

/// Waits until `fd` is readable or `timeout` passes. Returns `Ok(true)` when readable.
pub fn wait_readable(fd: libc::c_int, timeout: std::time::Duration) -> std::io::Result<bool> {
    let mut pfd = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    wait_any(&mut pfd, timeout)
}

/// Waits up to `timeout` until any of `fds` is readable (restarting on `EINTR`); their
/// `revents` say which. Returns whether any is.
pub fn wait_any(fds: &mut [libc::pollfd], timeout: std::time::Duration) -> std::io::Result<bool> {
    // Round up: a sub-millisecond timeout must still sleep, not spin.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    loop {
        // SAFETY: `fds` is a valid, exclusively borrowed pollfd array of the given length
        // that lives for the whole call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            let e = last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(rc > 0);
    }
}

/// Reads a NUL-terminated C string owned by the library into a `String`.
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string that stays valid during the call.
pub unsafe fn cstr(p: *const libc::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller guarantees `p` is a valid NUL-terminated string for this call.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the running system; it touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

/// The `f_type` magic of the file system holding `file` (from `fstatfs(2)`).
pub fn fs_type(file: &std::fs::File) -> std::io::Result<i64> {
    use std::os::fd::AsRawFd;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `st` is a writable statfs of the right size that outlives the call, and the fd
    // belongs to `file`, which is borrowed for the call.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(last_os_error());
    }
    // SAFETY: fstatfs returned 0, so it filled the struct (and zeroed() covered any padding).
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast)] // reason: f_type's integer type differs between targets
    Ok(st.f_type as i64)
}

/// Takes an exclusive `flock(2)` on `file` without waiting: `Ok(false)` when another open
/// file description holds one. The lock lives until every descriptor of this open file
/// closes.
pub fn try_lock_exclusive(file: &std::fs::File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on the fd of `file`, which is borrowed for the call; it touches no memory.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}
