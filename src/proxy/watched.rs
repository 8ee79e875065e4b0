//! The client's side of an intercepted tunnel: the bytes already read (the
//! ClientHello the SNI was checked in) given again first, then the socket;
//! every read and write counted and stamped, so the connection is closed
//! after the idle time without traffic, as a tunnel is.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Bytes each way, and the last time either moved (ms since `start`).
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    /// From the sandbox.
    pub up: AtomicU64,
    /// To the sandbox.
    pub down: AtomicU64,
    /// Milliseconds after the start of the last read or write.
    pub last_ms: AtomicU64,
}

/// The socket with `first` in front of it.
pub(crate) struct Watched<'a> {
    first: Vec<u8>,
    at: usize,
    s: &'a mut TcpStream,
    start: std::time::Instant,
    pub(crate) traffic: Arc<Traffic>,
}

impl<'a> Watched<'a> {
    pub(crate) fn new(first: Vec<u8>, s: &'a mut TcpStream) -> Watched<'a> {
        Watched {
            first,
            at: 0,
            s,
            start: std::time::Instant::now(),
            traffic: Arc::default(),
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.traffic.last_ms.store(ms, Ordering::Relaxed);
    }
}

impl AsyncRead for Watched<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.first.len() {
            let n = (self.first.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.first[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut *self.s).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.traffic.up.fetch_add(n as u64, Ordering::Relaxed);
            self.touch();
        }
        r
    }
}

impl AsyncWrite for Watched<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut *self.s).poll_write(cx, b);
        if let Poll::Ready(Ok(n)) = r {
            self.traffic.down.fetch_add(n as u64, Ordering::Relaxed);
            self.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.s).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.s).poll_shutdown(cx)
    }
}
