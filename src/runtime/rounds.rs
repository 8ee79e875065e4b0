//! Questions held between the rounds of a multi round-trip request
//! (protocol 2026-07-28, which has no requests from server to client): a
//! tool call that asks a human answers `input_required` with an
//! elicitation, and the client calls again with the answer and the
//! `requestState` it was given. The question lives here, on the server;
//! `requestState` is only its handle: 128 random bits, good for one retry
//! of the same tool with the same arguments. Anything else the client
//! echoes finds nothing, so a forged or replayed state can never be a
//! grant. The question itself is asked through `approvals` (the operator
//! can answer it meanwhile; the first answer wins; silence denies), so
//! its task ends by `[mcp] ask_seconds` and a held entry no one came back
//! for is dropped after it.

use super::approvals::{Answer, ApprovalError, Grant};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Questions still waiting at once (the approvals' own bound is lower).
const MAX_WAITING: usize = 64;
/// Entries in all, those whose question ended (waiting for the client's
/// retry to collect the outcome) included; the oldest ended go first.
const MAX_HELD: usize = 256;

/// The question's outcome, as `approvals` gives it.
pub(crate) type Outcome = Result<Grant, RoundsError>;

/// Why a call asked in rounds does not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RoundsError {
    /// The question's own outcome.
    #[error(transparent)]
    Approval(#[from] ApprovalError),
    /// [`MAX_WAITING`] questions wait for a client's answer.
    #[error("{MAX_WAITING} questions already wait for a client's answer")]
    Waiting,
    /// [`MAX_HELD`] questions are held, none of them over.
    #[error("{MAX_HELD} questions are held")]
    Held,
    /// The retry names no question open here for this call.
    #[error("the question this call answers is not open here (answered, timed out, or asked for another call); call again without requestState to be asked")]
    NotOpen,
    /// The question's task ended without an outcome.
    #[error("the question ended without an answer")]
    Ended,
}

/// A question asked in an earlier round.
struct Held {
    tool: &'static str,
    /// The arguments' digest: a once runs this call only.
    args: [u8; 32],
    /// The request id of the round that asked.
    asked_by: String,
    /// Hands the client's answer (or none) to the question.
    answer: oneshot::Sender<Option<Answer>>,
    /// The question's outcome.
    outcome: Task,
    made: Instant,
}

/// The question's task, stopped when dropped: a retry the client cancels,
/// an entry dropped, or a freeze ends the asking (the question is then
/// withdrawn, on the record, by `approvals`).
struct Task(tokio::task::JoinHandle<Outcome>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The held questions of an instance.
pub(crate) struct Rounds {
    held: Mutex<HashMap<String, Held>>,
    /// How long a held entry is kept: `[mcp] ask_seconds` and a margin for
    /// the client's round trip.
    keep: Duration,
}

/// The digest a held question is bound to.
pub(crate) fn digest(tool: &str, args: &serde_json::Value) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(tool.as_bytes());
    h.update([0]);
    // serde_json's map is ordered by key: the same arguments, the same bytes.
    h.update(serde_json::to_vec(args).unwrap_or_default());
    h.finalize().into()
}

impl Rounds {
    /// Entries kept `ask` plus a minute.
    pub(crate) fn new(ask: Duration) -> Rounds {
        Rounds {
            held: Mutex::default(),
            keep: ask + Duration::from_secs(60),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        let mut m = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let keep = self.keep;
        m.retain(|_, h| h.made.elapsed() < keep);
        m
    }

    /// Asks: `ask` gets the client's answer as a future and runs until the
    /// question ends. Returns the handle to give the client, or the outcome
    /// when the question ended at once (a standing grant, a refusal).
    pub(crate) async fn open<F>(
        &self,
        tool: &'static str,
        args: [u8; 32],
        asked_by: &str,
        ask: impl FnOnce(Pin<Box<dyn Future<Output = Option<Answer>> + Send>>) -> F,
    ) -> Result<String, Outcome>
    where
        F: Future<Output = Outcome> + Send + 'static,
    {
        if let Err(why) = self.room() {
            return Err(Err(why));
        }
        let (tx, rx) = oneshot::channel();
        let mut q = Box::pin(ask(Box::pin(async move { rx.await.ok().flatten() })));
        // Polled once here: a question that needs no human ends at once.
        tokio::select! {
            biased;
            o = &mut q => return Err(o),
            () = std::future::ready(()) => {}
        }
        let handle = crate::nonce::hex();
        let held = Held {
            tool,
            args,
            asked_by: asked_by.to_string(),
            answer: tx,
            outcome: Task(tokio::spawn(q)),
            made: Instant::now(),
        };
        self.lock().insert(handle.clone(), held);
        Ok(handle)
    }

    /// Whether one more question may be held: at most [`MAX_WAITING`]
    /// still waiting, and room among all (the oldest ended dropped first).
    fn room(&self) -> Result<(), RoundsError> {
        let mut m = self.lock();
        if m.values().filter(|h| !h.outcome.0.is_finished()).count() >= MAX_WAITING {
            return Err(RoundsError::Waiting);
        }
        while m.len() >= MAX_HELD {
            let oldest = m
                .iter()
                .filter(|(_, h)| h.outcome.0.is_finished())
                .min_by_key(|(_, h)| h.made)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => m.remove(&k),
                None => return Err(RoundsError::Held),
            };
        }
        Ok(())
    }

    /// Drops every held question (a freeze: an answer given before it is
    /// not carried past it; the client asks again after the thaw).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// The retry: hands over the client's answer and waits for the
    /// question's outcome. A handle not held, or held for another call,
    /// is no answer at all.
    /// Also gives the request id of the round that asked.
    pub(crate) async fn answer(
        &self,
        handle: &str,
        tool: &str,
        args: [u8; 32],
        answer: Option<Answer>,
    ) -> (Outcome, Option<String>) {
        let held = {
            let mut m = self.lock();
            match m.get(handle) {
                Some(h) if h.tool == tool && h.args == args => m.remove(handle),
                _ => None,
            }
        };
        let Some(mut h) = held else {
            return (Err(RoundsError::NotOpen), None);
        };
        let _ = h.answer.send(answer);
        // Dropped with this future (a cancelled retry), `h` stops the task.
        let outcome = (&mut h.outcome.0).await.unwrap_or(Err(RoundsError::Ended));
        (outcome, Some(std::mem::take(&mut h.asked_by)))
    }
}
