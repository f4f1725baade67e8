//! The seed family of clean stops: seeds 1..=N where half the process kills are clean stops
//! (`Replica::close`, what `rdmalog-server` does on SIGTERM) and `Replicated` episodes end
//! with their stalled followers stopped cleanly and restarted instead of woken. A clean stop
//! must keep everything a kill keeps: under `Replicated`, the records the leader placed in a
//! follower's ring and counted on the NIC's completion. With the close's fence taken away
//! (`Mutation::CloseWithoutFence`) a seed of the family fails; the default families only
//! kill, so none of their seeds could.
//!
//! `SIM_SEEDS=N` changes the number of seeds.

use replica::{Durability, Mutation};

fn seeds() -> u64 {
    sim::seeds_from_env(200)
}

fn options(mutation: Mutation, durability: Option<Durability>) -> sim::Options {
    sim::Options {
        clean_stops: true,
        mutation,
        durability,
        ..sim::Options::default()
    }
}

#[test]
fn every_seed_holds_with_clean_stops() {
    sim::expect_family_holds(
        "clean stops",
        options(Mutation::None, None),
        seeds(),
        &[(sim::Fault::Stop, "clean stops")],
    );
}

#[test]
fn a_close_that_does_not_fence_the_ring_is_caught() {
    let caught = sim::first_catch(
        options(Mutation::CloseWithoutFence, Some(Durability::Replicated)),
        1..=seeds(),
    )
    .unwrap_or_else(|f| panic!("the catching seed fails without the mutation too:\n{f}"))
    .map(|c| (c.seed, c.failure.to_string()));
    let Some((seed, failure)) = caught else {
        panic!(
            "close-without-fence: no seed of 1..={} caught it (every seed Replicated)",
            seeds()
        );
    };
    eprintln!("close-without-fence caught at seed {seed}:\n{failure}");
}

/// Seeds of the family that found a defect, replayed: a kill during a clean close (here the
/// close's own disk operation reaching a kill armed before the stop, as a shutdown timeout's
/// SIGKILL would) removed the ring's files before it cleared the `ring_in_use` mark, so the
/// node came back recovering from a loss that never happened; with two such nodes no quorum
/// could form and the cluster stalled for good (liveness). The mark is cleared first now.
#[test]
fn regression_seeds_of_the_family_pass() {
    for (seed, durability) in [
        (30_001_269, None),
        (30_001_269, Some(Durability::Replicated)),
        (30_001_609, Some(Durability::Memory)),
    ] {
        // The schedule each was found with: a read failure took the node's next read.
        let found = sim::Options {
            next_read_eio: true,
            ..options(Mutation::None, durability)
        };
        if let Err(f) = sim::run(seed, found, false) {
            panic!("\n{f}\n");
        }
    }
}
