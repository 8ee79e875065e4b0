//! What a human is shown of a question, with this server's catalog: the
//! runtime's [`crate::runtime::approvals::shown`] names a tool only when the
//! catalog has it, and only the protocol layer knows the catalog.

use crate::runtime::approvals::shown::Name;

/// A question's name when sandmux could have written it: a tool of the
/// catalog, or the proxy's canonical `scheme://host:port`.
pub(crate) fn checked_name(name: &str) -> Option<Name<'_>> {
    crate::runtime::approvals::shown::checked_name_in(name, &|t| {
        super::catalog::find(t).map(|d| d.name)
    })
}
