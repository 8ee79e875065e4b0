//! A request head from inside, parsed with `httparse` and checked: what it
//! asks for (a CONNECT tunnel, or one plain HTTP request in absolute form),
//! and none of the shapes that let two parsers disagree (several
//! `Content-Length`s, `Transfer-Encoding`, a `Host` other than the target).

use super::name::{canonical, split_port, CONNECT_PORT, HTTP_PORT};

/// Most header lines in a request head.
pub const MAX_HEADERS: usize = 64;

/// What a complete head asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `CONNECT`, or the plain request's method.
    pub method: String,
    /// The canonical host name.
    pub host: String,
    /// The port.
    pub port: u16,
    /// Plain HTTP: the head to send upstream (origin form, `Connection:
    /// close`, no proxy headers) and the body's length.
    pub forward: Option<(Vec<u8>, u64)>,
    /// Bytes of the head in the buffer (what follows belongs to the body or
    /// the tunnel).
    pub len: usize,
}

/// The bytes so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// The head is not complete yet.
    More,
    /// A head this proxy serves.
    Done(Request),
    /// Refused, with the status code and why.
    Bad(u16, String),
}

/// Parses and checks a request head.
pub fn parse(buf: &[u8]) -> Parsed {
    let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut hs);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Partial) => return Parsed::More,
        Ok(httparse::Status::Complete(n)) => n,
        Err(httparse::Error::TooManyHeaders) => {
            return Parsed::Bad(431, format!("more than {MAX_HEADERS} header lines"))
        }
        Err(e) => return Parsed::Bad(400, format!("not an HTTP request head: {e}")),
    };
    match check(&req, len) {
        Ok(r) => Parsed::Done(r),
        Err((code, why)) => Parsed::Bad(code, why),
    }
}

type Refusal = (u16, String);

fn bad(why: impl Into<String>) -> Refusal {
    (400, why.into())
}

fn check(req: &httparse::Request<'_, '_>, len: usize) -> Result<Request, Refusal> {
    let method = req.method.unwrap_or_default().to_string();
    let target = req.path.unwrap_or_default();
    let (lengths, te) = framing(req.headers)?;
    if method == "CONNECT" {
        if lengths.iter().any(|n| *n != 0) || te {
            return Err(bad("a CONNECT request has no body"));
        }
        let (host, port) = authority(target, CONNECT_PORT)?;
        same_host(req.headers, &host, port, CONNECT_PORT)?;
        return Ok(Request {
            method,
            host,
            port,
            forward: None,
            len,
        });
    }
    if te {
        return Err((411, "Transfer-Encoding in a plain HTTP request is refused (send a Content-Length, or use HTTPS)".into()));
    }
    let rest = strip_scheme(target)?;
    let cut = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(cut);
    let (host, port) = authority(auth, HTTP_PORT)?;
    same_host(req.headers, &host, port, HTTP_PORT)?;
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let body = lengths.first().copied().unwrap_or(0);
    let head = upstream_head(&method, &path, &host, port, req.headers);
    Ok(Request {
        method,
        host,
        port,
        forward: Some((head, body)),
        len,
    })
}

/// The `Content-Length` values and whether `Transfer-Encoding` is present;
/// refuses several lengths and values that are not plain numbers.
fn framing(headers: &[httparse::Header<'_>]) -> Result<(Vec<u64>, bool), Refusal> {
    let mut lengths = Vec::new();
    let mut te = false;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value).unwrap_or("");
            if v.is_empty() || v.len() > 18 || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("Content-Length is not a plain number"));
            }
            lengths.push(v.parse().unwrap_or(0));
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            te = true;
        }
    }
    if lengths.len() > 1 {
        return Err(bad("more than one Content-Length"));
    }
    if te && !lengths.is_empty() {
        return Err(bad("both Content-Length and Transfer-Encoding"));
    }
    Ok((lengths, te))
}

/// `http://` removed; any other scheme (or none) is refused.
fn strip_scheme(target: &str) -> Result<&str, Refusal> {
    match target.split_once("://") {
        Some((s, rest)) if s.eq_ignore_ascii_case("http") => Ok(rest),
        Some((s, _)) if s.eq_ignore_ascii_case("https") => Err(bad(
            "https:// URLs go through CONNECT (a proxy never sees them in plain text)",
        )),
        _ => Err(bad(
            "this is a proxy: the request must name its host (absolute form, http://host/…)",
        )),
    }
}

/// `host[:port]` of a target, canonical.
fn authority(a: &str, default: u16) -> Result<(String, u16), Refusal> {
    if a.contains('@') {
        return Err(bad("user information in the target is refused"));
    }
    let (h, p) = split_port(a).map_err(|e| bad(format!("target {a:?}: {e}")))?;
    let host = canonical(h).map_err(|e| (403, format!("target {h:?}: {e}")))?;
    Ok((host, p.unwrap_or(default)))
}

/// A `Host` header, if present (at most one), must name the target.
fn same_host(
    headers: &[httparse::Header<'_>],
    host: &str,
    port: u16,
    default: u16,
) -> Result<(), Refusal> {
    let hosts: Vec<&[u8]> = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .map(|h| h.value)
        .collect();
    match hosts.as_slice() {
        [] => Ok(()),
        [v] => {
            let v = std::str::from_utf8(v).map_err(|_| bad("Host is not text"))?;
            match authority(v, default) {
                Ok((h, p)) if h == host && p == port => Ok(()),
                _ => Err(bad(format!(
                    "Host {v:?} differs from the target {host}:{port}"
                ))),
            }
        }
        _ => Err(bad("more than one Host header")),
    }
}

/// Hop-by-hop and proxy headers, never forwarded.
fn hop(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "host",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
        || name.len() >= 6 && name[..6].eq_ignore_ascii_case("proxy-")
}

fn upstream_head(
    method: &str,
    path: &str,
    host: &str,
    port: u16,
    headers: &[httparse::Header<'_>],
) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    let host_line = if port == HTTP_PORT {
        format!("Host: {host}\r\n")
    } else {
        format!("Host: {host}:{port}\r\n")
    };
    out.extend_from_slice(host_line.as_bytes());
    for h in headers.iter().filter(|h| !hop(h.name)) {
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(s: &str) -> Request {
        match parse(s.as_bytes()) {
            Parsed::Done(r) => r,
            other => panic!("{s:?}: {other:?}"),
        }
    }

    fn refused(s: &str) -> u16 {
        match parse(s.as_bytes()) {
            Parsed::Bad(c, _) => c,
            other => panic!("{s:?}: {other:?}"),
        }
    }

    #[test]
    fn connect_and_plain() {
        let r = done("CONNECT Files.Test.:443 HTTP/1.1\r\nHost: files.test:443\r\n\r\n");
        assert_eq!(
            (r.host.as_str(), r.port, r.forward),
            ("files.test", 443, None)
        );
        let r = done(
            "GET http://a.test/x?y HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: z\r\n\r\n",
        );
        let (head, body) = r.forward.unwrap();
        assert_eq!(body, 0);
        let head = String::from_utf8(head).unwrap();
        assert!(
            head.starts_with("GET /x?y HTTP/1.1\r\nHost: a.test\r\n"),
            "{head}"
        );
        assert!(!head.contains("Proxy-"), "{head}");
        assert_eq!(parse(b"CONNECT a.test:443 HTTP/1.1\r\n"), Parsed::More);
    }

    #[test]
    fn smuggling_shapes_refused() {
        refused("POST http://a.test/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n");
        refused("POST http://a.test/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
        refused("POST http://a.test/ HTTP/1.1\r\nContent-Length: +3\r\n\r\n");
        assert_eq!(
            refused("POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            411
        );
        refused("GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n");
        refused("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n\r\n");
        refused("CONNECT a.test:443 HTTP/1.1\r\nHost: b.test:443\r\n\r\n");
        refused("GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n");
        refused("GET https://a.test/ HTTP/1.1\r\n\r\n");
        refused("GET http://u@a.test/ HTTP/1.1\r\n\r\n");
        assert_eq!(refused("CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n"), 403);
    }
}
