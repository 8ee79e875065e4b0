//! The running instance under `sandmux serve`, apart from the MCP protocol
//! that drives it: approvals and their rounds, OOM kills, the workspace
//! guard's reverts, exit signals, the recording and its replay filter,
//! where the host files (audit log, recording) may go, freeze and thaw,
//! exposed ports, and the state they share ([`shared::Shared`]).
//!
//! Its layer sits between `supervisor` (an instance's life on the host) and
//! `mcp` (tools, schemas, transports): `mcp` uses it, it never names `mcp`.
//! What it needs of the protocol (the catalog's tool names) is handed in.

pub(crate) mod approvals;
pub(crate) mod endpoint;
pub(crate) mod exit;
pub(crate) mod expose;
pub(crate) mod freeze;
pub(crate) mod generation;
pub(crate) mod hostfiles;
pub(crate) mod oom;
pub(crate) mod proxy;
pub(crate) mod record;
pub mod replay_filter;
pub(crate) mod reverts;
pub(crate) mod rewind;
pub(crate) mod rounds;
pub(crate) mod shared;
pub(crate) mod teardown;
