//! Retention: how much of the log a node keeps, by entries, bytes or age.
//!
//! A [`Retention`] policy names limits; [`Retention::first_to_keep`] turns them into the first
//! index to keep, and the caller deletes what is below through the checkpoint path
//! ([`crate::Replica::truncate_prefix`]: a checkpoint without state, then whole segments).
//! So a node keeps up to one segment more than a limit asks, never less, and never deletes an
//! entry it has not applied. Each node applies its policy to its own log; readers of a node
//! behind its first index get [`crate::ReplicaError::Compacted`], and a follower that needs
//! deleted entries is sent the checkpoint.

use std::time::{Duration, SystemTime};

/// Limits on what a node keeps; `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Keep at most this many entries (the newest).
    pub max_entries: Option<u64>,
    /// Keep at most this many bytes of the log's stream (the newest entries' records).
    pub max_bytes: Option<u64>,
    /// Keep entries newer than this, judged per segment by its file's last write: a segment
    /// whose last write is older holds only older entries.
    pub max_age: Option<Duration>,
}

/// What a policy looks at: the log as one node holds it.
#[derive(Clone, Debug)]
pub struct Held {
    /// The first index held.
    pub first: u64,
    /// The last index held.
    pub last: u64,
    /// The highest index applied (nothing above it is deleted).
    pub applied: u64,
    /// Each segment's first index and the time of its file's last write, oldest first.
    pub segments: Vec<(u64, Option<SystemTime>)>,
}

impl Retention {
    /// Whether no limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.max_entries.is_none() && self.max_bytes.is_none() && self.max_age.is_none()
    }

    /// The first index to keep under every limit, as of `now`: the highest of what each
    /// limit asks, at most `applied + 1`, at least `first`. `first_within_bytes(n)` is the
    /// first index from which the log holds at most `n` bytes.
    pub fn first_to_keep(
        &self,
        held: &Held,
        now: SystemTime,
        first_within_bytes: impl Fn(u64) -> u64,
    ) -> u64 {
        let mut keep = held.first;
        if let Some(n) = self.max_entries {
            keep = keep.max((held.last + 1).saturating_sub(n));
        }
        if let Some(b) = self.max_bytes {
            keep = keep.max(first_within_bytes(b));
        }
        if let Some(age) = self.max_age {
            let cutoff = now.checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH);
            // Everything before the first segment written at or after the cutoff is older.
            // The last segment is the log's tail and stays; a segment without a known time
            // stops the scan (nothing after it is deleted on its account). A truncation keeps
            // the segment that holds its checkpoint entry, so deleting old segment `k` takes
            // a checkpoint at the next segment's first entry (which stays readable).
            let n = held.segments.len();
            for (k, (_, written)) in held.segments.iter().enumerate() {
                let old = written.is_some_and(|w| w < cutoff);
                if k + 1 == n || !old {
                    break;
                }
                keep = keep.max(held.segments[k + 1].0 + 1);
            }
        }
        keep.min(held.applied + 1).max(held.first)
    }

    /// Whether keeping from `keep` deletes at least one segment: a truncation below the second
    /// segment's first index deletes nothing (and need not record a checkpoint).
    pub fn deletes_a_segment(held: &Held, keep: u64) -> bool {
        held.segments.get(1).is_some_and(|(first, _)| *first < keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> Held {
        let t = |s| Some(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        Held {
            first: 1,
            last: 400,
            applied: 390,
            segments: vec![(1, t(100)), (101, t(200)), (201, t(300)), (301, t(400))],
        }
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn each_limit_asks_for_its_own_first_index_and_the_highest_wins() {
        let h = held();
        let none = |_| 1;
        let r = Retention::default();
        assert!(r.is_unlimited());
        assert_eq!(r.first_to_keep(&h, at(500), none), 1);
        let r = Retention {
            max_entries: Some(150),
            ..Retention::default()
        };
        assert_eq!(r.first_to_keep(&h, at(500), none), 251);
        let r = Retention {
            max_bytes: Some(10),
            ..Retention::default()
        };
        assert_eq!(r.first_to_keep(&h, at(500), |b| 400 - b), 390);
        // Segments last written before 250 hold only older entries.
        let r = Retention {
            max_age: Some(Duration::from_secs(250)),
            ..Retention::default()
        };
        assert_eq!(r.first_to_keep(&h, at(500), none), 202);
        assert!(Retention::deletes_a_segment(&h, 202));
        let r = Retention {
            max_entries: Some(300),
            max_age: Some(Duration::from_secs(250)),
            ..Retention::default()
        };
        assert_eq!(r.first_to_keep(&h, at(500), none), 202);
    }

    #[test]
    fn nothing_unapplied_is_deleted_and_the_tail_segment_stays() {
        let h = held();
        let r = Retention {
            max_entries: Some(1),
            ..Retention::default()
        };
        assert_eq!(r.first_to_keep(&h, at(500), |_| 1), 391, "applied + 1");
        let r = Retention {
            max_age: Some(Duration::from_secs(1)),
            ..Retention::default()
        };
        // Every segment is old, but the last one is the tail.
        assert_eq!(r.first_to_keep(&h, at(10_000), |_| 1), 302);
        let mut unknown = h.clone();
        unknown.segments[1].1 = None;
        assert_eq!(r.first_to_keep(&unknown, at(10_000), |_| 1), 102);
    }

    #[test]
    fn a_truncation_deletes_a_segment_only_past_the_second_segments_start() {
        let h = held();
        assert!(!Retention::deletes_a_segment(&h, 101));
        assert!(Retention::deletes_a_segment(&h, 102));
        let one = Held {
            segments: vec![(1, None)],
            ..h
        };
        assert!(!Retention::deletes_a_segment(&one, 400));
    }
}
