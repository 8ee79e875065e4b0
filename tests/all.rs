//! Every integration test, as a module of one binary: one link step on two
//! cores instead of one a file. Each module is a file of `tests/` named
//! after what it proves (`escape.rs`, `workspace_door.rs`, …); the shared
//! helpers are `common/` and the environments below.

mod common;
#[path = "common/degraded_env.rs"]
mod degraded_env;
#[path = "common/prop.rs"]
mod props;
#[path = "common/replay_spec.rs"]
mod spec;
#[path = "common/workspace_env.rs"]
mod workspace_env;

mod cli;
mod degraded;
mod degraded_calls;
mod door_construction;
mod door_props;
mod door_scale;
mod escape;
mod fuzz_control;
mod fuzz_proxy;
mod replay_filter;
mod run;
mod tmux;
mod workspace;
mod workspace_copy;
mod workspace_cow;
mod workspace_door;
mod workspace_git;
mod workspace_nomount;
mod workspace_strace;
