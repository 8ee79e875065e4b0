//! `[network] ask`: a name not on the allow list is not refused at once;
//! the connection is held while a human is asked (the asker is the host
//! side's, `crate::runtime::approvals`: it bounds the questions and the wait,
//! and silence denies). Only a name is askable: an IP literal or a bad head
//! is refused as before, without a question. The name is asked about
//! before it is resolved (resolving every name off the list would be a way
//! out through DNS): one that resolves to a refused range is refused after
//! the approval, by its address. A client that goes away stops waiting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A human's answer for one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// This connection may go (once, or the name for the instance).
    Allow,
    /// Refused, and why (sandmux's words: a human declined, no answer in
    /// time, too many open questions).
    Deny(String),
}

/// Asks about `scheme://host:port` (`https` for a tunnel, `http` for a
/// plain request); resolves when answered (or denied).
pub(crate) type Asker = Arc<
    dyn Fn(&'static str, String, u16) -> Pin<Box<dyn Future<Output = Verdict> + Send>>
        + Send
        + Sync,
>;

/// What the proxy may use besides its configuration: the credentials it
/// puts in, and who it asks about names off the list.
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    /// `[[credentials]]`.
    pub vault: Option<Arc<super::credentials::Vault>>,
    /// `[network] ask`.
    pub ask: Option<Asker>,
}
