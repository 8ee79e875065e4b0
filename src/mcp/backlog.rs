//! The backlog: answers computed but not yet written to the client. A client
//! that sends requests and never reads its answers would otherwise make the
//! unconfined supervisor hold every answer (up to a megabyte each). Each
//! answer's size is owed when it is produced and paid as its bytes reach
//! stdout; a call starts only while less than [`LIMIT`] is owed, so the
//! supervisor holds at most that much plus the calls already running.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

/// Most answer bytes owed before new calls wait.
pub(crate) const LIMIT: usize = 8 << 20;

/// What is owed to the client.
#[derive(Default)]
pub(crate) struct Backlog {
    owed: AtomicUsize,
    paid: Notify,
}

impl Backlog {
    /// An answer of `n` bytes is on its way.
    pub(crate) fn owe(&self, n: usize) {
        self.owed.fetch_add(n, Ordering::SeqCst);
    }

    /// Waits until less than [`LIMIT`] is owed.
    pub(crate) async fn room(&self) {
        loop {
            let paid = self.paid.notified();
            if self.owed.load(Ordering::SeqCst) < LIMIT {
                return;
            }
            paid.await;
        }
    }

    /// `n` bytes of answers reached the client.
    pub(crate) fn pay(&self, n: usize) {
        let _ = self
            .owed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |o| {
                Some(o.saturating_sub(n))
            });
        self.paid.notify_waiters();
    }
}

/// One HTTP request's share of the backlog: what its answer owes, paid as
/// its response body is written and in full when that body is dropped (the
/// connection gone), so an answer nobody will read is never owed for good.
pub(crate) struct Debt {
    /// What is still owed; `None` once the body is gone.
    owed: std::sync::Mutex<Option<usize>>,
    backlog: Arc<Backlog>,
}

impl Debt {
    /// A share of `backlog`, owing nothing yet.
    pub(crate) fn new(backlog: Arc<Backlog>) -> Debt {
        Debt {
            owed: std::sync::Mutex::new(Some(0)),
            backlog,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<usize>> {
        self.owed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An answer of `n` bytes is on its way (nothing once the body is gone).
    pub(crate) fn owe(&self, n: usize) {
        if let Some(o) = self.lock().as_mut() {
            *o += n;
            self.backlog.owe(n);
        }
    }

    /// `n` bytes of the body were written (framing beyond the debt is free).
    pub(crate) fn pay(&self, n: usize) {
        if let Some(o) = self.lock().as_mut() {
            let p = n.min(*o);
            *o -= p;
            self.backlog.pay(p);
        }
    }

    /// The body is gone: whatever it still owed is paid.
    pub(crate) fn close(&self) {
        if let Some(o) = self.lock().take() {
            self.backlog.pay(o);
        }
    }
}

/// The read half of the transport: no request is read while [`LIMIT`] is
/// owed, so nothing the client sends (a list request, an unknown method)
/// can make answers pile up while it does not read them.
pub(crate) struct Gated<R> {
    inner: R,
    backlog: Arc<Backlog>,
    nap: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<R> Gated<R> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: R, backlog: Arc<Backlog>) -> Self {
        Gated {
            inner,
            backlog,
            nap: None,
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Gated<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Looked at again every 10 ms while the client owes reading.
        while self.backlog.owed.load(Ordering::SeqCst) >= LIMIT {
            let nap = self.nap.get_or_insert_with(|| {
                Box::pin(tokio::time::sleep(std::time::Duration::from_millis(10)))
            });
            std::task::ready!(nap.as_mut().poll(cx));
            self.nap = None;
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// The write half of the transport, paying the backlog as bytes leave.
pub(crate) struct Metered<W> {
    inner: W,
    backlog: Arc<Backlog>,
}

impl<W> Metered<W> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: W, backlog: Arc<Backlog>) -> Self {
        Metered { inner, backlog }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Metered<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.backlog.pay(n);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_wait_while_too_much_is_owed_and_go_on_once_paid() {
        let b = Arc::new(Backlog::default());
        b.owe(LIMIT);
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.room().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        let mut w = Metered::new(tokio::io::sink(), b.clone());
        tokio::io::AsyncWriteExt::write_all(&mut w, &[0u8; 4096])
            .await
            .unwrap();
        waiter.await.unwrap();
    }

    #[test]
    fn a_closed_debt_pays_the_rest_and_owes_nothing_more() {
        let b = Arc::new(Backlog::default());
        let d = Debt::new(b.clone());
        d.owe(LIMIT);
        d.pay(100);
        assert_eq!(b.owed.load(Ordering::SeqCst), LIMIT - 100);
        d.close();
        assert_eq!(b.owed.load(Ordering::SeqCst), 0);
        d.owe(LIMIT);
        assert_eq!(b.owed.load(Ordering::SeqCst), 0);
    }
}
