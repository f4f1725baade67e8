//! The server's TOML configuration, checked up front with errors that name the bad key.
//! `ops/config/` has commented examples; every key is listed in [`ServerFile`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use proto::Role;
use serde::Deserialize;

/// Checks a client address given to clients: `host:port` with a host and a port number (an
/// IP address or a name; names resolve on the client).
fn client_address(a: &str) -> Result<(), String> {
    let bad = || format!("expected host:port with a port number, not \"{a}\"");
    if let Ok(sa) = a.parse::<SocketAddr>() {
        return if sa.ip().is_unspecified() || sa.port() == 0 {
            Err(format!("{a} is not an address clients can connect to"))
        } else {
            Ok(())
        };
    }
    let (host, port) = a.rsplit_once(':').ok_or_else(bad)?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 && !host.is_empty() && !host.contains(char::is_whitespace) => Ok(()),
        _ => Err(bad()),
    }
}

/// The shortest dead-peer bound `rdma.qp_timeout` and `rdma.qp_retry` may give under
/// `transport = "tcp"`.
const MIN_TCP_DEAD_PEER: std::time::Duration = std::time::Duration::from_millis(100);

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
#[error("{file}: `{key}`: {reason}")]
pub struct ConfigError {
    /// The configuration file.
    pub file: String,
    /// The key at fault, as a dotted path.
    pub key: String,
    /// What is wrong and what is expected.
    pub reason: String,
}

/// A number written as an integer or as a `"0x..."` string.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum Id {
    /// `cluster_id = 427`
    Int(u64),
    /// `cluster_id = "0x1ab"`
    Text(HexOrDec),
}

/// A `"0x..."` or decimal string.
#[derive(Debug, Clone, Copy)]
pub struct HexOrDec(pub Option<u64>);

impl<'de> Deserialize<'de> for HexOrDec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(HexOrDec(match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => s.parse().ok(),
        }))
    }
}

/// The file, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    /// This node's id (1..).
    pub node_id: u64,
    /// The cluster id (integer or "0x..." string); peers and clients of another are refused.
    pub cluster_id: Id,
    /// Segments, raft state and checkpoints.
    pub data_dir: PathBuf,
    /// "fsync" (default), "memory" or "replicated".
    #[serde(default)]
    pub durability: Option<String>,
    /// Under memory and replicated durability: the tmpfs directory of the ring files (default
    /// /dev/shm).
    #[serde(default)]
    pub ring_dir: Option<PathBuf>,
    /// Ring size in MiB (a power of two; default 8).
    #[serde(default)]
    pub ring_mib: Option<u64>,
    /// Segment file size in MiB (default 64).
    #[serde(default)]
    pub segment_mib: Option<u64>,
    /// The replication transport: "rdma" (default) or "tcp" (kernel sockets, for hosts
    /// without RDMA; the `[rdma]` section then gives the TCP listen address and secret).
    #[serde(default)]
    pub transport: Option<String>,
    /// The replication side (its addresses and secret serve both transports).
    pub rdma: RdmaSection,
    /// The other members.
    #[serde(default)]
    pub peers: Vec<PeerSection>,
    /// TLS on the peer links (transport = "tcp" only); see `fabric::tls`.
    #[serde(default)]
    pub peer_tls: Option<PeerTlsSection>,
    /// Raft timing.
    #[serde(default)]
    pub raft: RaftSection,
    /// The replica's driver thread.
    #[serde(default)]
    pub poll: PollSection,
    /// The client port.
    pub client: ClientSection,
    /// TLS on the client port (required unless `client.plaintext = true`).
    #[serde(default)]
    pub tls: Option<TlsSection>,
    /// Tokens and roles.
    #[serde(default)]
    pub auth: AuthSection,
    /// The metrics endpoint.
    #[serde(default)]
    pub metrics: Option<MetricsSection>,
    /// What this node's log keeps.
    #[serde(default)]
    pub retention: RetentionSection,
}

/// `[retention]`: limits on what this node's log keeps; each node applies them to its own
/// log, deleting whole segments through a checkpoint, never an entry it has not applied.
/// None set (the default) keeps everything.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSection {
    /// Keep at most this many entries (the newest).
    pub max_entries: Option<u64>,
    /// Keep at most this many bytes of log (the newest entries' records), e.g. 10737418240.
    pub max_bytes: Option<u64>,
    /// Keep entries newer than this many seconds (judged per segment by its last write).
    pub max_age_secs: Option<u64>,
    /// How often to apply the limits, in ms (default 10000).
    pub interval_ms: Option<u64>,
}

/// `[rdma]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaSection {
    /// Address on this host's RDMA netdev, e.g. "192.0.2.11:7700".
    pub listen: SocketAddr,
    /// RDMA device name (e.g. "mlx5_0"); found from `listen`'s address when absent.
    #[serde(default)]
    pub device: Option<String>,
    /// Cluster secret file (owner-only, at least 16 bytes).
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// QP local ACK timeout exponent (4.096 us x 2^N), 1..=31 (default 14).
    #[serde(default)]
    pub qp_timeout: Option<u8>,
    /// QP retries, 0..=6 (default 6; Soft-RoCE retries forever at 7).
    #[serde(default)]
    pub qp_retry: Option<u8>,
}

/// `[[peers]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    /// Its node id.
    pub id: u64,
    /// Its RDMA address.
    pub rdma: SocketAddr,
    /// Its client address, as clients reach it (what redirects name).
    pub client: String,
    /// Under `[peer_tls]`: the name its certificate carries (DNS name or IP address); by
    /// default the IP address of `rdma`.
    #[serde(default)]
    pub tls_name: Option<String>,
}

/// `[peer_tls]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerTlsSection {
    /// This node's certificate chain (PEM), presented on every peer link; it must name this
    /// node's `rdma.listen` IP address (or the `tls_name` its peers configure for it).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The cluster CA bundle (PEM): every peer's certificate must chain to it.
    pub ca: PathBuf,
}

/// `[raft]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaftSection {
    /// Tick length in ms (default 20).
    #[serde(default = "d_tick")]
    pub tick_ms: u64,
    /// Ticks without a leader before an election (default 20).
    #[serde(default = "d_election")]
    pub election_ticks: usize,
    /// Ticks between heartbeats (default 3).
    #[serde(default = "d_heartbeat")]
    pub heartbeat_ticks: usize,
    /// Tell followers of each commit at once with a round of empty appends (default false:
    /// they learn it with the next append or heartbeat, for a third fewer messages per commit;
    /// see `ReplicaConfig::broadcast_commit`).
    #[serde(default)]
    pub broadcast_commit: bool,
}

fn d_tick() -> u64 {
    20
}
fn d_election() -> usize {
    20
}
fn d_heartbeat() -> usize {
    3
}

impl Default for RaftSection {
    fn default() -> Self {
        RaftSection {
            tick_ms: d_tick(),
            election_ticks: d_election(),
            heartbeat_ticks: d_heartbeat(),
            broadcast_commit: false,
        }
    }
}

/// `[poll]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollSection {
    /// "busy", "adaptive" (default) or "event".
    #[serde(default)]
    pub mode: Option<String>,
    /// Core to pin the driver thread to.
    #[serde(default)]
    pub pin_core: Option<usize>,
}

/// `[client]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSection {
    /// Where clients connect, e.g. "0.0.0.0:7600".
    pub listen: SocketAddr,
    /// How clients reach this node (what redirects and `Status` name); default: `listen`,
    /// which must then not be a wildcard address such as 0.0.0.0.
    #[serde(default)]
    pub advertise: Option<String>,
    /// Serve plain TCP instead of TLS. Must be said explicitly.
    #[serde(default)]
    pub plaintext: bool,
    /// Most open connections (default 1024).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Most requests pending per connection (default 256).
    #[serde(default)]
    pub max_in_flight: Option<usize>,
    /// Largest frame in bytes (default 16 MiB, at most 64 MiB).
    #[serde(default)]
    pub max_frame_bytes: Option<u32>,
    /// Longest a frame, the hello or the TLS handshake may take, in ms (default 10000).
    #[serde(default)]
    pub frame_timeout_ms: Option<u64>,
    /// Idle connections close after this many ms (default 300000, at least 1000).
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// Longest an append waits for its commit, in ms (default 10000).
    #[serde(default)]
    pub append_timeout_ms: Option<u64>,
}

/// `[tls]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of these CAs (PEM).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

/// `[auth]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// Role of a client without a token: "none", "read-only" (default), "read-write", "admin".
    #[serde(default)]
    pub anonymous_role: Option<String>,
    /// Tokens.
    #[serde(default)]
    pub tokens: Vec<TokenSection>,
}

/// `[[auth.tokens]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSection {
    /// A file holding the token (owner-only), so it stays out of the configuration.
    pub token_file: PathBuf,
    /// "read-only", "read-write" or "admin".
    pub role: String,
}

/// `[metrics]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Where to serve /metrics and /status, e.g. "127.0.0.1:9600".
    pub listen: SocketAddr,
}

/// The checked configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// What was read.
    pub file: ServerFile,
    /// Cluster id.
    pub cluster_id: u64,
    /// Durability.
    pub durability: replica::Durability,
    /// The replication transport.
    pub transport: fabric::Transport,
    /// TLS on the peer links, read from `[peer_tls]`.
    pub peer_tls: Option<fabric::tls::PeerTls>,
    /// Tokens read from their files, and their roles.
    pub tokens: HashMap<String, Role>,
    /// Anonymous role.
    pub anonymous_role: Option<Role>,
    /// The cluster secret read from `rdma.secret_file`, if one is named.
    pub secret: Option<std::sync::Arc<Vec<u8>>>,
    /// The client port's TLS, built from `[tls]` (certificates and key read and checked).
    pub client_tls: Option<std::sync::Arc<rustls::ServerConfig>>,
}

impl ServerFile {
    /// Reads and parses `path`, not yet checked: see [`ServerConfig::check`] (the server
    /// applies its command-line overrides in between).
    pub fn load(path: &Path) -> Result<ServerFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.display().to_string(),
            key: "(file)".into(),
            reason: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses `text` (`name` names it in errors), not yet checked.
    pub fn parse(text: &str, name: &str) -> Result<ServerFile, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError {
            file: name.into(),
            key: e
                .span()
                .map(|s| {
                    let line = text[..s.start].matches('\n').count() + 1;
                    format!("line {line}")
                })
                .unwrap_or_else(|| "(syntax)".into()),
            reason: e.message().to_string(),
        })
    }
}

impl ServerConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<ServerConfig, ConfigError> {
        let name = path.display().to_string();
        Self::check(ServerFile::load(path)?, &name)
    }

    /// Parses and checks `text` (`name` names it in errors).
    pub fn parse(text: &str, name: &str) -> Result<ServerConfig, ConfigError> {
        Self::check(ServerFile::parse(text, name)?, name)
    }

    /// Checks a parsed file.
    pub fn check(file: ServerFile, name: &str) -> Result<ServerConfig, ConfigError> {
        let bad = |key: &str, reason: String| ConfigError {
            file: name.into(),
            key: key.into(),
            reason,
        };
        if file.node_id == 0 {
            return Err(bad("node_id", "node ids start at 1".into()));
        }
        let cluster_id = match file.cluster_id {
            Id::Int(v) => v,
            Id::Text(HexOrDec(Some(v))) => v,
            Id::Text(HexOrDec(None)) => {
                return Err(bad(
                    "cluster_id",
                    "expected an integer or a \"0x...\" hex string".into(),
                ));
            }
        };
        let durability: replica::Durability = file
            .durability
            .as_deref()
            .unwrap_or("fsync")
            .parse()
            .map_err(|e| bad("durability", e))?;
        if let Some(r) = file.ring_mib {
            if !r.is_power_of_two() || r > 4096 {
                return Err(bad(
                    "ring_mib",
                    format!("expected a power of two up to 4096, not {r}"),
                ));
            }
        }
        if let Some(s) = file.segment_mib {
            if s == 0 || s > 65536 {
                return Err(bad("segment_mib", format!("expected 1..=65536, not {s}")));
            }
        }
        let transport: fabric::Transport = file
            .transport
            .as_deref()
            .unwrap_or("rdma")
            .parse()
            .map_err(|e| bad("transport", e))?;
        if transport == fabric::Transport::Tcp && file.rdma.device.is_some() {
            return Err(bad(
                "rdma.device",
                "names an RDMA device, but transport = \"tcp\" uses none: remove it".into(),
            ));
        }
        let peer_tls = Self::check_peer_tls(&file, transport, &bad)?;
        if let Some(t) = file.rdma.qp_timeout {
            if !(1..=31).contains(&t) {
                return Err(bad("rdma.qp_timeout", format!("expected 1..=31, not {t}")));
            }
        }
        if let Some(r) = file.rdma.qp_retry {
            if r > 6 {
                return Err(bad(
                    "rdma.qp_retry",
                    format!(
                        "expected 0..=6, not {r} (Soft-RoCE retries forever at 7, so a dead \
                         peer would never be detected)"
                    ),
                ));
            }
        }
        let mut ids = vec![file.node_id];
        for (k, p) in file.peers.iter().enumerate() {
            if ids.contains(&p.id) || p.id == 0 {
                return Err(bad(
                    &format!("peers[{k}].id"),
                    format!("node id {} is zero or used twice", p.id),
                ));
            }
            ids.push(p.id);
            client_address(&p.client).map_err(|e| bad(&format!("peers[{k}].client"), e))?;
        }
        // What clients are told to connect to (redirects, `Status`): an address they can
        // reach, not the wildcard the port listens on.
        match &file.client.advertise {
            Some(a) => client_address(a).map_err(|e| bad("client.advertise", e))?,
            None if file.client.listen.ip().is_unspecified() => {
                return Err(bad(
                    "client.advertise",
                    format!(
                        "client.listen is {}, which clients cannot connect to: set advertise to the address they reach this node at",
                        file.client.listen
                    ),
                ));
            }
            None => {}
        }
        let r = &file.raft;
        if r.tick_ms == 0 || r.heartbeat_ticks == 0 || r.election_ticks <= r.heartbeat_ticks {
            return Err(bad(
                "raft",
                "tick_ms and heartbeat_ticks must be positive, election_ticks above heartbeat_ticks"
                    .into(),
            ));
        }
        if let Some(m) = &file.poll.mode {
            if !["busy", "adaptive", "event"].contains(&m.as_str()) {
                return Err(bad(
                    "poll.mode",
                    format!("expected \"busy\", \"adaptive\" or \"event\", not \"{m}\""),
                ));
            }
        }
        let ret = &file.retention;
        for (key, v) in [
            ("retention.max_entries", ret.max_entries),
            ("retention.max_bytes", ret.max_bytes),
            ("retention.max_age_secs", ret.max_age_secs),
            ("retention.interval_ms", ret.interval_ms),
        ] {
            if v == Some(0) {
                return Err(bad(
                    key,
                    "must be positive (leave it out for no limit)".into(),
                ));
            }
        }
        let c = &file.client;
        if let Some(m) = c.max_frame_bytes {
            if !(1024..=proto::MAX_FRAME_LIMIT).contains(&m) {
                return Err(bad(
                    "client.max_frame_bytes",
                    format!("expected 1024..={}, not {m}", proto::MAX_FRAME_LIMIT),
                ));
            }
        }
        for (key, v) in [
            ("client.frame_timeout_ms", c.frame_timeout_ms),
            ("client.append_timeout_ms", c.append_timeout_ms),
        ] {
            if v == Some(0) {
                return Err(bad(key, "must be positive".into()));
            }
        }
        if c.idle_timeout_ms.is_some_and(|ms| ms < 1000) {
            return Err(bad(
                "client.idle_timeout_ms",
                "must be at least 1000: clients take a connection-level Malformed for an idle \
                 close, and resend, only on a connection unused for a second or more"
                    .into(),
            ));
        }
        for (key, v) in [
            ("client.max_connections", c.max_connections),
            ("client.max_in_flight", c.max_in_flight),
        ] {
            if v == Some(0) {
                return Err(bad(key, "must be positive".into()));
            }
        }
        match (&file.tls, c.plaintext) {
            (None, false) => {
                return Err(bad(
                    "tls",
                    "the client port needs TLS: add a [tls] section with cert and key, or set client.plaintext = true to serve plain TCP".into(),
                ));
            }
            (Some(_), true) => {
                return Err(bad(
                    "client.plaintext",
                    "plaintext = true and a [tls] section contradict each other".into(),
                ));
            }
            (Some(t), false) => {
                for (key, p) in [
                    ("tls.cert", Some(&t.cert)),
                    ("tls.key", Some(&t.key)),
                    ("tls.client_ca", t.client_ca.as_ref()),
                ] {
                    if let Some(p) = p {
                        if !p.is_file() {
                            return Err(bad(
                                key,
                                format!("{} is not a readable file", p.display()),
                            ));
                        }
                    }
                }
            }
            (None, true) => {}
        }
        // Read here, not only at start, so that `--check-config` catches a bad PEM or secret.
        let client_tls = match &file.tls {
            Some(t) => Some(
                crate::tls::server_config(&t.cert, &t.key, t.client_ca.as_deref())
                    .map_err(|e| bad("tls", e.to_string()))?,
            ),
            None => None,
        };
        let secret = match &file.rdma.secret_file {
            Some(p) => Some(std::sync::Arc::new(
                fabric::rdma::load_secret(p).map_err(|e| bad("rdma.secret_file", e.to_string()))?,
            )),
            None => None,
        };
        let role = |key: &str, s: &str| {
            Role::parse(s).ok_or_else(|| {
                bad(
                    key,
                    format!("expected \"read-only\", \"read-write\" or \"admin\", not \"{s}\""),
                )
            })
        };
        let anonymous_role = match file.auth.anonymous_role.as_deref() {
            None => Some(crate::DEFAULT_ANONYMOUS_ROLE),
            Some("none") => None,
            Some(s) => Some(role("auth.anonymous_role", s)?),
        };
        let mut tokens = HashMap::new();
        for (k, t) in file.auth.tokens.iter().enumerate() {
            let key = format!("auth.tokens[{k}].token_file");
            // A token is a credential: like the cluster secret, its file is the owner's only.
            let bytes = fabric::admission::read_owner_only("the token file", &t.token_file)
                .map_err(|e| bad(&key, e))?;
            let text = String::from_utf8(bytes).map_err(|_| {
                bad(
                    &key,
                    format!("{} is not UTF-8 text", t.token_file.display()),
                )
            })?;
            let token = text.trim().to_string();
            // One word: a comment or a second line in the file would otherwise become part
            // of the token, which no client then matches.
            if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(bad(
                    &key,
                    format!(
                        "{} holds more than one word: a token file holds the token alone, \
                         without spaces, comments or further lines",
                        t.token_file.display()
                    ),
                ));
            }
            if token.len() < 16 {
                return Err(bad(&key, "a token must have at least 16 characters".into()));
            }
            let r = role(&format!("auth.tokens[{k}].role"), &t.role)?;
            if tokens.insert(token, r).is_some() {
                return Err(bad(&key, "the same token is listed twice".into()));
            }
        }
        let config = ServerConfig {
            file,
            cluster_id,
            durability,
            transport,
            peer_tls,
            tokens,
            anonymous_role,
            secret,
            client_tls,
        };
        // What the node would refuse at start, refused here too (so `--check-config` tells),
        // named by the file's keys.
        config.replica_config().validate().map_err(|e| {
            let key = match &e {
                replica::ReplicaError::Config { field, .. } => match *field {
                    "voters" => "peers",
                    "ring_bytes" => "ring_mib",
                    "segment_bytes" => "segment_mib",
                    "election_tick" => "raft.election_ticks",
                    _ => "(replica)",
                },
                _ => "(replica)",
            };
            bad(key, e.to_string())
        })?;
        if config.transport == fabric::Transport::Tcp {
            // Over TCP the same two values bound how long an operation may go unanswered
            // before its peer is taken for dead; a NIC enforces a floor of its own, TCP none,
            // and a bound below a round trip and a scheduling delay breaks healthy links.
            let bound = config.tcp_config().dead_peer_timeout;
            if bound < MIN_TCP_DEAD_PEER {
                return Err(bad(
                    "rdma.qp_timeout",
                    format!(
                        "with qp_retry, an operation unanswered for {bound:?} would count its peer dead; over TCP that must be at least {MIN_TCP_DEAD_PEER:?}"
                    ),
                ));
            }
        }
        // The tick only: whether `poll.pin_core` is a core this process may use depends on
        // the machine and its cpuset, which `Log::open` checks at start.
        let tick = config.log_options().tick;
        if tick > replica::MAX_TICK {
            return Err(bad(
                "raft.tick_ms",
                format!("must be at most {}", replica::MAX_TICK.as_millis()),
            ));
        }
        Ok(config)
    }

    /// Reads `[peer_tls]` and the peers' `tls_name`s into the fabric's TLS settings.
    fn check_peer_tls(
        file: &ServerFile,
        transport: fabric::Transport,
        bad: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<Option<fabric::tls::PeerTls>, ConfigError> {
        let Some(t) = &file.peer_tls else {
            if let Some(k) = file.peers.iter().position(|p| p.tls_name.is_some()) {
                return Err(bad(
                    &format!("peers[{k}].tls_name"),
                    "names a TLS certificate, but there is no [peer_tls] section".into(),
                ));
            }
            return Ok(None);
        };
        if transport != fabric::Transport::Tcp {
            return Err(bad(
                "peer_tls",
                "TLS on peer links needs transport = \"tcp\"; RDMA peer links are not encrypted (keep them on a private network)".into(),
            ));
        }
        for (key, p) in [
            ("peer_tls.cert", &t.cert),
            ("peer_tls.key", &t.key),
            ("peer_tls.ca", &t.ca),
        ] {
            if !p.is_file() {
                return Err(bad(key, format!("{} is not a readable file", p.display())));
            }
        }
        let mut tls = fabric::tls::PeerTls::from_pem(&t.cert, &t.key, &t.ca)
            .map_err(|e| bad("peer_tls", e.to_string()))?;
        for (k, p) in file.peers.iter().enumerate() {
            if let Some(name) = &p.tls_name {
                tls.name_peer(fabric::NodeId(p.id), name)
                    .map_err(|e| bad(&format!("peers[{k}].tls_name"), e))?;
            }
        }
        Ok(Some(tls))
    }

    /// The client address this node advertises.
    pub fn advertise(&self) -> String {
        self.file
            .client
            .advertise
            .clone()
            .unwrap_or_else(|| self.file.client.listen.to_string())
    }

    /// The peers' replication addresses.
    fn peer_addrs(&self) -> BTreeMap<fabric::NodeId, SocketAddr> {
        let peers = self.file.peers.iter();
        peers.map(|p| (fabric::NodeId(p.id), p.rdma)).collect()
    }

    /// `rdma.qp_timeout` and `rdma.qp_retry`, defaults applied (14 and 6).
    pub fn qp_bounds(&self) -> (u8, u8) {
        let r = &self.file.rdma;
        (r.qp_timeout.unwrap_or(14), r.qp_retry.unwrap_or(6))
    }

    /// The RDMA endpoint's settings.
    pub fn rdma_config(&self) -> fabric::rdma::RdmaConfig {
        let f = &self.file;
        let node = fabric::NodeId(f.node_id);
        let mut rc =
            fabric::rdma::RdmaConfig::new(node, self.cluster_id, f.rdma.listen, self.peer_addrs());
        (rc.qp.timeout, rc.qp.retry_cnt) = self.qp_bounds();
        rc.device = f.rdma.device.clone();
        rc.secret = self.secret.clone();
        rc
    }

    /// The TCP endpoint's settings: the dead-peer bound is RDMA's retry timer of the same
    /// `qp_timeout`/`qp_retry`, so one setting means one thing.
    pub fn tcp_config(&self) -> fabric::tcp::TcpConfig {
        let f = &self.file;
        let node = fabric::NodeId(f.node_id);
        let mut tc =
            fabric::tcp::TcpConfig::new(node, self.cluster_id, f.rdma.listen, self.peer_addrs());
        let (timeout, retry) = self.qp_bounds();
        tc.dead_peer_timeout = fabric::tcp::TcpConfig::dead_peer_from_qp(timeout, retry);
        tc.secret = self.secret.clone();
        tc.tls = self.peer_tls.clone();
        tc
    }

    /// The replica's settings: every member a voter, the file's durability, ring, segments
    /// and raft timing (the replica's defaults where the file says nothing).
    pub fn replica_config(&self) -> replica::ReplicaConfig {
        let f = &self.file;
        let mut voters: Vec<u64> = f.peers.iter().map(|p| p.id).collect();
        voters.push(f.node_id);
        voters.sort_unstable();
        let mut rc =
            replica::ReplicaConfig::new(f.node_id, voters, self.cluster_id, f.data_dir.clone());
        rc.durability = self.durability;
        if let Some(d) = &f.ring_dir {
            rc.ring_dir = d.clone();
        }
        if let Some(m) = f.ring_mib {
            rc.ring_bytes = m << 20;
        }
        if let Some(m) = f.segment_mib {
            rc.segment_bytes = m << 20;
        }
        rc.election_tick = f.raft.election_ticks;
        rc.heartbeat_tick = f.raft.heartbeat_ticks;
        rc.broadcast_commit = f.raft.broadcast_commit;
        rc
    }

    /// How the log's driver runs: the tick, and `poll.mode` (adaptive with a 50 µs spin by
    /// default).
    pub fn log_options(&self) -> replica::LogOptions {
        let f = &self.file;
        replica::LogOptions {
            tick: std::time::Duration::from_millis(f.raft.tick_ms),
            poll: match f.poll.mode.as_deref() {
                Some("busy") => replica::PollMode::Busy,
                Some("event") => replica::PollMode::Event,
                _ => replica::PollMode::Adaptive {
                    spin: std::time::Duration::from_micros(50),
                },
            },
            pin_core: f.poll.pin_core,
        }
    }

    /// How the server serves clients: `[client]`, `[tls]`, `[auth]`, `[metrics]` and
    /// `[retention]`, with [`crate::ServerOptions::new`]'s defaults where the file says
    /// nothing.
    pub fn server_options(&self) -> crate::ServerOptions {
        use std::time::Duration;
        let f = &self.file;
        let c = &f.client;
        let mut so = crate::ServerOptions::new(f.node_id, self.cluster_id, c.listen);
        so.members = std::iter::once(proto::NodeInfo {
            id: f.node_id,
            client_addr: self.advertise(),
        })
        .chain(f.peers.iter().map(|p| proto::NodeInfo {
            id: p.id,
            client_addr: p.client.clone(),
        }))
        .collect();
        so.tls = self.client_tls.clone();
        so.tokens = self.tokens.clone();
        so.anonymous_role = self.anonymous_role;
        so.max_connections = c.max_connections.unwrap_or(so.max_connections);
        so.max_in_flight = c.max_in_flight.unwrap_or(so.max_in_flight);
        so.max_frame_bytes = c.max_frame_bytes.unwrap_or(so.max_frame_bytes);
        let ms = Duration::from_millis;
        so.frame_timeout = c.frame_timeout_ms.map_or(so.frame_timeout, ms);
        so.idle_timeout = c.idle_timeout_ms.map_or(so.idle_timeout, ms);
        so.append_timeout = c.append_timeout_ms.map_or(so.append_timeout, ms);
        so.metrics_listen = f.metrics.as_ref().map(|m| m.listen);
        let r = &f.retention;
        so.retention = replica::retention::Retention {
            max_entries: r.max_entries,
            max_bytes: r.max_bytes,
            max_age: r.max_age_secs.map(Duration::from_secs),
        };
        so.retention_interval = r.interval_ms.map_or(so.retention_interval, ms);
        so
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
node_id = 1
cluster_id = "0x1ab"
data_dir = "/var/lib/rdmalog"
[rdma]
listen = "192.0.2.11:7700"
[[peers]]
id = 2
rdma = "192.0.2.12:7700"
client = "192.0.2.12:7600"
[client]
listen = "0.0.0.0:7600"
advertise = "192.0.2.11:7600"
plaintext = true
"#;

    #[test]
    fn a_good_file_parses_with_defaults() {
        let c = ServerConfig::parse(GOOD, "t.toml").unwrap();
        assert_eq!(c.cluster_id, 0x1ab);
        assert_eq!(c.durability, replica::Durability::Fsync);
        assert_eq!(c.anonymous_role, Some(Role::ReadOnly));
        let embedded = crate::ServerOptions::new(1, 0x1ab, "127.0.0.1:0".parse().unwrap());
        assert_eq!(
            embedded.anonymous_role, c.anonymous_role,
            "an embedded server is as closed as a configured one"
        );
        assert_eq!(c.file.raft.tick_ms, 20);
        assert_eq!(c.advertise(), "192.0.2.11:7600");
        assert_eq!(c.transport, fabric::Transport::Rdma, "rdma by default");
        let tcp = GOOD.replace("node_id = 1", "node_id = 1\ntransport = \"tcp\"");
        assert_eq!(
            ServerConfig::parse(&tcp, "t.toml").unwrap().transport,
            fabric::Transport::Tcp
        );
        for (name, mode) in [
            ("memory", replica::Durability::Memory),
            ("replicated", replica::Durability::Replicated),
        ] {
            let text = GOOD.replace(
                "node_id = 1",
                &format!("node_id = 1\ndurability = \"{name}\""),
            );
            assert_eq!(
                ServerConfig::parse(&text, "t.toml").unwrap().durability,
                mode
            );
        }
    }

    #[test]
    fn retention_is_read_and_the_example_configurations_parse() {
        let c = ServerConfig::parse(
            &format!("{GOOD}\n[retention]\nmax_entries = 5\nmax_age_secs = 60\n"),
            "t.toml",
        )
        .unwrap();
        let r = &c.file.retention;
        assert_eq!(
            (r.max_entries, r.max_bytes, r.max_age_secs),
            (Some(5), None, Some(60))
        );
        assert_eq!(
            ServerConfig::parse(GOOD, "t.toml")
                .unwrap()
                .file
                .retention
                .max_entries,
            None
        );
        // The examples name files of a real host, so only their keys are checked here.
        for text in [
            include_str!("../../../ops/config/mlx5-node1.toml"),
            include_str!("../../../ops/config/lab-node1.toml"),
        ] {
            let f: ServerFile = toml::from_str(text).unwrap();
            assert!(f.node_id > 0);
        }
        let f: ServerFile =
            toml::from_str(include_str!("../../../ops/config/mlx5-node1.toml")).unwrap();
        assert_eq!(f.retention.max_age_secs, Some(604_800));
    }

    /// What the start builds from a file that sets nothing optional: the defaults the
    /// rustdoc of `ServerFile` and ops/GUIDE.md state; then a file that sets them.
    #[test]
    fn a_file_maps_to_the_documented_settings() {
        use std::time::Duration;
        let c = ServerConfig::parse(GOOD, "t.toml").unwrap();
        let r = c.replica_config();
        assert_eq!(r.voters, vec![1, 2]);
        assert_eq!(r.durability, replica::Durability::Fsync);
        assert_eq!(r.ring_bytes, 8 << 20, "ring_mib 8");
        assert_eq!(r.segment_bytes, 64 << 20, "segment_mib 64");
        assert_eq!(r.ring_dir, PathBuf::from("/dev/shm"));
        assert_eq!((r.election_tick, r.heartbeat_tick), (20, 3));
        assert!(!r.broadcast_commit);
        let o = c.log_options();
        assert_eq!(o.tick, Duration::from_millis(20));
        assert_eq!(
            o.poll,
            replica::PollMode::Adaptive {
                spin: Duration::from_micros(50)
            }
        );
        assert_eq!(o.pin_core, None);
        assert_eq!(c.qp_bounds(), (14, 6));
        let rc = c.rdma_config();
        assert_eq!((rc.qp.timeout, rc.qp.retry_cnt), (14, 6));
        assert!(rc.secret.is_none());
        let tc = c.tcp_config();
        assert_eq!(
            tc.dead_peer_timeout,
            fabric::tcp::TcpConfig::dead_peer_from_qp(14, 6)
        );
        let so = c.server_options();
        assert_eq!(so.max_connections, 1024);
        assert_eq!(so.max_in_flight, 256);
        assert_eq!(so.max_frame_bytes, proto::DEFAULT_MAX_FRAME_BYTES);
        assert_eq!(so.frame_timeout, Duration::from_secs(10));
        assert_eq!(so.idle_timeout, Duration::from_secs(300));
        assert_eq!(so.append_timeout, Duration::from_secs(10));
        assert_eq!(so.anonymous_role, Some(Role::ReadOnly));
        assert!(so.tls.is_none() && so.metrics_listen.is_none());
        assert!(so.retention.is_unlimited());
        assert_eq!(so.retention_interval, Duration::from_secs(10));
        let members: Vec<_> = so
            .members
            .iter()
            .map(|m| (m.id, m.client_addr.as_str()))
            .collect();
        assert_eq!(members, [(1, "192.0.2.11:7600"), (2, "192.0.2.12:7600")]);

        let set = GOOD
            .replace(
                "node_id = 1",
                "node_id = 1\ndurability = \"replicated\"\nring_mib = 16\nsegment_mib = 128\nring_dir = \"/run/rdmalog\"",
            )
            .replace(
                "listen = \"192.0.2.11:7700\"",
                "listen = \"192.0.2.11:7700\"\nqp_timeout = 12\nqp_retry = 3",
            )
            .replace(
                "plaintext = true",
                "plaintext = true\nmax_connections = 10\nmax_in_flight = 5\nframe_timeout_ms = 1000\nidle_timeout_ms = 2000\nappend_timeout_ms = 3000",
            )
            + "[raft]\ntick_ms = 5\nelection_ticks = 30\nheartbeat_ticks = 4\nbroadcast_commit = true\n[poll]\nmode = \"busy\"\npin_core = 2\n[metrics]\nlisten = \"127.0.0.1:9100\"\n[retention]\nmax_entries = 1000\ninterval_ms = 500\n";
        let c = ServerConfig::parse(&set, "t.toml").unwrap();
        let r = c.replica_config();
        assert_eq!(r.durability, replica::Durability::Replicated);
        assert_eq!((r.ring_bytes, r.segment_bytes), (16 << 20, 128 << 20));
        assert_eq!(r.ring_dir, PathBuf::from("/run/rdmalog"));
        assert_eq!((r.election_tick, r.heartbeat_tick), (30, 4));
        assert!(r.broadcast_commit);
        let o = c.log_options();
        assert_eq!(o.tick, Duration::from_millis(5));
        assert_eq!((o.poll, o.pin_core), (replica::PollMode::Busy, Some(2)));
        assert_eq!(c.rdma_config().qp.timeout, 12);
        assert_eq!(c.rdma_config().qp.retry_cnt, 3);
        let so = c.server_options();
        assert_eq!((so.max_connections, so.max_in_flight), (10, 5));
        assert_eq!(so.frame_timeout, Duration::from_secs(1));
        assert_eq!(so.idle_timeout, Duration::from_secs(2));
        assert_eq!(so.append_timeout, Duration::from_secs(3));
        assert_eq!(so.metrics_listen, Some("127.0.0.1:9100".parse().unwrap()));
        assert_eq!(so.retention.max_entries, Some(1000));
        assert_eq!(so.retention_interval, Duration::from_millis(500));
        assert_eq!(so.members[0].client_addr, "192.0.2.11:7600");
    }

    #[test]
    fn token_files_must_be_the_owners_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("writer.token");
        std::fs::write(&path, "writer-token-0123456789\n").unwrap();
        let text = format!(
            "{GOOD}\n[auth]\n[[auth.tokens]]\ntoken_file = \"{}\"\nrole = \"read-write\"\n",
            path.display()
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ServerConfig::parse(&text, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`auth.tokens[0].token_file`") && e.contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = ServerConfig::parse(&text, "t.toml").unwrap();
        assert_eq!(
            c.tokens.get("writer-token-0123456789"),
            Some(&Role::ReadWrite)
        );
        // A comment line, or a space inside, would become part of the token.
        for body in [
            "# the writers' token\nwriter-token-0123456789\n",
            "writer-token 0123456789\n",
        ] {
            std::fs::write(&path, body).unwrap();
            let e = ServerConfig::parse(&text, "t.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains("more than one word"), "{e}");
        }
    }

    /// The client port's private key must be its owner's only, as the secret and the token
    /// files: refused by the configuration check (so by `--check-config` and at start),
    /// naming `[tls]` and the remedy.
    #[test]
    fn a_client_tls_key_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let params = rcgen::CertificateParams::new(vec!["192.0.2.11".to_string()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (c, k) = (dir.path().join("server.crt"), dir.path().join("server.key"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        let text = GOOD.replace("plaintext = true", "").replace(
            "[client]",
            &format!(
                "[tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[client]",
                c.display(),
                k.display()
            ),
        );
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ServerConfig::parse(&text, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`tls`") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).unwrap();
        ServerConfig::parse(&text, "t.toml").unwrap();
    }

    #[test]
    fn errors_name_the_bad_key() {
        let cases = [
            (GOOD.replace("plaintext = true", ""), "`tls`"),
            (GOOD.replace("\"0x1ab\"", "\"0xzz\""), "`cluster_id`"),
            (
                GOOD.replace("node_id = 1", "node_id = 1\ndurability = \"disk\""),
                "`durability`: unknown durability \"disk\": expected \"fsync\", \"memory\" or \"replicated\"",
            ),
            (GOOD.replace("id = 2", "id = 1"), "`peers[0].id`"),
            (
                GOOD.replace("plaintext = true", "plaintext = true\nmax_frame_bytes = 1"),
                "`client.max_frame_bytes`",
            ),
            (
                GOOD.replace("node_id = 1", "node_id = 1\nring_mib = 3"),
                "`ring_mib`",
            ),
            (
                GOOD.replace("[client]", "[client]\nbogus = 1"),
                "unknown field `bogus`",
            ),
            (
                GOOD.replace("node_id = 1", "node_id = 1\ntransport = \"udp\""),
                "`transport`: `udp` is not a transport: use rdma or tcp",
            ),
            (
                GOOD.replace("node_id = 1", "node_id = 1\ntransport = \"tcp\"")
                    .replace("[rdma]", "[rdma]\ndevice = \"mlx5_0\""),
                "`rdma.device`",
            ),
            (
                GOOD.replace(
                    "[client]",
                    "[peer_tls]\ncert = \"/etc/hosts\"\nkey = \"/etc/hosts\"\nca = \"/etc/hosts\"\n\n[client]",
                ),
                "`peer_tls`: TLS on peer links needs transport = \"tcp\"",
            ),
            (
                GOOD.replace("node_id = 1", "node_id = 1\ntransport = \"tcp\"")
                    .replace(
                        "[client]",
                        "[peer_tls]\ncert = \"/nonexistent/n1.crt\"\nkey = \"/etc/hosts\"\nca = \"/etc/hosts\"\n\n[client]",
                    ),
                "`peer_tls.cert`: /nonexistent/n1.crt is not a readable file",
            ),
            (
                GOOD.replace("node_id = 1", "node_id = 1\ntransport = \"tcp\"")
                    .replace(
                        "[client]",
                        "[peer_tls]\ncert = \"/etc/hosts\"\nkey = \"/etc/hosts\"\nca = \"/etc/hosts\"\n\n[client]",
                    ),
                "`peer_tls`: TLS: /etc/hosts: holds no PEM certificate",
            ),
            (
                GOOD.replace("client = \"192.0.2.12:7600\"", "client = \"192.0.2.12:7600\"\ntls_name = \"n2\""),
                "`peers[0].tls_name`: names a TLS certificate, but there is no [peer_tls] section",
            ),
            (
                format!("{GOOD}\n[retention]\nmax_bytes = 0\n"),
                "`retention.max_bytes`: must be positive",
            ),
            (
                format!("{GOOD}\n[retention]\nmax_days = 7\n"),
                "unknown field `max_days`",
            ),
            (
                GOOD.replace("plaintext = true", "plaintext = true\nidle_timeout_ms = 500"),
                "`client.idle_timeout_ms`: must be at least 1000",
            ),
            (
                GOOD.replace("plaintext = true", "plaintext = true\nframe_timeout_ms = 0"),
                "`client.frame_timeout_ms`: must be positive",
            ),
            (
                GOOD.replace("plaintext = true", "plaintext = true\nappend_timeout_ms = 0"),
                "`client.append_timeout_ms`: must be positive",
            ),
            // Read by the check itself, so `--check-config` catches them.
            (
                GOOD.replace("plaintext = true", "")
                    .replace("[client]", "[tls]\ncert = \"/etc/hosts\"\nkey = \"/etc/hosts\"\n\n[client]"),
                "`tls`: ",
            ),
            (
                GOOD.replace("[rdma]", "[rdma]\nsecret_file = \"/nonexistent/secret\""),
                "`rdma.secret_file`: ",
            ),
            // Clients would be told to connect to the wildcard, or to nothing.
            (
                GOOD.replace("advertise = \"192.0.2.11:7600\"\n", ""),
                "`client.advertise`: client.listen is 0.0.0.0:7600",
            ),
            (
                GOOD.replace("client = \"192.0.2.12:7600\"", "client = \"host:\""),
                "`peers[0].client`: expected host:port",
            ),
            (
                GOOD.replace("192.0.2.11:7600", "node-a:70OO"),
                "`client.advertise`: expected host:port",
            ),
            // What the node refused only at start, after binding its peer port.
            (
                format!("{GOOD}\n[raft]\ntick_ms = 70000\n"),
                "`raft.tick_ms`: ",
            ),
            // Over TCP, a dead-peer bound of 8 us: every healthy link would break.
            (
                GOOD.replace("node_id = 1", "node_id = 1\ntransport = \"tcp\"")
                    .replace("[rdma]", "[rdma]\nqp_timeout = 1\nqp_retry = 0"),
                "`rdma.qp_timeout`: with qp_retry, an operation unanswered for 8.192µs",
            ),
            // Soft-RoCE retries forever at 7: a dead peer would never be detected.
            (
                GOOD.replace("[rdma]", "[rdma]\nqp_retry = 7"),
                "`rdma.qp_retry`: expected 0..=6, not 7 (Soft-RoCE retries forever",
            ),
        ];
        for (text, want) in cases {
            let e = ServerConfig::parse(&text, "t.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e} should mention {want}");
            assert!(e.starts_with("t.toml: "), "{e}");
        }
        // What only the replica's own check refuses, named by the file's key: more members
        // than a cluster may have (1,024 peers and this node).
        let many: String = (2..=1025u64)
            .map(|id| {
                format!(
                    "[[peers]]\nid = {id}\nrdma = \"192.0.2.1:{id}\"\nclient = \"192.0.2.2:{id}\"\n"
                )
            })
            .collect();
        let text = GOOD.replace(
            "[[peers]]\nid = 2\nrdma = \"192.0.2.12:7700\"\nclient = \"192.0.2.12:7600\"\n",
            &many,
        );
        assert_ne!(text, GOOD);
        let e = ServerConfig::parse(&text, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`peers`") && e.contains("at most 1024 voters"),
            "{e}"
        );
        // A syntax error names the line the bad key is on (it said the line before).
        let text = GOOD.replace("[client]", "[client]\nbogus = 1");
        let line = text.lines().position(|l| l.starts_with("bogus")).unwrap() + 1;
        let e = ServerConfig::parse(&text, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("line {line}")), "{e}: not line {line}");
    }
}
