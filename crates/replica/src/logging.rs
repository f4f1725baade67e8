//! raft-rs logs through slog; this drain forwards its records to `tracing` (target `raft`),
//! so one subscriber shows both and `RUST_LOG=raft=debug` turns raft-rs's detail on.

use std::fmt::Write as _;

/// A slog drain that re-emits every record as a `tracing` event with target `raft`, its
/// key-value pairs appended to the message.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingDrain;

struct Kv(String);

impl slog::Serializer for Kv {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(
        &self,
        record: &slog::Record<'_>,
        values: &slog::OwnedKVList,
    ) -> Result<Self::Ok, Self::Err> {
        // raft-rs logs on hot paths; format nothing unless a subscriber wants the level.
        let enabled = match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::enabled!(target: "raft", tracing::Level::ERROR)
            }
            slog::Level::Warning => tracing::enabled!(target: "raft", tracing::Level::WARN),
            slog::Level::Info => tracing::enabled!(target: "raft", tracing::Level::INFO),
            slog::Level::Debug => tracing::enabled!(target: "raft", tracing::Level::DEBUG),
            slog::Level::Trace => tracing::enabled!(target: "raft", tracing::Level::TRACE),
        };
        if !enabled {
            return Ok(());
        }
        let mut kv = Kv(String::new());
        let _ = slog::KV::serialize(&record.kv(), record, &mut kv);
        let _ = slog::KV::serialize(values, record, &mut kv);
        let msg = record.msg();
        let kv = kv.0;
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "raft", "{msg}{kv}")
            }
            slog::Level::Warning => tracing::warn!(target: "raft", "{msg}{kv}"),
            slog::Level::Info => tracing::info!(target: "raft", "{msg}{kv}"),
            slog::Level::Debug => tracing::debug!(target: "raft", "{msg}{kv}"),
            slog::Level::Trace => tracing::trace!(target: "raft", "{msg}{kv}"),
        }
        Ok(())
    }
}

/// The logger handed to raft-rs (which adds `raft_id` to every record itself).
pub fn raft_logger() -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn raft_records_reach_tracing_with_their_fields_and_levels() {
        let out = Captured::default();
        let w = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_env_filter("raft=info")
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let logger = super::raft_logger().new(slog::o!("raft_id" => 7));
            slog::info!(logger, "became leader at term {}", 3; "term" => 3);
            slog::debug!(logger, "filtered out below info");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains("INFO raft: became leader at term 3"),
            "{text}"
        );
        assert!(
            text.contains("term=3") && text.contains("raft_id=7"),
            "{text}"
        );
        assert!(!text.contains("filtered out"), "{text}");
    }
}
