//! sandmux: a terminal an AI agent cannot escape.
//!
//! The library holds everything the `sandmux` binary does: profiles
//! ([`profile`]), the sandbox and its start-up order ([`sandbox`]), the tmux
//! server it owns ([`tmux`]), and the live enforcement check ([`check`]).

#![warn(missing_docs)]

pub mod check;
pub mod entrypoint;
pub mod guard;
pub mod log;
pub mod mcp;
pub mod nonce;
pub mod operator;
pub mod profile;
pub mod proxy;
pub mod sandbox;
pub mod tables;
pub mod term;
pub mod tmux;
