//! Tool implementations, one file per toolset.

pub mod execute;
pub mod inspect;
pub mod manage;
pub mod teardown;
