//! Regression (issue 13, defect 9): `SimCluster::add_node` copied neither `block_bytes` nor
//! `mutation`, so every membership seed ran its joiner with another block size than the rest of
//! the log (a configuration the docs call invalid) and without the mutation under test.
//!
//! Method: 3 nodes with every setting a test may tune moved off its default; add node 4; its
//! configuration must equal the others' apart from what is the node's own: id, voters (a joiner
//! learns them from the log), data directory and election window.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, Mutation};

#[test]
fn a_joiner_gets_every_setting_of_the_cluster() {
    let mut c = SimCluster::new(3, 9, SimConfig::default(), |cfg| {
        cfg.durability = Durability::Memory;
        cfg.block_bytes = 64 << 10;
        cfg.ring_bytes = 2 << 20;
        cfg.segment_bytes = 4 << 20;
        cfg.max_entry_bytes = 16 << 10;
        cfg.max_size_per_msg = 20 << 10;
        cfg.max_inflight_msgs = 7;
        cfg.broadcast_commit = true;
        cfg.reconnect_ticks = 3;
        cfg.max_snapshot_bytes = 8 << 20;
        cfg.mutation = Mutation::PrivateRing;
    })
    .unwrap();
    c.add_node(4).unwrap();

    let template = c.configs[&1].clone();
    let mut joiner = c.configs[&4].clone();
    assert_eq!(joiner.id, 4);
    assert!(
        joiner.voters.is_empty(),
        "a joiner learns its voters from the log"
    );
    assert_ne!(joiner.data_dir, template.data_dir);
    // Normalise what is the node's own; everything else must be the cluster's.
    joiner.id = template.id;
    joiner.voters = template.voters.clone();
    joiner.data_dir = template.data_dir.clone();
    joiner.election_window = template.election_window;
    assert_eq!(
        format!("{joiner:?}"),
        format!("{template:?}"),
        "the joiner's settings differ from the cluster's"
    );
}
