//! The bodies of intercepted exchanges, read as they stream (bounded: what
//! is held back is shorter than one placeholder or one value): a request's
//! body is refused at the first placeholder in it, which never leaves whole;
//! an answer's body has every real value replaced by its placeholder
//! ([`Filtered`]).

use super::credentials::{Refused, Vault, PLACEHOLDER_LEN};
use super::echo::Masks;
use bytes::Bytes;
use hyper::body::{Body, Frame};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

/// The error a body stream ends with.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where a refusal found in a body is left for the exchange to answer.
pub(crate) type Slot = Arc<Mutex<Option<Refused>>>;

/// A body read as it streams: a request's on its way up (refused at the
/// first placeholder, [`Filtered::guard`]) or an answer's on its way down
/// (every real value masked, [`Filtered::mask`]).
pub(crate) struct Filtered<B> {
    inner: B,
    filter: Filter,
    held: Vec<u8>,
    done: bool,
}

enum Filter {
    Guard {
        vault: Arc<Vault>,
        host: String,
        slot: Slot,
    },
    Mask(Masks),
}

impl<B> Filtered<B> {
    /// A request body: refused (the refusal left in `slot`) at the first
    /// placeholder, which never leaves whole.
    pub(crate) fn guard(inner: B, vault: Arc<Vault>, host: &str, slot: Slot) -> Filtered<B> {
        let host = host.to_string();
        Filtered::new(inner, Filter::Guard { vault, host, slot })
    }

    /// An answer's body: every value of `masks` replaced by its placeholder.
    pub(crate) fn mask(inner: B, masks: Masks) -> Filtered<B> {
        Filtered::new(inner, Filter::Mask(masks))
    }

    fn new(inner: B, filter: Filter) -> Filtered<B> {
        Filtered {
            inner,
            filter,
            held: Vec::new(),
            done: false,
        }
    }
}

impl Filter {
    /// What of `held` may go on now (all of it at the `end`).
    fn pass(&self, held: &mut Vec<u8>, end: bool) -> Result<Vec<u8>, BoxError> {
        match self {
            Filter::Guard { vault, host, slot } => {
                if let Err(r) = vault.refuse_in(held, host, "in a request body") {
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                    return Err("refused by the proxy".into());
                }
                let keep = if end {
                    0
                } else {
                    (PLACEHOLDER_LEN - 1).min(held.len())
                };
                Ok(held.drain(..held.len() - keep).collect())
            }
            Filter::Mask(masks) => Ok(masked(held, masks, end)),
        }
    }
}

/// `b` with every value of `masks` replaced by its placeholder; the last
/// bytes that could begin a value are left in `b` unless `all`.
#[cfg(test)]
pub(crate) fn mask(b: &mut Vec<u8>, masks: &[(Arc<Vec<u8>>, Vec<u8>)], all: bool) -> Vec<u8> {
    let m = Masks {
        whole: masks.to_vec(),
        cuts: vec![],
    };
    masked(b, &m, all)
}

/// `b` with every match of `masks` replaced (whole values and cut echoes,
/// [`Masks`]); the last bytes that could begin one, or a cut echo that
/// could go on, are left in `b` unless `all`.
pub(crate) fn masked(b: &mut Vec<u8>, masks: &Masks, all: bool) -> Vec<u8> {
    let lower = if masks.cuts.is_empty() {
        vec![]
    } else {
        b.to_ascii_lowercase()
    };
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let mut open = None;
    let mut scan = super::echo::Scan::new(masks);
    while let Some(f) = scan.next(b, &lower, i) {
        if f.open && !all {
            open = Some(f.at);
            break;
        }
        out.extend_from_slice(&b[i..f.at]);
        out.extend_from_slice(&f.with);
        i = f.at + f.len;
    }
    let keep = match open {
        _ if all => 0,
        Some(at) => b.len() - at,
        None => (masks.longest() - 1).min(b.len() - i),
    };
    out.extend_from_slice(&b[i..b.len() - keep]);
    b.drain(..b.len() - keep);
    out
}

impl<B> Body for Filtered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let me = &mut *self;
        while !me.done {
            let end = match ready!(Pin::new(&mut me.inner).poll_frame(cx)) {
                // Trailers are dropped: only data goes on.
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => {
                        me.held.extend_from_slice(&d);
                        false
                    }
                    Err(_) => continue,
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => true,
            };
            me.done = end;
            match me.filter.pass(&mut me.held, end) {
                Err(e) => {
                    me.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Ok(out) if !out.is_empty() => {
                    return Poll::Ready(Some(Ok(Frame::data(out.into()))))
                }
                Ok(_) => {}
            }
        }
        Poll::Ready(None)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.filter {
            // A request's length is unchanged (its Content-Length is kept).
            Filter::Guard { .. } => self.inner.size_hint(),
            Filter::Mask(_) => hyper::body::SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_split_across_chunks_is_masked() {
        let masks = vec![(Arc::new(b"s3cr3t-value".to_vec()), b"PH".to_vec())];
        let text = b"echo: s3cr3t-value and s3cr3t-value end";
        for cut in 0..text.len() {
            let mut held = Vec::new();
            let mut out = Vec::new();
            for part in [&text[..cut], &text[cut..]] {
                held.extend_from_slice(part);
                out.extend(mask(&mut held, &masks, false));
            }
            out.extend(mask(&mut held, &masks, true));
            assert_eq!(out, b"echo: PH and PH end", "cut {cut}");
        }
    }
}
