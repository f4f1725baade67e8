//! Replayability: the same seed twice gives the same run, event for event (the trace hash
//! covers every fault, client acknowledgement and their virtual times), and a different seed
//! gives a different one.
//!
//! Method: run seeds with the default options twice in one process and compare the summaries.

#[test]
fn same_seed_same_trace() {
    for seed in [3u64, 17, 12345] {
        let a = sim::run(seed, sim::Options::default(), false).unwrap_or_else(|f| panic!("{f}"));
        let b = sim::run(seed, sim::Options::default(), false).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(a, b, "seed {seed} did not replay exactly");
        assert!(a.acked > 0, "seed {seed} acknowledged nothing: {a:?}");
    }
    let a = sim::run(3, sim::Options::default(), false).unwrap();
    let c = sim::run(4, sim::Options::default(), false).unwrap();
    assert_ne!(a.trace_hash, c.trace_hash);
}
