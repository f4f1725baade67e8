//! Where a commit's time goes: the replicas mark each step of an entry's way (`tracing`
//! events at target `rdmalog::step`, see `replica`'s `step!`), a [`Recorder`] collects them
//! with their times, and [`breakdown`] sets them against the client's own start and end of
//! each append: for every step, the median time from the append's start to the first time
//! that step covered the entry, on the leader or on the first follower to do it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, Registry};

/// The `tracing` target of the replicas' step events.
pub const TARGET: &str = "rdmalog::step";

/// One step event: the entries `first..=last` reached `step` on `node` at `at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepEvent {
    /// When it was recorded.
    pub at: Instant,
    /// The replica.
    pub node: u64,
    /// The step's name.
    pub step: String,
    /// First entry index it covers.
    pub first: u64,
    /// Last entry index it covers.
    pub last: u64,
}

/// One measured append: its index, and when the client started and got it back.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// The entry's index.
    pub index: u64,
    /// The client called `append`.
    pub start: Instant,
    /// The client's wait returned.
    pub end: Instant,
}

/// Collects the replicas' step events of this process.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    events: Arc<Mutex<Vec<StepEvent>>>,
}

impl Recorder {
    /// Installs a recorder as the process's global `tracing` subscriber (only step events
    /// reach it). Fails if another global subscriber was installed first.
    pub fn install() -> anyhow::Result<Recorder> {
        let r = Recorder::default();
        tracing::subscriber::set_global_default(r.subscriber())
            .map_err(|e| anyhow::anyhow!("installing the step recorder: {e}"))?;
        Ok(r)
    }

    /// Runs `f` with a recorder as this thread's `tracing` subscriber (a test's in-process
    /// cluster runs on the caller's thread), and returns what it returned and the events.
    pub fn scoped<R>(f: impl FnOnce() -> R) -> (R, Vec<StepEvent>) {
        let r = Recorder::default();
        let out = tracing::subscriber::with_default(r.subscriber(), f);
        (out, r.take())
    }

    /// A subscriber that hands this recorder the step events, and nothing else.
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        let only_steps = Targets::new().with_target(TARGET, tracing::Level::TRACE);
        Registry::default().with(StepLayer(self.clone()).with_filter(only_steps))
    }

    /// The events recorded so far, and forgets them.
    pub fn take(&self) -> Vec<StepEvent> {
        std::mem::take(&mut *self.events.lock().expect("not poisoned"))
    }
}

struct StepLayer(Recorder);

#[derive(Default)]
struct Fields {
    node: u64,
    step: String,
    first: u64,
    last: u64,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "node" => self.node = value,
            "first" => self.first = value,
            "last" => self.last = value,
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "step" {
            self.step = value.to_string();
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> Layer<S> for StepLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let at = Instant::now();
        let mut f = Fields::default();
        event.record(&mut f);
        self.0.events.lock().expect("not poisoned").push(StepEvent {
            at,
            node: f.node,
            step: f.step,
            first: f.first,
            last: f.last,
        });
    }
}

/// Steps whose event names one index that covers every entry up to it (a response, a
/// commit index); the others cover the range `first..=last` only.
fn cumulative(step: &str) -> bool {
    matches!(step, "answered" | "acked" | "nic_acked" | "committed")
}

/// One row of the breakdown.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// `leader <step>`, `follower <step>`, or `client returns`.
    pub name: String,
    /// Median time from the append's start, µs.
    pub median_us: f64,
    /// Samples in which the step was seen.
    pub seen: usize,
}

/// For each step and role (the leader, `leader`; any other node, a follower), the median time
/// from a sample's start to the first event of that step that covers the sample's entry and
/// came after the start; steps seen in fewer than half of the samples are left out. Rows are
/// in order of their medians, the client's return among them.
pub fn breakdown(events: &[StepEvent], samples: &[Sample], leader: u64) -> Vec<Row> {
    let mut names: Vec<(bool, &str)> = events
        .iter()
        .map(|e| (e.node == leader, e.step.as_str()))
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut rows = Vec::new();
    for (on_leader, step) in names {
        let mut times: Vec<f64> = samples
            .iter()
            .filter_map(|s| {
                events
                    .iter()
                    .filter(|e| (e.node == leader) == on_leader && e.step == step)
                    .filter(|e| e.at >= s.start)
                    .filter(|e| e.last >= s.index && (cumulative(step) || e.first <= s.index))
                    .map(|e| (e.at - s.start).as_secs_f64() * 1e6)
                    .reduce(f64::min)
            })
            .collect();
        if times.len() * 2 < samples.len() || times.is_empty() {
            continue;
        }
        let role = if on_leader { "leader" } else { "follower" };
        rows.push(Row {
            name: format!("{role} {step}"),
            median_us: median(&mut times),
            seen: times.len(),
        });
    }
    let mut ends: Vec<f64> = samples
        .iter()
        .map(|s| (s.end - s.start).as_secs_f64() * 1e6)
        .collect();
    if !ends.is_empty() {
        rows.push(Row {
            name: "client returns".into(),
            median_us: median(&mut ends),
            seen: ends.len(),
        });
    }
    rows.sort_by(|a, b| a.median_us.total_cmp(&b.median_us));
    rows
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The breakdown as a Markdown table, with the gap from the row before.
pub fn render(rows: &[Row]) -> String {
    let mut t = String::from("| step | median from append | gap | seen |\n|---|---:|---:|---:|\n");
    let mut before = 0.0;
    for r in rows {
        t += &format!(
            "| {} | {:.0} µs | {:.0} µs | {} |\n",
            r.name,
            r.median_us,
            r.median_us - before,
            r.seen
        );
        before = r.median_us;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_step_takes_its_first_covering_event_after_the_start() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let ev = |us, node, step: &str, first, last| StepEvent {
            at: at(us),
            node,
            step: step.into(),
            first,
            last,
        };
        let events = vec![
            // Entry 5's own steps, two followers; an older commit before its start.
            ev(5, 1, "committed", 4, 4),
            ev(20, 1, "ready", 5, 5),
            ev(30, 1, "sent", 5, 5),
            ev(60, 2, "received", 5, 5),
            ev(50, 3, "received", 5, 5),
            ev(90, 2, "answered", 5, 5),
            ev(120, 1, "acked", 5, 5),
            ev(150, 1, "committed", 5, 5),
            // Entry 6: a batch ready, a commit that covers it by its index.
            ev(220, 1, "ready", 6, 7),
            ev(300, 1, "committed", 7, 7),
        ];
        let samples = [
            Sample {
                index: 5,
                start: at(10),
                end: at(170),
            },
            Sample {
                index: 6,
                start: at(210),
                end: at(330),
            },
        ];
        let rows = breakdown(&events, &samples, 1);
        let get = |name: &str| rows.iter().find(|r| r.name == name).cloned();
        // Medians of two samples take the larger (index len / 2).
        assert_eq!(get("leader ready").unwrap().median_us, 10.0);
        assert_eq!(get("leader committed").unwrap().median_us, 140.0);
        assert_eq!(get("client returns").unwrap().median_us, 160.0);
        // Seen in one sample of two: kept (half), with the earliest follower.
        let received = get("follower received").unwrap();
        assert_eq!((received.median_us, received.seen), (40.0, 1));
        let order: Vec<_> = rows.iter().map(|r| r.median_us).collect();
        assert!(order.windows(2).all(|w| w[0] <= w[1]), "{rows:?}");
        assert!(render(&rows).contains("| leader ready | 10 µs | 10 µs | 2 |"));
    }
}
