//! Where a credential's placeholder may stand in a request header: the
//! whole value, after one of [`SCHEMES`], or as Basic's password. Anything
//! else is refused by the vault (`super::credentials`).

use super::credentials::PREFIX;

/// The authorization schemes a placeholder may follow (without case; sent
/// as spelled here): the agent does not choose what stands before the
/// value (`crate::proxy::echo`). `Basic` is read apart.
pub(super) const SCHEMES: [&str; 2] = ["Bearer", "token"];

/// Where a placeholder may stand in a header value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// The whole value.
    Whole,
    /// After one of [`SCHEMES`] and one space, written as sandmux spells it.
    Scheme(&'static str),
    /// Basic's password (the user's bytes and the colon).
    Basic(usize),
}

impl Shape {
    pub(super) fn of(v: &[u8], ph: &str) -> Option<Shape> {
        let ph = ph.as_bytes();
        if v == ph {
            return Some(Shape::Whole);
        }
        let n = v.len().checked_sub(ph.len())?;
        let (scheme, rest) = v.split_at(n);
        let known = SCHEMES
            .iter()
            .find(|s| scheme.eq_ignore_ascii_case(format!("{s} ").as_bytes()))?;
        (rest == ph).then_some(Shape::Scheme(known))
    }

    pub(super) fn basic(d: &[u8], ph: &str) -> Option<Shape> {
        let n = d.len().checked_sub(ph.len())?;
        let (user, rest) = d.split_at(n);
        let ok = rest == ph.as_bytes()
            && user.ends_with(b":")
            && !user[..user.len() - 1].contains(&b':')
            && memchr::memmem::find(user, PREFIX.as_bytes()).is_none();
        ok.then_some(Shape::Basic(n))
    }
}

/// The base64 of `Basic <base64>`.
pub(super) fn basic(v: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = v.split_at(v.iter().position(|b| *b == b' ')?);
    scheme
        .eq_ignore_ascii_case(b"basic")
        .then(|| rest.trim_ascii())
}
