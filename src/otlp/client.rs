//! The exporter's HTTP client: the crate's own hyper 1 client (no reqwest),
//! one HTTP/1.1 connection per batch to the address resolved at start-up,
//! whatever host the request's URL names; the whole exchange under a
//! timeout, the answer's body capped.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

/// One export, connection to answer, at most.
pub(super) const TIMEOUT: Duration = Duration::from_secs(10);
/// The collector's answer kept, at most (it is a status and a small body).
const ANSWER_MAX: usize = 64 * 1024;

/// Sends to one address, fixed when export was configured.
#[derive(Debug)]
pub(super) struct Pinned {
    addr: SocketAddr,
    host: String,
}

impl Pinned {
    pub(super) fn new(addr: SocketAddr, host: String) -> Self {
        Pinned { addr, host }
    }

    async fn send(&self, req: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (mut parts, body) = req.into_parts();
        // Origin form on the wire; the host is the configured one.
        parts.uri = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()?;
        // Only what the exchange needs: the exporter also adds every header
        // of `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`, which an operator may
        // have set for another tool's vendor (an API key), and which would
        // go in cleartext to whatever listens at this address.
        let kept = parts.headers.get(hyper::header::CONTENT_TYPE).cloned();
        parts.headers.clear();
        parts
            .headers
            .extend(kept.map(|v| (hyper::header::CONTENT_TYPE, v)));
        parts
            .headers
            .insert(hyper::header::HOST, self.host.parse()?);
        let req = hyper::Request::from_parts(parts, Full::new(body));
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        // Ended with the exchange, however it ends (an error, the timeout).
        let _conn = Aborted(tokio::spawn(conn));
        let res = send.send_request(req).await?;
        let (parts, body) = res.into_parts();
        let body = Limited::new(body, ANSWER_MAX).collect().await?.to_bytes();
        Ok(Response::from_parts(parts, body))
    }
}

/// A task aborted when dropped.
struct Aborted<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Aborted<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl HttpClient for Pinned {
    fn send_bytes<'a, 'b>(
        &'a self,
        req: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move {
            tokio::time::timeout(TIMEOUT, self.send(req))
                .await
                .map_err(|_| format!("no answer from {} in {TIMEOUT:?}", self.addr))?
        })
    }
}
