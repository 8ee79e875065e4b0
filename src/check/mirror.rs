//! Mirrors: where this network resolves allowed names to a mirror on a
//! private or reserved range, which the proxy refuses by default. Each exact
//! name of a proxy profile's allow list is resolved as the proxy resolves it
//! (a `hosts` pin, else the host's resolver, the name taken as absolute: no
//! search domain), and judged as the proxy judges it (the entry's ranges,
//! `allow_private`). A name none of whose addresses the proxy would dial gets
//! the narrowest fix: a range of each of its refused addresses alone (`/32`,
//! `/128`) on that name's entry — never `allow_private`, never a wider range.
//! Addresses no mirror lives at (loopback, link-local and cloud metadata,
//! unspecified, multicast, broadcast, IPv6 forms that carry an IPv4 address)
//! are never proposed: such an entry is the human's to write by hand.
//!
//! `sandmux check` prints the entries and the one command that writes them
//! ([`super::mirror_profile`]); a name that does not resolve is a warning
//! there, not a failure (this network has no such name: the sandbox is not
//! at fault).

use crate::proxy::{addr, name, Config};
use serde::Serialize;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest resolution waited for (all names at once), as `check`'s dial.
const AT_MOST: Duration = Duration::from_secs(10);

/// One exact allowed name, resolved and judged.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Seen {
    /// `name:port`, canonical (as `check`'s dial names it).
    pub name: String,
    /// What the proxy would do with its addresses.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// What the proxy would do with a name's addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub(crate) enum Verdict {
    /// At least one address the proxy would dial.
    Allowed,
    /// No address on this network (does not resolve, or timed out).
    Unresolved {
        /// The resolver's answer.
        why: String,
    },
    /// Every address refused by its range.
    Refused {
        /// The ranges that open it: each proposable address alone.
        ranges: Vec<String>,
        /// Addresses never proposed, each with why.
        withheld: Vec<String>,
    },
}

/// Resolves and judges every exact name of `cfg`'s allow list (a
/// `*.suffix` pattern names no host and is skipped), all at once.
pub(crate) fn survey(cfg: &Config) -> Vec<Seen> {
    let mut keys: Vec<(String, u16)> = Vec::new();
    for r in cfg.allow.iter().filter(|r| !r.suffix) {
        let k = (r.name.clone(), r.port.unwrap_or(name::CONNECT_PORT));
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let answers = resolve_all(cfg, &keys);
    keys.into_iter()
        .zip(answers)
        .map(|((host, port), ips)| Seen {
            name: format!("{host}:{port}"),
            verdict: judge(cfg, &host, port, ips),
        })
        .collect()
}

/// Why a name has no addresses here.
#[derive(Debug, thiserror::Error)]
enum Unresolved {
    /// The host's resolver said no.
    #[error("does not resolve on the host: {0}")]
    Lookup(#[source] std::io::Error),
    /// It did not answer by [`AT_MOST`].
    #[error("resolving timed out ({AT_MOST:?})")]
    Timeout,
    /// It answered with no address.
    #[error("has no address")]
    NoAddress,
}

/// Each key's addresses, or why none, in order; a resolver that has not
/// answered by [`AT_MOST`] is a timeout (its thread is left to end alone).
fn resolve_all(cfg: &Config, keys: &[(String, u16)]) -> Vec<Result<Vec<IpAddr>, Unresolved>> {
    let (tx, rx) = mpsc::channel();
    let mut out: Vec<Option<Result<Vec<IpAddr>, Unresolved>>> =
        (0..keys.len()).map(|_| None).collect();
    for (i, (host, port)) in keys.iter().enumerate() {
        if let Some(ip) = cfg.hosts.get(host) {
            out[i] = Some(Ok(vec![*ip]));
            continue;
        }
        let (tx, fqdn, port) = (tx.clone(), format!("{host}."), *port);
        std::thread::spawn(move || {
            let r = (fqdn.as_str(), port)
                .to_socket_addrs()
                .map(|it| it.map(|a| a.ip()).collect::<Vec<_>>())
                .map_err(Unresolved::Lookup);
            let _ = tx.send((i, r));
        });
    }
    drop(tx);
    let end = Instant::now() + AT_MOST;
    while out.iter().any(Option::is_none) {
        match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok((i, r)) => out[i] = Some(r),
            Err(_) => break,
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or(Err(Unresolved::Timeout)))
        .collect()
}

fn judge(cfg: &Config, host: &str, port: u16, ips: Result<Vec<IpAddr>, Unresolved>) -> Verdict {
    let ips = match ips.and_then(|v| {
        if v.is_empty() {
            Err(Unresolved::NoAddress)
        } else {
            Ok(v)
        }
    }) {
        Ok(v) => v,
        // The report's words.
        Err(why) => {
            return Verdict::Unresolved {
                why: why.to_string(),
            }
        }
    };
    let mut open = cfg.allow_private.clone();
    let ranges = name::allowed(&cfg.allow, host, port, name::CONNECT_PORT).unwrap_or_default();
    open.extend(ranges.into_iter().copied());
    if ips.iter().any(|ip| addr::check(*ip, &open).is_ok()) {
        return Verdict::Allowed;
    }
    let (mut ranges, mut withheld) = (Vec::new(), Vec::new());
    for ip in ips {
        let one = format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 });
        match never_proposed(ip) {
            None if !ranges.contains(&one) => ranges.push(one),
            None => {}
            Some(why) => withheld.push(format!("{ip} is {why}")),
        }
    }
    Verdict::Refused { ranges, withheld }
}

/// Why a refused address is never proposed as a mirror's, or None for one
/// a mirror may have (private, shared, documentation, benchmarking, the
/// IETF's block, unique-local IPv6).
pub(crate) fn never_proposed(ip: IpAddr) -> Option<&'static str> {
    // Cloud metadata services outside link-local (Alibaba's, AWS's IPv6).
    const METADATA: [&str; 2] = ["100.100.100.200", "fd00:ec2::254"];
    if METADATA.iter().any(|m| m.parse() == Ok(ip)) {
        return Some("a cloud metadata service's address");
    }
    match ip {
        IpAddr::V4(a) if a.is_loopback() => Some("loopback: the host's own services"),
        IpAddr::V4(a) if a.octets()[0] == 0 => Some("unspecified"),
        IpAddr::V4(a) if a.is_link_local() => Some("link-local, where cloud metadata lives"),
        IpAddr::V4(a) if a.is_multicast() => Some("multicast"),
        IpAddr::V4(a) if a.octets()[0] >= 240 => Some("reserved or broadcast"),
        IpAddr::V4(_) => None,
        IpAddr::V6(a) if (a.segments()[0] & 0xfe00) == 0xfc00 => None,
        IpAddr::V6(_) => Some(
            "an IPv6 address no mirror has (loopback, link-local, multicast, or a form that carries an IPv4 address)",
        ),
    }
}

/// The names refused with at least one range proposed.
pub(crate) fn fixable(seen: &[Seen]) -> impl Iterator<Item = (&str, &[String])> {
    seen.iter().filter_map(|s| match &s.verdict {
        Verdict::Refused { ranges, .. } if !ranges.is_empty() => {
            Some((s.name.as_str(), ranges.as_slice()))
        }
        _ => None,
    })
}

/// The command that writes the local profile for `spec` (a profile name
/// or path, as `-p` takes it).
pub(crate) fn command(spec: &str) -> String {
    format!("sandmux profile mirror {} --write", shell_word(spec))
}

/// A word safe to paste into a POSIX shell (single-quoted when needed).
pub(crate) fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:=@,%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{AllowEntry, Network, RangedName};

    fn cfg(allow: Vec<AllowEntry>, hosts: &[(&str, &str)]) -> Config {
        let n = Network {
            allow,
            hosts: hosts
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Network::default()
        };
        Config::of(&n).unwrap()
    }

    #[test]
    fn a_mirror_gets_its_own_addresses_only() {
        let c = cfg(
            vec![
                AllowEntry::Name("pypi.org".into()),
                AllowEntry::Name("*.crates.io".into()),
                AllowEntry::Name("loop.test:8080".into()),
                AllowEntry::Ranged(RangedName {
                    name: "open.test".into(),
                    ranges: vec!["10.0.0.0/8".into()],
                }),
            ],
            &[
                ("pypi.org", "203.0.113.80"),
                ("loop.test", "127.0.0.1"),
                ("open.test", "10.1.2.3"),
            ],
        );
        let s = survey(&c);
        let names: Vec<&str> = s.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["pypi.org:443", "loop.test:8080", "open.test:443"]);
        assert_eq!(
            s[0].verdict,
            Verdict::Refused {
                ranges: vec!["203.0.113.80/32".into()],
                withheld: vec![]
            }
        );
        match &s[1].verdict {
            Verdict::Refused { ranges, withheld } => {
                assert!(ranges.is_empty() && withheld[0].contains("loopback"))
            }
            v => panic!("{v:?}"),
        }
        assert_eq!(s[2].verdict, Verdict::Allowed);
        assert_eq!(fixable(&s).count(), 1);
    }

    #[test]
    fn addresses_no_mirror_has_are_never_proposed() {
        for m in ["100.100.100.200", "fd00:ec2::254"] {
            assert!(never_proposed(m.parse().unwrap()).is_some(), "{m}");
        }
        for ip in [
            "127.0.0.2",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::ffff:10.0.0.1",
            "fe80::1",
        ] {
            assert!(never_proposed(ip.parse().unwrap()).is_some(), "{ip}");
        }
        for ip in [
            "10.1.2.3",
            "192.168.1.1",
            "100.64.0.1",
            "198.18.0.1",
            "203.0.113.80",
            "fd00::1",
        ] {
            assert!(never_proposed(ip.parse().unwrap()).is_none(), "{ip}");
        }
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell_word("registries"), "registries");
        assert_eq!(shell_word("/a b/it's.toml"), r"'/a b/it'\''s.toml'");
    }
}
