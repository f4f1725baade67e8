//! Replication core: raft-rs over the fabric, the one-sided data path, fencing, the embedded API.
//!
//! Not built yet: see ARCHITECTURE.md for the plan and the open issues for the work.

#![deny(unsafe_code)]
