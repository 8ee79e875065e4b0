//! Where spans go: `serve --otlp-endpoint URL`, else the standard
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the traces URL as written), else
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (a base: `/v1/traces` is appended, as the
//! flag's is). Only `http://`; the host is resolved once, at start-up,
//! and that address is the only one ever dialled.
//!
//! The flag is the operator's word for this instance: a bad one refuses
//! start-up. The environment may have been set for another tool (a shell's
//! telemetry setup that every process inherits): its standard off-switches
//! (`OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER` without `otlp`) are
//! obeyed, and an endpoint from it that sandmux cannot use (https, a
//! protocol other than `http/protobuf`, a name that does not resolve)
//! leaves export off with a warning instead of stopping `serve`.

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
        if let Some(f) = flag {
            return Config::parse("--otlp-endpoint", &base_to_traces(f)).map(Some);
        }
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let (what, url) = match (env(TRACES), env(BASE)) {
            (Some(t), _) => (TRACES, t),
            (None, Some(b)) => (BASE, base_to_traces(&b)),
            (None, None) => return Ok(None),
        };
        if let Some(why) = switched_off(&env) {
            tracing::info!("OTLP export stays off: {why} (an endpoint in {what} is not used)");
            return Ok(None);
        }
        match Config::parse(what, &url) {
            Ok(c) => Ok(Some(c)),
            Err(e) => {
                tracing::warn!(
                    "OTLP export stays off: {e} (give --otlp-endpoint to make it an error)"
                );
                Ok(None)
            }
        }
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

/// Why the environment says no export, if it does: the SDK disabled, no
/// `otlp` traces exporter, or an OTLP protocol this exporter does not speak.
fn switched_off(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Some("OTEL_SDK_DISABLED=true".into());
    }
    if let Some(v) = env("OTEL_TRACES_EXPORTER") {
        if !v.split(',').any(|e| e.trim() == "otlp") {
            return Some(format!("OTEL_TRACES_EXPORTER={v:?} names no otlp exporter"));
        }
    }
    let protocol = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", v))
        .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL").map(|v| ("OTEL_EXPORTER_OTLP_PROTOCOL", v)));
    match protocol {
        Some((k, v)) if v.trim() != "http/protobuf" => Some(format!(
            "{k}={v:?}: sandmux sends OTLP/HTTP with protobuf (http/protobuf) only"
        )),
        _ => None,
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

    #[test]
    fn the_environments_off_switches_are_obeyed() {
        fn with(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            move |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        }
        assert!(switched_off(&with(&[])).is_none());
        assert!(switched_off(&with(&[("OTEL_SDK_DISABLED", "TRUE")])).is_some());
        assert!(switched_off(&with(&[("OTEL_SDK_DISABLED", "false")])).is_none());
        assert!(switched_off(&with(&[("OTEL_TRACES_EXPORTER", "none")])).is_some());
        assert!(switched_off(&with(&[("OTEL_TRACES_EXPORTER", "console, otlp")])).is_none());
        assert!(switched_off(&with(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])).is_some());
        // The traces-specific protocol wins over the general one.
        let both = [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ];
        assert!(switched_off(&with(&both)).is_none());
    }
}
