//! Devices, ports, attributes and GID selection.
//!
//! Devices are opened through `rdma_get_devices`, so the `ibv_context` a [`Context`] wraps is
//! the very context librdmacm binds connections to: a PD allocated here is usable on a QP
//! for an rdma_cm connection on the same device (checked at connect time).

use std::net::Ipv4Addr;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::sys;

/// The array `rdma_get_devices` returns. librdmacm owns the contexts in it; we keep the array
/// (and so the contexts' registration with librdmacm) until the last [`Context`] is dropped.
#[derive(Debug)]
struct DeviceList {
    list: *mut *mut sys::ibv_context,
}

// SAFETY: the list is an immutable array of context pointers after creation; ibv_context is
// thread-safe per libibverbs' threading rules, and only `Drop` frees the array.
unsafe impl Send for DeviceList {}
// SAFETY: as above, nothing mutates the array through a shared reference.
unsafe impl Sync for DeviceList {}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from rdma_get_devices and is freed exactly once, here, after
        // every Context holding this Arc is gone.
        unsafe { sys::rdma_free_devices(self.list) };
    }
}

fn device_list() -> Result<(Arc<DeviceList>, Vec<*mut sys::ibv_context>)> {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the returned array is owned by DeviceList below.
    let list = unsafe { sys::rdma_get_devices(&mut n) };
    if list.is_null() {
        return Err(Error::NoDevices);
    }
    let owner = Arc::new(DeviceList { list });
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n.max(0) as usize {
        // SAFETY: rdma_get_devices returned an array of `n` context pointers (plus a NULL
        // terminator), alive while `owner` lives.
        let ctx = unsafe { *list.add(i) };
        if !ctx.is_null() {
            out.push(ctx);
        }
    }
    if out.is_empty() {
        return Err(Error::NoDevices);
    }
    Ok((owner, out))
}

/// # Safety
/// `ctx` must be a live `ibv_context`.
unsafe fn context_name(ctx: *mut sys::ibv_context) -> String {
    // SAFETY: a live context points at its ibv_device, whose `name` is a NUL-terminated array.
    unsafe { sys::cstr((*(*ctx).device).name.as_ptr()) }
}

/// A short description of one device, for listing.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Device name, e.g. `rxe1` or `mlx5_0`.
    pub name: String,
    /// Device attributes.
    pub attributes: DeviceAttributes,
    /// One entry per port, port 1 first.
    pub ports: Vec<PortAttributes>,
}

/// Lists every RDMA device with its attributes and ports. Returns [`Error::NoDevices`] on a
/// host without RDMA.
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let (owner, ctxs) = device_list()?;
    let mut out = Vec::with_capacity(ctxs.len());
    for ctx in ctxs {
        let c = Context {
            _list: owner.clone(),
            ctx,
            name: String::new(),
        };
        // SAFETY: `ctx` is live while `owner` lives.
        let name = unsafe { context_name(ctx) };
        let c = Context { name, ..c };
        let attributes = c.query_device()?;
        let mut ports = Vec::new();
        for p in 1..=attributes.phys_port_cnt {
            ports.push(c.query_port(p)?);
        }
        out.push(DeviceInfo {
            name: c.name.clone(),
            attributes,
            ports,
        });
    }
    Ok(out)
}

/// An open RDMA device (an `ibv_context`). Cheap to share as `Arc<Context>`.
#[derive(Debug)]
pub struct Context {
    /// Keeps librdmacm's device array alive as long as this context is used.
    _list: Arc<DeviceList>,
    ctx: *mut sys::ibv_context,
    name: String,
}

// SAFETY: libibverbs contexts are thread-safe (all verbs on a context may be called from any
// thread); we never mutate the struct through the pointer.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

/// Device attributes this project uses.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAttributes {
    /// Most WRs per queue.
    pub max_qp_wr: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Most CQ entries.
    pub max_cqe: u32,
    /// Most outstanding RDMA reads/atomics as target.
    pub max_qp_rd_atom: u8,
    /// Most outstanding RDMA reads/atomics as initiator.
    pub max_qp_init_rd_atom: u8,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Most memory regions.
    pub max_mr: u32,
}

/// State of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// No link.
    Down,
    /// Link up, not yet initialised.
    Init,
    /// Armed.
    Armed,
    /// Usable.
    Active,
    /// Any other value the kernel reports.
    Other(u32),
}

impl PortState {
    pub(crate) fn from_raw(v: u32) -> Self {
        use sys::ibv_port_state as s;
        match v {
            s::IBV_PORT_DOWN => PortState::Down,
            s::IBV_PORT_INIT => PortState::Init,
            s::IBV_PORT_ARMED => PortState::Armed,
            s::IBV_PORT_ACTIVE => PortState::Active,
            o => PortState::Other(o),
        }
    }
}

/// Port attributes this project uses.
#[derive(Debug, Clone, Copy)]
pub struct PortAttributes {
    /// Port number (1-based).
    pub port: u8,
    /// Link state.
    pub state: PortState,
    /// Active path MTU.
    pub active_mtu: crate::Mtu,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// 1 = InfiniBand, 2 = Ethernet (RoCE).
    pub link_layer: u8,
}

/// Kind of a GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet, no IP header).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
    /// Unknown value.
    Other(u32),
}

impl GidType {
    /// Maps `enum ibv_gid_type`.
    pub fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_GID_TYPE_IB => GidType::Ib,
            sys::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            sys::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            o => GidType::Other(o),
        }
    }
}

/// One GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's GID table (what perftest's `-x` takes).
    pub index: u32,
    /// The 16 raw GID bytes.
    pub gid: [u8; 16],
    /// Its type.
    pub gid_type: GidType,
}

/// Picks the RoCE v2 GID whose value is the IPv4-mapped form (`::ffff:a.b.c.d`) of `ip`.
/// Pure selection logic over a queried table; never assumes an index.
pub fn select_roce_v2_gid(table: &[GidEntry], ip: Ipv4Addr) -> Option<GidEntry> {
    let mut want = [0u8; 16];
    want[10] = 0xff;
    want[11] = 0xff;
    want[12..].copy_from_slice(&ip.octets());
    table
        .iter()
        .copied()
        .find(|e| e.gid_type == GidType::RoceV2 && e.gid == want)
}

impl Context {
    /// Opens the device named `name` (e.g. `rxe1`, `mlx5_0`).
    pub fn open(name: &str) -> Result<Arc<Context>> {
        let (owner, ctxs) = device_list()?;
        let mut names = Vec::new();
        for ctx in ctxs {
            // SAFETY: `ctx` is live while `owner` lives.
            let n = unsafe { context_name(ctx) };
            if n == name {
                return Ok(Arc::new(Context {
                    _list: owner,
                    ctx,
                    name: n,
                }));
            }
            names.push(n);
        }
        Err(Error::DeviceNotFound {
            name: name.to_owned(),
            present: names.join(", "),
        })
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_context {
        self.ctx
    }

    /// Queries device attributes.
    pub fn query_device(&self) -> Result<DeviceAttributes> {
        let mut a = std::mem::MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: `ctx` is live (we hold the list); `a` is a writable ibv_device_attr.
        let rc = unsafe { sys::ibv_query_device(self.ctx, a.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::verbs("ibv_query_device", &self.name, 0, "-", rc));
        }
        // SAFETY: ibv_query_device returned 0, so it filled the struct (and it was zeroed).
        let a = unsafe { a.assume_init() };
        Ok(DeviceAttributes {
            max_qp_wr: a.max_qp_wr.max(0) as u32,
            max_sge: a.max_sge.max(0) as u32,
            max_cqe: a.max_cqe.max(0) as u32,
            max_qp_rd_atom: a.max_qp_rd_atom.clamp(0, 255) as u8,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom.clamp(0, 255) as u8,
            phys_port_cnt: a.phys_port_cnt,
            max_mr: a.max_mr.max(0) as u32,
        })
    }

    /// Queries one port (1-based).
    pub fn query_port(&self, port: u8) -> Result<PortAttributes> {
        let mut a = std::mem::MaybeUninit::<sys::ibv_port_attr>::zeroed();
        // SAFETY: `ctx` is live; `a` is a zeroed, writable ibv_port_attr of the size the
        // extended query expects (rdma-sys' wrapper passes size_of_val).
        let rc = unsafe { sys::___ibv_query_port(self.ctx, port, a.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::verbs("ibv_query_port", &self.name, port, "-", rc));
        }
        // SAFETY: the query succeeded, so the struct is filled (and was zeroed before).
        let a = unsafe { a.assume_init() };
        Ok(PortAttributes {
            port,
            state: PortState::from_raw(a.state),
            active_mtu: crate::Mtu::from_raw(a.active_mtu),
            gid_tbl_len: a.gid_tbl_len.max(0) as u32,
            link_layer: a.link_layer,
        })
    }

    /// Reads the port's whole GID table, with each entry's type (empty slots are skipped).
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        let pa = self.query_port(port)?;
        let mut out = Vec::new();
        for index in 0..pa.gid_tbl_len {
            let mut e = std::mem::MaybeUninit::<sys::ibv_gid_entry>::zeroed();
            // SAFETY: `ctx` is live; `e` is a writable ibv_gid_entry and we pass its size, as
            // the static inline ibv_query_gid_ex in verbs.h does.
            let rc = unsafe {
                sys::_ibv_query_gid_ex(
                    self.ctx,
                    u32::from(port),
                    index,
                    e.as_mut_ptr(),
                    0,
                    std::mem::size_of::<sys::ibv_gid_entry>(),
                )
            };
            if rc != 0 {
                // Empty or unused slots return ENODATA/EINVAL: skip them.
                continue;
            }
            // SAFETY: the query succeeded and filled the entry.
            let e = unsafe { e.assume_init() };
            // SAFETY: `raw` is the union's plain-bytes view, valid for any bit pattern.
            let gid = unsafe { e.gid.raw };
            out.push(GidEntry {
                index: e.gid_index,
                gid,
                gid_type: GidType::from_raw(e.gid_type),
            });
        }
        Ok(out)
    }

    /// Finds the RoCE v2 GID index for `ip` on `port` by querying the GID table.
    pub fn roce_v2_gid_index(&self, port: u8, ip: Ipv4Addr) -> Result<u32> {
        let table = self.gid_table(port)?;
        select_roce_v2_gid(&table, ip)
            .map(|e| e.index)
            .ok_or(Error::NoRoceV2Gid {
                device: self.name.clone(),
                port,
                ip,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(ip: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&ip);
        g
    }

    #[test]
    fn gid_selection_picks_roce_v2_mapped_entry_by_value_not_index() {
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        let table = [
            GidEntry {
                index: 0,
                gid: link_local,
                gid_type: GidType::RoceV1,
            },
            GidEntry {
                index: 1,
                gid: link_local,
                gid_type: GidType::RoceV2,
            },
            GidEntry {
                index: 2,
                gid: mapped([192, 0, 2, 11]),
                gid_type: GidType::RoceV1,
            },
            GidEntry {
                index: 3,
                gid: mapped([192, 0, 2, 11]),
                gid_type: GidType::RoceV2,
            },
            GidEntry {
                index: 5,
                gid: mapped([192, 0, 2, 12]),
                gid_type: GidType::RoceV2,
            },
        ];
        assert_eq!(
            select_roce_v2_gid(&table, Ipv4Addr::new(192, 0, 2, 11))
                .unwrap()
                .index,
            3
        );
        assert_eq!(
            select_roce_v2_gid(&table, Ipv4Addr::new(192, 0, 2, 12))
                .unwrap()
                .index,
            5
        );
        assert!(select_roce_v2_gid(&table, Ipv4Addr::new(192, 0, 2, 13)).is_none());
        // A v1 entry with the right address never qualifies.
        assert!(select_roce_v2_gid(&table[..3], Ipv4Addr::new(192, 0, 2, 11)).is_none());
    }

    #[test]
    fn gid_type_and_port_state_mappings() {
        assert_eq!(GidType::from_raw(0), GidType::Ib);
        assert_eq!(GidType::from_raw(1), GidType::RoceV1);
        assert_eq!(GidType::from_raw(2), GidType::RoceV2);
        assert_eq!(GidType::from_raw(9), GidType::Other(9));
        assert_eq!(
            PortState::from_raw(sys::ibv_port_state::IBV_PORT_ACTIVE),
            PortState::Active
        );
        assert_eq!(
            PortState::from_raw(sys::ibv_port_state::IBV_PORT_DOWN),
            PortState::Down
        );
    }
}
