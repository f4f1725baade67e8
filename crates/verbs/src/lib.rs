//! Safe RDMA Verbs over rdma-sys: devices, PD, MR, CQ, RC QP, rdma_cm. The only crate with unsafe.
