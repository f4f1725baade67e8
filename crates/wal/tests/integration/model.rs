//! Model test: random sequences of append (both durabilities), suffix truncation, prefix
//! truncation, clean reopen and crash (with torn unsynced sectors) run against the real log on
//! the fault-injecting file system and against a plain `Vec` model. After every step the log
//! must equal the model; after a crash it must equal a prefix of the model that keeps every
//! entry made durable.

use crate::common;

use common::{open, payload, read_all};
use proptest::prelude::*;
use wal::fs::FaultFs;
use wal::{Durability, Index, Term};

#[derive(Clone, Debug)]
enum Op {
    Append {
        len: usize,
        fsync: bool,
        bump_term: bool,
    },
    TruncateSuffix {
        back: u64,
    },
    TruncatePrefix {
        keep: u64,
    },
    Reopen,
    Crash {
        tear_seed: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0usize..200, any::<bool>(), prop::bool::weighted(0.1))
            .prop_map(|(len, fsync, bump_term)| Op::Append { len, fsync, bump_term }),
        2 => (0u64..8).prop_map(|back| Op::TruncateSuffix { back }),
        1 => (0u64..20).prop_map(|keep| Op::TruncatePrefix { keep }),
        1 => Just(Op::Reopen),
        1 => any::<u64>().prop_map(|tear_seed| Op::Crash { tear_seed }),
    ]
}

/// The model: entries (index, term, payload) from `first` on, and how many are durable.
struct Model {
    first: u64,
    entries: Vec<(u64, u64, Vec<u8>)>,
    durable: usize,
    term: u64,
    generation: u64,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn log_matches_a_vec_model(ops in prop::collection::vec(op(), 1..60)) {
        let fs = FaultFs::new();
        let mut wal = Some(open(&fs).unwrap());
        let mut model = Model { first: 1, entries: Vec::new(), durable: 0, term: 1, generation: 0 };
        for op in ops {
            let log = wal.as_ref().unwrap();
            match op {
                Op::Append { len, fsync, bump_term } => {
                    if bump_term {
                        model.term += 1;
                    }
                    model.generation += 1;
                    let index = model.first + model.entries.len() as u64;
                    let mut bytes = payload(index, model.generation);
                    bytes.resize(len, 0xEE);
                    let durability = if fsync { Durability::Fsync } else { Durability::Memory };
                    let entry = log.append_next(Term(model.term), &bytes, durability).unwrap();
                    prop_assert_eq!(entry.index, Index(index));
                    model.entries.push((index, model.term, bytes));
                    if fsync {
                        model.durable = model.entries.len();
                    }
                }
                Op::TruncateSuffix { back } => {
                    let keep = model.entries.len().saturating_sub(back as usize);
                    let from = model.first + keep as u64;
                    log.truncate_suffix(Index(from)).unwrap();
                    model.entries.truncate(keep);
                    model.durable = model.durable.min(keep).max(keep.min(model.entries.len()));
                    // Truncation syncs the buffer first, so everything kept is durable.
                    model.durable = keep;
                }
                Op::TruncatePrefix { keep } => {
                    let checkpoint = model.first + model.entries.len().saturating_sub(keep as usize) as u64;
                    let first = log.truncate_prefix(Index(checkpoint)).unwrap();
                    prop_assert!(first.0 <= checkpoint.max(model.first));
                    prop_assert!(first.0 >= model.first);
                    let dropped = (first.0 - model.first) as usize;
                    model.entries.drain(..dropped);
                    model.durable -= dropped.min(model.durable);
                    model.first = first.0;
                }
                Op::Reopen => {
                    let log = wal.take().unwrap();
                    log.close().unwrap();
                    drop(log);
                    wal = Some(open(&fs).unwrap());
                    model.durable = model.entries.len();
                }
                Op::Crash { tear_seed } => {
                    fs.crash_now();
                    drop(wal.take());
                    fs.reboot(Some(tear_seed));
                    let log = open(&fs).unwrap();
                    let recovered = log.last_index().0 + 1 - model.first;
                    prop_assert!(recovered as usize >= model.durable, "lost durable entries");
                    prop_assert!(recovered as usize <= model.entries.len(), "invented entries");
                    model.entries.truncate(recovered as usize);
                    model.durable = model.entries.len();
                    if let Some(&(_, term, _)) = model.entries.last() {
                        model.term = model.term.max(term);
                    }
                    wal = Some(log);
                }
            }
            let log = wal.as_ref().unwrap();
            prop_assert_eq!(log.first_index().0, model.first);
            prop_assert_eq!(read_all(log), model.entries.clone());
        }
        wal.take().unwrap().close().unwrap();
    }
}
