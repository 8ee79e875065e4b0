//! Where spans go: `serve --otlp-endpoint URL`, else the standard
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the traces URL as written), else
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (a base: `/v1/traces` is appended, as the
//! flag's is). Only `http://`; the host is resolved once, at start-up,
//! and that address is the only one ever dialled.

use std::net::{SocketAddr, ToSocketAddrs};

/// The traces URL, as OpenTelemetry's exporter is given it.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub url: String,
    /// The address the host resolved to at start-up.
    pub addr: SocketAddr,
    /// The URL's `host[:port]`, for the `Host` header.
    pub host: String,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("{what} {url:?}: {why}; give the collector's OTLP/HTTP address as http://HOST:PORT (e.g. http://127.0.0.1:4318)")]
    Url {
        what: &'static str,
        url: String,
        why: String,
    },
    #[error("{what} {url:?}: {host:?} does not resolve ({why}); give an address or a name the host resolves")]
    Resolve {
        what: &'static str,
        url: String,
        host: String,
        why: String,
    },
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
    #[error("OTLP export was configured twice")]
    Twice,
}

const TRACES: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const BASE: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

impl Config {
    /// The endpoint from the flag or the environment; `None`: export off.
    pub(crate) fn from_flag_or_env(flag: Option<&str>) -> Result<Option<Config>, ConfigError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let (what, url) = match (flag, env(TRACES), env(BASE)) {
            (Some(f), _, _) => ("--otlp-endpoint", base_to_traces(f)),
            (None, Some(t), _) => (TRACES, t),
            (None, None, Some(b)) => (BASE, base_to_traces(&b)),
            (None, None, None) => return Ok(None),
        };
        Config::parse(what, &url).map(Some)
    }

    /// An `http://host[:port][/path]` URL, its host resolved now.
    pub(crate) fn parse(what: &'static str, url: &str) -> Result<Config, ConfigError> {
        let bad = |why: &str| ConfigError::Url {
            what,
            url: url.to_string(),
            why: why.to_string(),
        };
        let rest = match url.split_once("://") {
            Some(("http", r)) => r,
            Some(("https", _)) => return Err(bad("https is not supported: send to a collector on this host over http (it may forward with TLS)")),
            _ => return Err(bad("not an http:// URL")),
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.is_empty() || authority.contains('@') || path.contains(['?', '#']) {
            return Err(bad("no host, or user info, a query or a fragment"));
        }
        if !authority
            .chars()
            .chain(path.chars())
            .all(|c| c.is_ascii_graphic())
        {
            return Err(bad("not printable ASCII"));
        }
        let (host, port) = split_port(authority).ok_or_else(|| bad("a bad port"))?;
        let addr = (host.trim_matches(['[', ']']), port)
            .to_socket_addrs()
            .map_err(|e| e.to_string())
            .and_then(|mut a| a.next().ok_or_else(|| "no address".to_string()))
            .map_err(|why| ConfigError::Resolve {
                what,
                url: url.to_string(),
                host: host.to_string(),
                why,
            })?;
        Ok(Config {
            url: url.to_string(),
            addr,
            host: authority.to_string(),
        })
    }
}

/// A base URL's traces URL: `/v1/traces` after it.
fn base_to_traces(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// `host:port`, `[v6]:port`, or a host alone (port 80).
fn split_port(a: &str) -> Option<(&str, u16)> {
    let colon = if a.starts_with('[') {
        let end = a.find(']')?;
        a[end..].find(':').map(|i| end + i)
    } else {
        a.rfind(':')
    };
    match colon {
        Some(i) => Some((&a[..i], a[i + 1..].parse().ok().filter(|p| *p != 0)?)),
        None => Some((a, 80)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_strictly() {
        let c = Config::parse("x", "http://127.0.0.1:4318/v1/traces").unwrap();
        assert_eq!(c.addr, "127.0.0.1:4318".parse().unwrap());
        assert_eq!(c.host, "127.0.0.1:4318");
        let c = Config::parse("x", "http://[::1]:9/v1/traces").unwrap();
        assert_eq!(c.addr, "[::1]:9".parse().unwrap());
        assert_eq!(
            Config::parse("x", "http://127.0.0.1").unwrap().addr.port(),
            80
        );
        for bad in [
            "https://127.0.0.1:4318",
            "127.0.0.1:4318",
            "http://",
            "http://u@127.0.0.1:1/",
            "http://127.0.0.1:0/",
            "http://127.0.0.1:99999/",
            "http://127.0.0.1:1/x?y",
            "http://127.0.0.1:1/\u{1b}",
        ] {
            assert!(Config::parse("x", bad).is_err(), "{bad}");
        }
        assert_eq!(base_to_traces("http://h:1/"), "http://h:1/v1/traces");
    }
}
