//! The rdmalog-server binary, its TCP client protocol, and the rdmalog CLI.
//!
//! Not built yet: see ARCHITECTURE.md for the plan and the open issues for the work.

#![deny(unsafe_code)]
