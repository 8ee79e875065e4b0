//! The bodies of intercepted exchanges, read as they stream (bounded: what
//! is held back is shorter than one placeholder or one value): a request's
//! body is refused at the first placeholder in it, which never leaves whole
//! ([`Guarded`]); an answer's body has every real value replaced by its
//! placeholder ([`Masked`]).

use super::credentials::{Refused, Vault, PLACEHOLDER_LEN};
use bytes::Bytes;
use hyper::body::{Body, Frame};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

/// The error a body stream ends with.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where a refusal found in a body is left for the exchange to answer.
pub(crate) type Slot = Arc<Mutex<Option<Refused>>>;

/// A request body on its way up: refused at the first placeholder.
pub(crate) struct Guarded<B> {
    inner: B,
    vault: Arc<Vault>,
    host: String,
    held: Vec<u8>,
    slot: Slot,
    done: bool,
}

impl<B> Guarded<B> {
    pub(crate) fn new(inner: B, vault: Arc<Vault>, host: &str, slot: Slot) -> Guarded<B> {
        Guarded {
            inner,
            vault,
            host: host.to_string(),
            held: Vec::new(),
            slot,
            done: false,
        }
    }
}

impl<B> Body for Guarded<B>
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
        loop {
            if me.done {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut me.inner).poll_frame(cx)) {
                Some(Ok(f)) => {
                    // Trailers are dropped: only data goes up.
                    let Ok(d) = f.into_data() else { continue };
                    me.held.extend_from_slice(&d);
                    if let Err(r) = me.vault.refuse_in(&me.held, &me.host, "in a request body") {
                        *me.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                        me.done = true;
                        return Poll::Ready(Some(Err("refused by the proxy".into())));
                    }
                    let keep = (PLACEHOLDER_LEN - 1).min(me.held.len());
                    let out: Vec<u8> = me.held.drain(..me.held.len() - keep).collect();
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    me.done = true;
                    if !me.held.is_empty() {
                        let out = std::mem::take(&mut me.held);
                        return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// An answer's body on its way down: every real value replaced.
pub(crate) struct Masked<B> {
    inner: B,
    masks: Vec<(Arc<Vec<u8>>, Vec<u8>)>,
    held: Vec<u8>,
    done: bool,
}

impl<B> Masked<B> {
    pub(crate) fn new(inner: B, masks: Vec<(Arc<Vec<u8>>, Vec<u8>)>) -> Masked<B> {
        Masked {
            inner,
            masks,
            held: Vec::new(),
            done: false,
        }
    }
}

/// `b` with every value of `masks` replaced by its placeholder; the last
/// bytes that could begin a value are left in `b` unless `all`.
pub(crate) fn mask(b: &mut Vec<u8>, masks: &[(Arc<Vec<u8>>, Vec<u8>)], all: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    loop {
        let next = masks
            .iter()
            .filter_map(|(v, p)| memchr::memmem::find(&b[i..], v).map(|at| (i + at, v.len(), p)))
            .min_by_key(|(at, _, _)| *at);
        let Some((at, len, p)) = next else { break };
        out.extend_from_slice(&b[i..at]);
        out.extend_from_slice(p);
        i = at + len;
    }
    let longest = masks.iter().map(|(v, _)| v.len()).max().unwrap_or(1);
    let keep = if all {
        0
    } else {
        (longest - 1).min(b.len() - i)
    };
    out.extend_from_slice(&b[i..b.len() - keep]);
    b.drain(..b.len() - keep);
    out
}

impl<B> Body for Masked<B>
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
        loop {
            if me.done {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut me.inner).poll_frame(cx)) {
                Some(Ok(f)) => {
                    let Ok(d) = f.into_data() else { continue };
                    me.held.extend_from_slice(&d);
                    let out = mask(&mut me.held, &me.masks, false);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    me.done = true;
                    let out = mask(&mut me.held, &me.masks, true);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                    }
                }
            }
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
