//! [`Endpoint`]: either real back-end, chosen at run time (`transport = "rdma" | "tcp"`), so a
//! server or node binary is one type whichever transport its configuration names.

use std::sync::Arc;

use crate::rdma::RdmaEndpoint;
use crate::tcp::TcpEndpoint;
use crate::{
    ConnState, Event, Fabric, FabricError, LocalRegion, Memory, NodeId, RemoteRegion, Waiter,
    WriteRequest,
};

/// The transports a deployment can choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// RDMA (RoCE v2, InfiniBand, Soft-RoCE): one-sided writes with no peer CPU.
    Rdma,
    /// Kernel TCP sockets: for machines without RDMA; the peer's I/O thread places writes.
    Tcp,
}

impl std::str::FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rdma" => Ok(Transport::Rdma),
            "tcp" => Ok(Transport::Tcp),
            other => Err(format!("`{other}` is not a transport: use rdma or tcp")),
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
        })
    }
}

/// One node's endpoint on either transport.
#[derive(Debug)]
pub enum Endpoint {
    /// Over RDMA.
    Rdma(RdmaEndpoint),
    /// Over TCP.
    Tcp(TcpEndpoint),
}

impl Endpoint {
    /// The transport in use.
    pub fn transport(&self) -> Transport {
        match self {
            Endpoint::Rdma(_) => Transport::Rdma,
            Endpoint::Tcp(_) => Transport::Tcp,
        }
    }

    /// Why the last connect to `peer` failed, if it did.
    pub fn last_connect_error(&self, peer: NodeId) -> Option<&str> {
        match self {
            Endpoint::Rdma(e) => e.last_connect_error(peer),
            Endpoint::Tcp(e) => e.last_connect_error(peer),
        }
    }

    /// How many connected peers were refused admission.
    pub fn refusals(&self) -> u64 {
        match self {
            Endpoint::Rdma(e) => e.refusals(),
            Endpoint::Tcp(e) => e.refusals(),
        }
    }
}

impl From<RdmaEndpoint> for Endpoint {
    fn from(e: RdmaEndpoint) -> Self {
        Endpoint::Rdma(e)
    }
}

impl From<TcpEndpoint> for Endpoint {
    fn from(e: TcpEndpoint) -> Self {
        Endpoint::Tcp(e)
    }
}

macro_rules! each {
    ($self:ident, $e:ident => $body:expr) => {
        match $self {
            Endpoint::Rdma($e) => $body,
            Endpoint::Tcp($e) => $body,
        }
    };
}

impl Fabric for Endpoint {
    fn node(&self) -> NodeId {
        each!(self, e => e.node())
    }

    fn alloc(&mut self, len_bytes: u64) -> Result<Arc<dyn Memory>, FabricError> {
        each!(self, e => e.alloc(len_bytes))
    }

    fn alloc_persistent(
        &mut self,
        path: &std::path::Path,
        len_bytes: u64,
    ) -> Result<(Arc<dyn Memory>, bool), FabricError> {
        each!(self, e => e.alloc_persistent(path, len_bytes))
    }

    fn free_persistent(&mut self, path: &std::path::Path) -> Result<(), FabricError> {
        each!(self, e => e.free_persistent(path))
    }

    fn register(
        &mut self,
        memory: Arc<dyn Memory>,
    ) -> Result<(LocalRegion, RemoteRegion), FabricError> {
        each!(self, e => e.register(memory))
    }

    fn advertise(&mut self, region: RemoteRegion) {
        each!(self, e => e.advertise(region))
    }

    fn connect(&mut self, peer: NodeId) -> Result<(), FabricError> {
        each!(self, e => e.connect(peer))
    }

    fn disconnect(&mut self, peer: NodeId) {
        each!(self, e => e.disconnect(peer))
    }

    fn conn_state(&self, peer: NodeId) -> ConnState {
        each!(self, e => e.conn_state(peer))
    }

    fn post_write(&mut self, peer: NodeId, wr: WriteRequest) -> Result<(), FabricError> {
        each!(self, e => e.post_write(peer, wr))
    }

    fn post_send(&mut self, peer: NodeId, wr_id: u64, msg: &[u8]) -> Result<(), FabricError> {
        each!(self, e => e.post_send(peer, wr_id, msg))
    }

    fn send_credits(&self, peer: NodeId) -> u32 {
        each!(self, e => e.send_credits(peer))
    }

    fn recv_message(&self, peer: NodeId, slot: u64) -> Result<&[u8], FabricError> {
        each!(self, e => e.recv_message(peer, slot))
    }

    fn repost_recv(&mut self, peer: NodeId, slot: u64) -> Result<(), FabricError> {
        each!(self, e => e.repost_recv(peer, slot))
    }

    fn set_remote_write(&mut self, peer: NodeId, allowed: bool) -> Result<(), FabricError> {
        each!(self, e => e.set_remote_write(peer, allowed))
    }

    fn poll(&mut self, out: &mut [Event]) -> usize {
        each!(self, e => e.poll(out))
    }

    fn waiter(&self) -> Option<Arc<dyn Waiter>> {
        each!(self, e => e.waiter())
    }

    fn failure(&self) -> Option<String> {
        each!(self, e => e.failure())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_parse_and_print() {
        for t in [Transport::Rdma, Transport::Tcp] {
            assert_eq!(t.to_string().parse::<Transport>(), Ok(t));
        }
        let err = "udp".parse::<Transport>().unwrap_err();
        assert!(err.contains("rdma or tcp"), "{err}");
    }
}
