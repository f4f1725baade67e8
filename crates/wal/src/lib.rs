//! The log's storage: entry format, registered ring memory, segment files, group commit, recovery.
//!
//! Not built yet: see ARCHITECTURE.md for the plan and the open issues for the work.

#![deny(unsafe_code)]
