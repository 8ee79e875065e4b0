//! Tool implementations, one file per toolset.

pub mod commands;
pub mod execute;
pub mod inspect;
pub mod manage;
pub mod teardown;
mod wait;

/// The rules every batch follows: 1–100 operations, and `on_error` is `stop`
/// (the default) or `continue`. Returns whether to stop at the first error.
pub fn batch_rules(
    len: usize,
    on_error: Option<super::choices::OnError>,
) -> Result<bool, super::error::ToolError> {
    use super::error::ToolError;
    if len == 0 || len > 100 {
        return Err(ToolError::invalid(
            "operations",
            "must hold 1-100 operations",
            "split it into several batches",
        ));
    }
    Ok(on_error.unwrap_or_default() == super::choices::OnError::Stop)
}
