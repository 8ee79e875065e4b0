//! Addresses the proxy refuses to dial: loopback, private, link-local (and
//! so cloud metadata), shared, multicast, reserved, unspecified, and IPv6
//! forms that embed an IPv4 address (mapped, compatible, NAT64, 6to4,
//! Teredo) — unless a CIDR of the profile's `allow_private` covers it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why a range was refused; each message starts with the range as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// The part before `/` is no address.
    #[error("{range:?}: {addr:?} is not an IP address")]
    Address {
        /// The range as written.
        range: String,
        /// Its address part.
        addr: String,
    },
    /// The length is no number, or past the family's bits.
    #[error("{range:?}: prefix length must be 0-{max}")]
    Length {
        /// The range as written.
        range: String,
        /// The family's bits.
        max: u8,
    },
    /// Bits set below the prefix length.
    #[error("{range:?}: bits set below the prefix length")]
    HostBits {
        /// The range as written.
        range: String,
    },
}

/// An address the proxy does not dial, and why (a class of the table).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ip} is {why}; a range on the name's [network] allow entry (or allow_private) decides")]
pub struct Refused {
    /// The address.
    pub ip: IpAddr,
    /// Its class, e.g. `loopback (127.0.0.0/8)`.
    pub why: &'static str,
}

/// An address range, `addr/len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n` or `v6/n` (host bits must be zero); a bare
    /// address is the range of that one address.
    pub fn parse(s: &str) -> Result<Cidr, CidrError> {
        let (a, l) = s.split_once('/').unwrap_or((s, ""));
        let range = || s.to_string();
        let net: IpAddr = a.parse().map_err(|_| CidrError::Address {
            range: range(),
            addr: a.to_string(),
        })?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let len = if l.is_empty() {
            max
        } else {
            l.parse::<u8>()
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| CidrError::Length {
                    range: range(),
                    max,
                })?
        };
        let c = Cidr { net, len };
        if !c.contains(net) || masked(net, len) != bits(net) {
            return Err(CidrError::HostBits { range: range() });
        }
        Ok(c)
    }

    /// Whether `ip` is inside (same family only).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.net.is_ipv4() == ip.is_ipv4() && masked(ip, self.len) == bits(self.net)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.len)
    }
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn masked(ip: IpAddr, len: u8) -> u128 {
    let width = if ip.is_ipv4() { 32 } else { 128 };
    let b = bits(ip);
    if len == 0 {
        0
    } else {
        b & (u128::MAX << (width - len as u32)) & (u128::MAX >> (128 - width))
    }
}

/// The IPv4 ranges refused, with their reason.
const V4: [(u32, u8, &str); 14] = [
    (0x0000_0000, 8, "unspecified (0.0.0.0/8)"),
    (0x0a00_0000, 8, "private (10.0.0.0/8)"),
    (0x6440_0000, 10, "shared address space (100.64.0.0/10)"),
    (0x7f00_0000, 8, "loopback (127.0.0.0/8)"),
    (
        0xa9fe_0000,
        16,
        "link-local and cloud metadata (169.254.0.0/16)",
    ),
    (0xac10_0000, 12, "private (172.16.0.0/12)"),
    (0xc000_0000, 24, "IETF protocol assignments (192.0.0.0/24)"),
    (0xc000_0200, 24, "documentation (192.0.2.0/24)"),
    (0xc0a8_0000, 16, "private (192.168.0.0/16)"),
    (0xc612_0000, 15, "benchmarking (198.18.0.0/15)"),
    (0xc633_6400, 24, "documentation (198.51.100.0/24)"),
    (0xcb00_7100, 24, "documentation (203.0.113.0/24)"),
    (0xe000_0000, 4, "multicast (224.0.0.0/4)"),
    (0xf000_0000, 4, "reserved and broadcast (240.0.0.0/4)"),
];

/// The IPv6 ranges refused, with their reason.
const V6: [(u128, u8, &str); 11] = [
    (0, 128, "unspecified (::)"),
    (1, 128, "loopback (::1)"),
    (0xffff_0000_0000, 96, "IPv4-mapped (::ffff:0:0/96)"),
    (0, 96, "IPv4-compatible (::/96)"),
    (0x0064_ff9b << 96, 96, "NAT64 (64:ff9b::/96)"),
    (0x0064_ff9b_0001 << 80, 48, "local NAT64 (64:ff9b:1::/48)"),
    (0x2001_0000 << 96, 32, "Teredo (2001::/32)"),
    (0x2002 << 112, 16, "6to4 (2002::/16)"),
    (0xfc << 120, 7, "unique local, private (fc00::/7)"),
    (0xfe80 << 112, 10, "link-local (fe80::/10)"),
    (0xff << 120, 8, "multicast (ff00::/8)"),
];

/// The IPv4 address an IPv6 one carries and reaches: IPv4-mapped,
/// IPv4-compatible, NAT64 (`64:ff9b::/96`).
fn embedded_v4(ip: IpAddr) -> Option<std::net::Ipv4Addr> {
    let IpAddr::V6(a) = ip else { return None };
    let n = u128::from(a);
    let top = n >> 32;
    // (`::` and `::1` are themselves, not IPv4-compatible addresses.)
    (top == 0xffff || (top == 0 && n > 1) || top == 0x0064_ff9b << 64)
        .then(|| std::net::Ipv4Addr::from((n & 0xffff_ffff) as u32))
}

/// Why `ip` is refused by default, or None for a public address.
pub fn class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(a) => V4
            .iter()
            .find(|(n, l, _)| masked(IpAddr::V4(a), *l) == *n as u128)
            .map(|(_, _, why)| *why),
        IpAddr::V6(a) => V6
            .iter()
            .find(|(n, l, _)| masked(IpAddr::V6(a), *l) == *n)
            .map(|(_, _, why)| *why)
            .or(if (a.segments()[0] & 0xffc0) == 0xfec0 {
                Some("site-local (fec0::/10)")
            } else {
                None
            }),
    }
}

/// Whether the proxy may dial `ip`: public, or covered by `allow_private`.
pub fn check(ip: IpAddr, allow_private: &[Cidr]) -> Result<(), Refused> {
    // An address that embeds an IPv4 one reaches that one: only a range
    // of IPv4 addresses opens it (an IPv6 range such as `::/0` never opens
    // `::ffff:127.0.0.1`).
    let judged = embedded_v4(ip).map(IpAddr::V4).unwrap_or(ip);
    match class(ip) {
        None => Ok(()),
        Some(_) if allow_private.iter().any(|c| c.contains(judged)) => Ok(()),
        Some(why) => Err(Refused { ip, why }),
    }
}

/// The addresses tests and docs name (kept here so the table stays one).
pub const METADATA: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        let refused = [
            "127.0.0.1",
            "10.1.2.3",
            "172.31.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.100.100.200",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:8.8.8.8",
            "fe80::1",
            "fd00:ec2::254",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
            "fec0::1",
            "ff02::1",
        ];
        for a in refused {
            assert!(class(a.parse().unwrap()).is_some(), "{a}");
        }
        for a in [
            "8.8.8.8",
            "151.101.0.223",
            "2a04:4e42::223",
            "172.32.0.1",
            "11.0.0.1",
        ] {
            assert!(class(a.parse().unwrap()).is_none(), "{a}");
        }
        for m in METADATA {
            assert!(class(m).is_some());
        }
    }

    #[test]
    fn an_ipv6_range_never_opens_an_embedded_ipv4_address() {
        let all6 = [Cidr::parse("::/0").unwrap()];
        for a in ["::ffff:127.0.0.1", "::127.0.0.1", "64:ff9b::a9fe:a9fe"] {
            let ip: IpAddr = a.parse().unwrap();
            assert!(check(ip, &all6).is_err(), "{a}");
        }
        // Control: the IPv4 range opens the mapped form of its address.
        let lo = [Cidr::parse("127.0.0.0/8").unwrap()];
        assert!(check("::ffff:127.0.0.1".parse().unwrap(), &lo).is_ok());
        assert!(check("::ffff:10.0.0.1".parse().unwrap(), &lo).is_err());
        assert!(check("fd00::1".parse().unwrap(), &all6).is_ok());
        assert!(check("::1".parse().unwrap(), &all6).is_ok());
        let all4 = [Cidr::parse("0.0.0.0/0").unwrap()];
        assert!(check("::1".parse().unwrap(), &all4).is_err());
    }

    #[test]
    fn cidrs() {
        let c = Cidr::parse("127.0.0.0/8").unwrap();
        assert!(c.contains("127.9.9.9".parse().unwrap()));
        assert!(!c.contains("128.0.0.1".parse().unwrap()));
        assert!(!c.contains("::ffff:127.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("127.0.0.1/8").is_err());
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("fd00::/8").is_ok());
        assert!(Cidr::parse("0.0.0.0/0").is_ok());
        assert!(check("127.0.0.1".parse().unwrap(), &[c]).is_ok());
        assert!(check("10.0.0.1".parse().unwrap(), &[c]).is_err());
    }
}
