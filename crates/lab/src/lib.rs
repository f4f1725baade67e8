//! The Soft-RoCE lab: a real RDMA fabric on machines that have none.
//!
//! The host kernel has no InfiniBand support, so the lab boots Debian's own kernel under QEMU
//! (TCG) with the host's root shared read-only over 9p, loads `rdma_rxe`, and brings up N
//! Soft-RoCE "hosts" (`rxe1..rxeN` at `192.0.2.11..`) on one bridge. Binaries built on the host
//! run unchanged inside, because the guest sees the same filesystem at the same paths.
//!
//! The crate has two halves:
//! - the host side ([`host`]): installs what the lab needs, fetches and unpacks the kernel,
//!   builds the initramfs, boots QEMU, runs a command inside with a hard timeout, and turns any
//!   failure into one line that names its cause;
//! - the guest side ([`guest`], [`perftest`]): facts about the fabric (devices, port state,
//!   RoCE v2 GIDs), fault hooks for tests (netem, link down/up, signals), and the perftest
//!   baseline that later benchmarks divide by.
//!
//! The pure parts (configuration, kernel selection, module resolution, perftest parsing) are
//! separate modules so that they are unit-tested on the host.

#![deny(unsafe_code)]

pub mod config;
pub mod guest;
pub mod host;
pub mod kernel;
pub mod modules;
pub mod perftest;

/// Everything that can stop the lab, each with the one-line cause a user acts on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// A configuration value is out of range or inconsistent.
    #[error("invalid lab configuration: {0}")]
    Config(String),
    /// Debian packages the lab needs are missing and could not be installed.
    #[error("missing Debian packages: {packages}; {hint}")]
    MissingPackages {
        /// Space-separated package names.
        packages: String,
        /// What to do about it.
        hint: String,
    },
    /// No usable kernel image package was found.
    #[error("no Debian kernel image with Soft-RoCE found: {0}")]
    NoKernel(String),
    /// An external command failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line, for the user to rerun.
        command: String,
        /// Its exit status and the tail of its stderr.
        detail: String,
    },
    /// The guest reported a failure during boot or fabric bring-up.
    #[error("lab guest failed: {0}")]
    Guest(String),
    /// The guest did not finish in time.
    #[error("lab timed out after {seconds} s {stage}; console log: {log}")]
    Timeout {
        /// The limit that was hit.
        seconds: u64,
        /// What the guest was doing.
        stage: String,
        /// Where the full console output is.
        log: String,
    },
    /// Output from a tool could not be parsed.
    #[error("cannot parse {what}: {detail}")]
    Parse {
        /// Which output.
        what: String,
        /// What was wrong with it.
        detail: String,
    },
    /// This call only makes sense inside the lab guest.
    #[error(
        "not inside the lab guest (RDMALOG_LAB is not set): run it through `ops/lab run -- ...`"
    )]
    NotInLab,
    /// An I/O error with the path or action it concerns.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Shorthand result type of this crate.
pub type Result<T> = std::result::Result<T, LabError>;

/// Attaches a context sentence to an I/O error (for `map_err`).
pub fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let context = context.into();
    move |source| LabError::Io { context, source }
}
