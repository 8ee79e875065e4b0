//! sandmux: a terminal an AI agent cannot escape.
//!
//! The library holds everything the `sandmux` binary does; its one public
//! entry is the command line ([`cli::main`]). Inside: profiles (`profile`),
//! the sandbox and its start-up order (`sandbox`), the tmux server it owns
//! (`tmux`), `serve`'s running instance (`runtime`), the MCP server (`mcp`), the allowlist proxy (`proxy`) and the
//! live enforcement check (`check`). Everything else is `pub(crate)`;
//! [`testing`] re-exports what the integration tests and fuzz targets drive
//! directly.

#![warn(missing_docs)]

pub(crate) mod attach;
pub(crate) mod audit;
pub(crate) mod check;
pub mod cli;
pub(crate) mod confine;
pub(crate) mod door;
pub(crate) mod entrypoint;
pub(crate) mod guard;
#[allow(dead_code)]
mod layers;
pub(crate) mod log;
pub(crate) mod mcp;
pub(crate) mod nonce;
pub(crate) mod operator;
pub(crate) mod otlp;
pub(crate) mod profile;
pub(crate) mod proxy;
pub(crate) mod runtime;
pub(crate) mod sandbox;
pub(crate) mod secretcmd;
pub(crate) mod secretfile;
pub(crate) mod supervisor;
pub(crate) mod tables;
pub(crate) mod term;
#[cfg(test)]
mod text_decisions_tests;
pub(crate) mod tmux;
pub(crate) mod tracectx;

/// What the integration tests and the fuzz targets drive directly: the byte
/// parsers (control mode, the replay filter, the proxy's request heads and
/// ClientHellos), the proxy's matcher and address classifier, the tmux
/// command builder, the layer names, and tmux's lookup.
pub mod testing {
    pub use crate::profile::Layer;
    pub use crate::proxy::{addr, head, hello, name};
    pub use crate::runtime::replay_filter;
    pub use crate::tmux::cmd::Cmd;
    pub use crate::tmux::control;
    pub use crate::tmux::find_tmux;
}
