//! The one wait loop. Every call that waits (for pane output, for quiet, for
//! text to go, for a command's end) waits through a [`Wait`], which ends the
//! wait when its deadline passes, the client cancels the call or the
//! instance ends, and meanwhile reports progress every two seconds.

use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::tmux::client::TmuxError;
use std::future::Future;
use std::time::{Duration, Instant};
use tokio::time::Interval;

/// What ended one step of a wait.
pub(crate) enum Woke<T> {
    /// The awaited event, with its value.
    Event(T),
    /// The deadline passed first.
    Deadline,
}

/// A wait under way: its deadline, and the call it belongs to (none for a
/// command followed in the background).
pub(crate) struct Wait<'a> {
    call: Option<&'a Call<'a>>,
    cancelled: &'static str,
    deadline: tokio::time::Instant,
    progress: Option<(&'static str, Interval)>,
    t0: Instant,
    total: f64,
}

/// The error of a wait the instance's end interrupted.
fn ending() -> ToolError {
    ToolError::Tmux(TmuxError::Closed(
        crate::tmux::closing::Closing::InstanceEnding,
    ))
}

impl<'a> Wait<'a> {
    /// A call's wait of at most `timeout`.
    pub(crate) fn call(c: &'a Call<'a>, timeout: Duration) -> Wait<'a> {
        Wait {
            call: Some(c),
            cancelled: "cancelled by the client",
            deadline: tokio::time::Instant::now() + timeout,
            progress: None,
            t0: Instant::now(),
            total: timeout.as_secs_f64(),
        }
    }

    /// A wait no call holds, until `deadline` only.
    pub(crate) fn background(deadline: tokio::time::Instant) -> Wait<'a> {
        Wait {
            call: None,
            cancelled: "",
            deadline,
            progress: None,
            t0: Instant::now(),
            total: 0.0,
        }
    }

    /// Reports progress every two seconds, saying `what`.
    pub(crate) fn progress(mut self, what: &'static str) -> Wait<'a> {
        let every = Duration::from_secs(2);
        let first = tokio::time::Instant::now() + every;
        self.progress = Some((what, tokio::time::interval_at(first, every)));
        self
    }

    /// What the error says when the client cancels the call.
    pub(crate) fn cancel_says(mut self, message: &'static str) -> Wait<'a> {
        self.cancelled = message;
        self
    }

    /// Seconds since the wait began.
    pub(crate) fn elapsed(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// The timeout in force, in seconds.
    pub(crate) fn total(&self) -> f64 {
        self.total
    }

    /// Waits for `event`, or the deadline; fails when the client cancels
    /// or the instance ends.
    pub(crate) async fn until<F: Future>(
        &mut self,
        event: F,
    ) -> Result<Woke<F::Output>, ToolError> {
        tokio::pin!(event);
        loop {
            tokio::select! {
                v = &mut event => return Ok(Woke::Event(v)),
                _ = tokio::time::sleep_until(self.deadline) => return Ok(Woke::Deadline),
                _ = cancelled(self.call) => return Err(ToolError::Internal(self.cancelled.into())),
                _ = ended(self.call) => return Err(ending()),
                what = tick(&mut self.progress) => {
                    if let Some(c) = self.call {
                        c.progress(self.t0.elapsed().as_secs_f64(), Some(self.total), what).await;
                    }
                }
            }
        }
    }
}

async fn cancelled(call: Option<&Call<'_>>) {
    match call {
        Some(c) => c.ct.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn ended(call: Option<&Call<'_>>) {
    match call {
        Some(c) => c.s.shutdown.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn tick(progress: &mut Option<(&'static str, Interval)>) -> &'static str {
    match progress {
        Some((what, every)) => {
            every.tick().await;
            what
        }
        None => std::future::pending().await,
    }
}
