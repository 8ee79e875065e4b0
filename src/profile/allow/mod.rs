//! The allowlist proxy's configuration (`[network] mode = "proxy"`): the
//! names and ranges of the allowlist ([`name`], [`addr`]), parsed from the
//! profile and checked when it loads, where the proxy listens inside the
//! sandbox, and the variables that point every tool at it. The proxy itself
//! (`crate::proxy`) and the sandbox's listener (`crate::sandbox::net`) use
//! them from here: the profile names no layer above it.

pub mod addr;
pub mod name;

use super::Network;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// The proxy's address inside the sandbox (bound by `crate::sandbox::net`,
/// served by `crate::proxy`).
pub(crate) const LISTEN: std::net::SocketAddrV4 =
    std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 3128);

/// The proxy as `http://…`, for the environment.
pub(crate) fn url() -> String {
    format!("http://{LISTEN}")
}

/// The environment variables set for every process inside, in each
/// spelling tools read.
pub(crate) fn env_vars() -> Vec<(String, String)> {
    let u = url();
    let mut v = Vec::new();
    for n in ["http_proxy", "https_proxy", "all_proxy"] {
        v.push((n.to_string(), u.clone()));
        v.push((n.to_ascii_uppercase(), u.clone()));
    }
    for n in ["no_proxy", "NO_PROXY"] {
        v.push((n.to_string(), "localhost,127.0.0.1,::1".to_string()));
    }
    v
}

/// The proxy's settings, parsed from `[network]`.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The allowlist.
    pub allow: Vec<name::Rule>,
    /// Ranges that may be dialled although refused by default.
    pub allow_private: Vec<addr::Cidr>,
    /// Names pinned to an address (no resolution).
    pub hosts: BTreeMap<String, IpAddr>,
    /// Connections served at once; more are refused.
    pub max_connections: usize,
    /// A connection with no traffic for this long is closed.
    pub idle: Duration,
    /// Largest request head.
    pub header_bytes: usize,
    /// `ask`: the ports a question may be about (empty without `ask`).
    pub ask_ports: Vec<u16>,
}

/// `ask_ports`, checked: 1 to 32 ports, none 0.
fn ports(p: &[u16]) -> Result<Vec<u16>, (&'static str, String)> {
    if p.is_empty() || p.len() > 32 || p.contains(&0) {
        return Err((
            "network.ask_ports",
            format!("{p:?}: list 1 to 32 ports (1-65535) a question may be about"),
        ));
    }
    Ok(p.to_vec())
}

impl Config {
    /// Parses `[network]`; errors name the key.
    pub(crate) fn of(n: &Network) -> Result<Config, (&'static str, String)> {
        let allow = n
            .allow
            .iter()
            .map(name::Rule::of)
            .collect::<Result<_, _>>()
            .map_err(|e: name::RuleError| ("network.allow", e.to_string()))?;
        let allow_private = n
            .allow_private
            .iter()
            .map(|c| addr::Cidr::parse(c))
            .collect::<Result<_, _>>()
            .map_err(|e: addr::CidrError| ("network.allow_private", e.to_string()))?;
        let mut hosts = BTreeMap::new();
        for (k, v) in &n.hosts {
            let key = name::canonical(k).map_err(|e| ("network.hosts", format!("{k:?}: {e}")))?;
            let ip = v.parse().map_err(|_| {
                (
                    "network.hosts",
                    format!("{k:?}: {v:?} is not an IP address"),
                )
            })?;
            hosts.insert(key, ip);
        }
        Ok(Config {
            allow,
            allow_private,
            hosts,
            max_connections: n.proxy_connections as usize,
            idle: Duration::from_secs(n.proxy_idle_seconds),
            header_bytes: n.proxy_header_bytes as usize,
            ask_ports: if n.ask { ports(&n.ask_ports)? } else { vec![] },
        })
    }

    /// The allowlist as written canonically (reports).
    pub(crate) fn list(&self) -> Vec<String> {
        self.allow.iter().map(|r| r.show()).collect()
    }
}
