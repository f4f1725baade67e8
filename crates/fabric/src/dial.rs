//! The duplicate-dial rule, shared by every back-end: which connection a node keeps when a
//! second one to the same peer comes up.
//!
//! A new connection from the same initiator as the one held means that side considers the old
//! one dead (it restarted, or saw an error not seen here yet, for example on an idle
//! follower-to-follower link): the new one replaces it. Connections from different initiators
//! mean both sides dialled at once: both sides keep the one the lower node id made, so the pair
//! settles instead of flapping. A connection older than the duplicate window is not half of a
//! simultaneous dial: a new dial then means the peer found it dead (it restarted while the link
//! was idle, which this side cannot notice), so the new one replaces it.

use std::time::Duration;

use crate::NodeId;

/// How long after adoption a dial from the other side counts as half of a simultaneous dial
/// rather than as a sign that the held connection is dead. Dials of both sides race within a
/// connect's duration, well under this.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(3);

/// A live connection a node holds to a peer.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    /// Whether this node dialled it.
    pub outgoing: bool,
    /// How long ago it was adopted.
    pub age: Duration,
    /// Whether its peer proved the cluster secret (always, without a secret).
    pub admitted: bool,
}

/// Which connection to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Keep the held one and drop the new one.
    Held,
    /// Adopt the new one (replacing the held one, if any).
    New,
}

/// Decides between the connection `held` (if any) and a new one, from `me` to `peer`,
/// which `me` dialled when `new_outgoing`.
pub fn keep(me: NodeId, peer: NodeId, held: Option<Held>, new_outgoing: bool) -> Keep {
    let Some(held) = held else {
        return Keep::New;
    };
    let lower = me.min(peer);
    let initiator = |out: bool| if out { me } else { peer };
    let (old_by, new_by) = (initiator(held.outgoing), initiator(new_outgoing));
    if old_by != new_by && old_by == lower && held.age < DUPLICATE_WINDOW {
        Keep::Held
    } else {
        Keep::New
    }
}

/// Whether a new connection that [`keep`] adopts must prove the cluster secret before it
/// replaces `held`, rather than at once. A connection's node id is only claimed until its
/// proof: replaced at once, an admitted connection would be cut by anyone who can reach the
/// port and claims the peer's id, with no secret. With no secret configured there is nothing
/// to prove and nothing to wait for; an unadmitted held connection is worth no more than the
/// new one.
pub fn must_prove_first(held: Option<Held>, secret: bool) -> bool {
    secret && held.is_some_and(|h| h.admitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    const YOUNG: Duration = Duration::from_millis(10);
    const OLD: Duration = Duration::from_secs(60);

    fn held(outgoing: bool, age: Duration) -> Option<Held> {
        Some(Held {
            outgoing,
            age,
            admitted: true,
        })
    }

    #[test]
    fn a_first_connection_is_adopted() {
        assert_eq!(keep(NodeId(1), NodeId(2), None, true), Keep::New);
        assert_eq!(keep(NodeId(2), NodeId(1), None, false), Keep::New);
    }

    /// A simultaneous dial settles on the lower id's connection on both sides, whichever
    /// arrives first.
    #[test]
    fn a_simultaneous_dial_keeps_the_lower_ids_connection_on_both_sides() {
        let (lo, hi) = (NodeId(1), NodeId(2));
        // lo holds its own dial; hi's dial arrives: lo keeps its own.
        assert_eq!(keep(lo, hi, held(true, YOUNG), false), Keep::Held);
        // hi holds lo's dial; hi's own dial completes: hi keeps lo's.
        assert_eq!(keep(hi, lo, held(false, YOUNG), true), Keep::Held);
        // lo holds hi's dial; lo's own dial completes: lo adopts its own.
        assert_eq!(keep(lo, hi, held(false, YOUNG), true), Keep::New);
        // hi holds its own dial; lo's dial arrives: hi adopts lo's.
        assert_eq!(keep(hi, lo, held(true, YOUNG), false), Keep::New);
    }

    #[test]
    fn a_redial_by_the_same_side_replaces_the_held_connection() {
        let (lo, hi) = (NodeId(1), NodeId(2));
        assert_eq!(keep(lo, hi, held(true, YOUNG), true), Keep::New);
        assert_eq!(keep(hi, lo, held(false, YOUNG), false), Keep::New);
    }

    /// A peer that restarted while the link was idle dials again; the held connection is
    /// older than the window, so the new one wins even against the lower-id rule.
    #[test]
    fn an_old_connection_is_replaced_by_any_new_dial() {
        let (lo, hi) = (NodeId(1), NodeId(2));
        assert_eq!(keep(lo, hi, held(true, OLD), false), Keep::New);
        assert_eq!(keep(hi, lo, held(false, OLD), true), Keep::New);
    }

    /// With a secret, a new connection waits for its proof before it replaces an admitted
    /// one; it replaces at once an unadmitted one, and anything without a secret.
    #[test]
    fn only_an_admitted_connection_waits_for_the_new_ones_proof() {
        let unadmitted = Some(Held {
            outgoing: false,
            age: OLD,
            admitted: false,
        });
        assert!(must_prove_first(held(false, OLD), true));
        assert!(!must_prove_first(held(false, OLD), false));
        assert!(!must_prove_first(unadmitted, true));
        assert!(!must_prove_first(None, true));
    }
}
