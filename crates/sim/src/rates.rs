//! Fault rates, drawn per seed in ranges, as TigerBeetle's VOPR does: one seed runs with many
//! crashes and few partitions, the next the other way round, so that over many seeds every mix
//! is tried without anyone choosing it.

use fabric::sim::SplitMix64;

/// Per-step probabilities in parts per million (one step is one raft tick of virtual time),
/// plus the shape of the client load. Every field is drawn from the seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultRates {
    /// A node crashes (process memory lost, disk keeps durable bytes).
    pub crash_ppm: u64,
    /// Every node loses power at once (a correlated outage) and reboots.
    pub power_loss_ppm: u64,
    /// A node's process is killed (kill -9): shared memory and the page cache survive.
    pub kill_ppm: u64,
    /// A crashed node restarts (its unsynced tail is torn at random).
    pub restart_ppm: u64,
    /// A crash tears the node's in-flight RDMA writes (a random subset of words lands).
    pub torn_write_ppm: u64,
    /// A partition starts (symmetric or one-directional).
    pub partition_ppm: u64,
    /// Every partition heals.
    pub heal_ppm: u64,
    /// A connection breaks (both sides see a QP error).
    pub break_ppm: u64,
    /// A link gets (or loses) extra one-way delay.
    pub delay_ppm: u64,
    /// A node (most often the leader) pauses: CPU stopped, NIC still acking.
    pub pause_ppm: u64,
    /// A paused node resumes.
    pub resume_ppm: u64,
    /// A node's next fdatasync fails with EIO (it fail-stops).
    pub eio_ppm: u64,
    /// A node's disk fills up (ENOSPC soon after).
    pub enospc_ppm: u64,
    /// The leader hands leadership to another voter.
    pub transfer_ppm: u64,
    /// The leader adds or removes a voter.
    pub membership_ppm: u64,
    /// A node checkpoints its applied state (and deletes the entries it covers).
    pub checkpoint_ppm: u64,
    /// A node's disk loses power at one of its next writes (Fsync seeds).
    pub power_cut_ppm: u64,
    /// A node's next read of its disk fails with EIO.
    pub read_eio_ppm: u64,
    /// A byte of a stored record rots (Fsync seeds only; drawn from the seed's second
    /// generator, so older seeds keep their runs until the first rot).
    pub rot_ppm: u64,
    /// A node's process is killed at one of its next disk operations, in the middle of a
    /// cut, an install, a checkpoint or an append (drawn from the seed's own generator for
    /// it, so seeds without it run as before until its first kill).
    pub kill_mid_op_ppm: u64,
    /// A client starts an append.
    pub append_ppm: u64,
}

impl FaultRates {
    /// Draws every rate from `rng` within its range.
    pub fn draw(rng: &mut SplitMix64) -> Self {
        let mut r = |lo: u64, hi: u64| lo + rng.below(hi - lo + 1);
        FaultRates {
            crash_ppm: r(0, 20_000),
            // Drawn last, by `draw_late`, so that adding it kept every older seed's rates.
            power_loss_ppm: 0,
            kill_ppm: 0,
            checkpoint_ppm: 0,
            power_cut_ppm: 0,
            read_eio_ppm: 0,
            rot_ppm: 0,
            kill_mid_op_ppm: 0,
            restart_ppm: r(20_000, 200_000),
            torn_write_ppm: r(0, 1_000_000),
            partition_ppm: r(0, 20_000),
            heal_ppm: r(10_000, 100_000),
            break_ppm: r(0, 30_000),
            delay_ppm: r(0, 20_000),
            pause_ppm: r(0, 10_000),
            resume_ppm: r(20_000, 150_000),
            eio_ppm: r(0, 4_000),
            enospc_ppm: r(0, 3_000),
            transfer_ppm: r(0, 10_000),
            membership_ppm: r(0, 6_000),
            append_ppm: r(100_000, 700_000),
        }
    }

    /// Draws the rates added after the first version (after the cluster size), so that older
    /// seeds keep their other rates and size.
    pub fn draw_late(&mut self, rng: &mut SplitMix64) {
        self.power_loss_ppm = rng.below(1_501);
        self.kill_ppm = rng.below(15_001);
        self.checkpoint_ppm = rng.below(20_001);
        self.power_cut_ppm = rng.below(4_001);
        self.read_eio_ppm = rng.below(4_001);
    }

    /// No faults at all, only client load (tests of the harness itself).
    pub fn quiet() -> Self {
        FaultRates {
            crash_ppm: 0,
            power_loss_ppm: 0,
            kill_ppm: 0,
            checkpoint_ppm: 0,
            power_cut_ppm: 0,
            read_eio_ppm: 0,
            rot_ppm: 0,
            kill_mid_op_ppm: 0,
            restart_ppm: 0,
            torn_write_ppm: 0,
            partition_ppm: 0,
            heal_ppm: 0,
            break_ppm: 0,
            delay_ppm: 0,
            pause_ppm: 0,
            resume_ppm: 0,
            eio_ppm: 0,
            enospc_ppm: 0,
            transfer_ppm: 0,
            membership_ppm: 0,
            append_ppm: 300_000,
        }
    }
}

impl std::fmt::Display for FaultRates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ppm/step: crash {} power-loss {} kill {} restart {} torn-write {} partition {} heal {} break {} delay {} \
             pause {} resume {} eio {} enospc {} transfer {} membership {} checkpoint {} \
             power-cut {} read-eio {} rot {} kill-mid-op {} append {}",
            self.crash_ppm,
            self.power_loss_ppm,
            self.kill_ppm,
            self.restart_ppm,
            self.torn_write_ppm,
            self.partition_ppm,
            self.heal_ppm,
            self.break_ppm,
            self.delay_ppm,
            self.pause_ppm,
            self.resume_ppm,
            self.eio_ppm,
            self.enospc_ppm,
            self.transfer_ppm,
            self.membership_ppm,
            self.checkpoint_ppm,
            self.power_cut_ppm,
            self.read_eio_ppm,
            self.rot_ppm,
            self.kill_mid_op_ppm,
            self.append_ppm
        )
    }
}
