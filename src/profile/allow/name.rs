//! Host names for the proxy: one canonical form, and the allowlist's rules.
//!
//! The canonical form is ASCII only: lowercase, one trailing dot removed,
//! labels of `a-z 0-9 - _` (1–63 bytes each, 253 in all), the last label
//! starting with a letter (so no spelling of an IP address, `127.1` or
//! `0x7f.1`, is a name). A name with any other byte (Unicode included) is
//! refused rather than converted: internationalized names are written in
//! their punycode form (`xn--…`), in the profile and by the client alike.

use super::addr::Cidr;
use crate::profile::AllowEntry;

/// The port a CONNECT goes to when the allowlist entry names none.
pub const CONNECT_PORT: u16 = 443;
/// The port plain HTTP goes to when the allowlist entry names none.
pub const HTTP_PORT: u16 = 80;

/// Why a string is not a host name in the canonical form (a profile's
/// entry, a client's target or server name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Empty, or longer than DNS allows.
    #[error("not a host name (empty or over 253 bytes)")]
    Length,
    /// Unicode or other non-ASCII bytes.
    #[error("not an ASCII name (write internationalized names in punycode, xn--…)")]
    NotAscii,
    /// An IP address, in any spelling Rust parses, or bracketed.
    #[error("an IP address: the allowlist names hosts, never addresses")]
    Address,
    /// A label that is no DNS label (lowercased).
    #[error("label {0:?} is not a DNS label")]
    Label(String),
    /// A numeric last label.
    #[error("the last label must start with a letter (numeric names are addresses)")]
    Numeric,
}

/// Why `host:port` does not split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// `[v6]` followed by something other than `:port`.
    #[error("junk after ']'")]
    Junk,
    /// `[` without its `]`.
    #[error("unclosed '['")]
    Unclosed,
    /// 0, or over 65535.
    #[error("port {0:?} is out of range")]
    Range(String),
    /// Not digits.
    #[error("port {0:?} is not a number")]
    NotNumber(String),
}

/// Why an allowlist entry was refused; each message starts with the entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// Its port.
    #[error("{entry:?}: {source}")]
    Port {
        /// The entry as written.
        entry: String,
        /// Why.
        source: PortError,
    },
    /// A `*` anywhere but a leading `*.`.
    #[error("{entry:?}: '*' is allowed only as a leading \"*.\"")]
    Wildcard {
        /// The entry as written.
        entry: String,
    },
    /// Its name.
    #[error("{entry:?}: {source}")]
    Name {
        /// The entry as written.
        entry: String,
        /// Why.
        source: NameError,
    },
    /// One of its ranges.
    #[error("{entry:?}: range {range:?}: {source}")]
    Range {
        /// The entry as written.
        entry: String,
        /// The range as written.
        range: String,
        /// Why.
        source: super::addr::CidrError,
    },
    /// A table entry without ranges.
    #[error("{entry:?}: a table entry needs at least one range (write the name alone otherwise)")]
    NoRange {
        /// The entry as written.
        entry: String,
    },
}

/// The canonical form of `raw`, or why it is not a host name.
pub fn canonical(raw: &str) -> Result<String, NameError> {
    let name = raw.strip_suffix('.').unwrap_or(raw);
    if name.is_empty() || name.len() > 253 {
        return Err(NameError::Length);
    }
    if !name.is_ascii() {
        return Err(NameError::NotAscii);
    }
    if name.parse::<std::net::IpAddr>().is_ok() || name.starts_with('[') {
        return Err(NameError::Address);
    }
    let lower = name.to_ascii_lowercase();
    for label in lower.split('.') {
        let ok = (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(NameError::Label(label.to_string()));
        }
    }
    let last = lower.rsplit('.').next().unwrap_or("");
    if !last.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(NameError::Numeric);
    }
    Ok(lower)
}

/// Splits `host:port` (a port is optional); `[v6]:port` is split too, so
/// that [`canonical`] can refuse the address by name.
pub fn split_port(s: &str) -> Result<(&str, Option<u16>), PortError> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, "")) => (h, None),
            Some((h, p)) => (h, Some(p.strip_prefix(':').ok_or(PortError::Junk)?)),
            None => return Err(PortError::Unclosed),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => (s, None),
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 5 => {
            match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(PortError::Range(p.to_string())),
                Ok(n) => Some(n),
            }
        }
        Some(p) => return Err(PortError::NotNumber(p.to_string())),
    };
    Ok((host, port))
}

/// One allowlist entry: `name`, `*.suffix`, either with `:port`, and the
/// refused ranges the name's addresses may be in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `*.` entries match names strictly below `name`.
    pub suffix: bool,
    /// The canonical name (without `*.`).
    pub name: String,
    /// The port; none means 443 for CONNECT and 80 for plain HTTP.
    pub port: Option<u16>,
    /// Ranges refused by default that this name's addresses may be in.
    pub ranges: Vec<Cidr>,
}

impl Rule {
    /// Parses a profile's allowlist entry, its ranges included.
    pub(crate) fn of(entry: &AllowEntry) -> Result<Rule, RuleError> {
        let mut r = Rule::parse(entry.name())?;
        for c in entry.ranges() {
            r.ranges
                .push(Cidr::parse(c).map_err(|source| RuleError::Range {
                    entry: entry.name().to_string(),
                    range: c.to_string(),
                    source,
                })?);
        }
        if matches!(entry, AllowEntry::Ranged(_)) && r.ranges.is_empty() {
            let entry = entry.name().to_string();
            return Err(RuleError::NoRange { entry });
        }
        Ok(r)
    }

    /// Parses an allowlist entry.
    pub fn parse(entry: &str) -> Result<Rule, RuleError> {
        let (host, port) = split_port(entry).map_err(|source| RuleError::Port {
            entry: entry.to_string(),
            source,
        })?;
        let (suffix, host) = match host.strip_prefix("*.") {
            Some(h) => (true, h),
            None => (false, host),
        };
        if host.contains('*') {
            let entry = entry.to_string();
            return Err(RuleError::Wildcard { entry });
        }
        let name = canonical(host).map_err(|source| RuleError::Name {
            entry: entry.to_string(),
            source,
        })?;
        Ok(Rule {
            suffix,
            name,
            port,
            ranges: vec![],
        })
    }

    /// Whether the canonical `host` on `port` matches (`default`: the
    /// method's port for an entry that names none).
    pub fn matches(&self, host: &str, port: u16, default: u16) -> bool {
        if self.port.unwrap_or(default) != port {
            return false;
        }
        if self.suffix {
            host.len() > self.name.len() + 1
                && host.ends_with(&self.name)
                && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
        } else {
            host == self.name
        }
    }

    /// The entry as written canonically (its ranges after it).
    pub fn show(&self) -> String {
        let star = if self.suffix { "*." } else { "" };
        let name = match self.port {
            Some(p) => format!("{star}{}:{p}", self.name),
            None => format!("{star}{}", self.name),
        };
        if self.ranges.is_empty() {
            return name;
        }
        let r: Vec<String> = self.ranges.iter().map(|c| c.to_string()).collect();
        format!("{name} (in {})", r.join(", "))
    }
}

/// Whether any rule allows the canonical `host` on `port`: None when none
/// does, else the ranges the matching rules add (an address must be public
/// or in one of them, or in `allow_private`).
pub fn allowed<'a>(
    rules: &'a [Rule],
    host: &str,
    port: u16,
    default: u16,
) -> Option<Vec<&'a Cidr>> {
    let mut hit = rules
        .iter()
        .filter(|r| r.matches(host, port, default))
        .peekable();
    hit.peek()?;
    Some(hit.flat_map(|r| r.ranges.iter()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms() {
        assert_eq!(canonical("PyPI.Org.").unwrap(), "pypi.org");
        assert!(canonical("pypi.org..").is_err());
        assert!(canonical("exämple.test").is_err());
        assert!(canonical("127.0.0.1").is_err());
        assert!(canonical("127.1").is_err());
        assert!(canonical("0x7f.1").is_err());
        assert!(canonical("::1").is_err());
        assert!(canonical("a b.test").is_err());
        assert_eq!(
            canonical("xn--bcher-kva.test").unwrap(),
            "xn--bcher-kva.test"
        );
    }

    #[test]
    fn rules_match() {
        let r = Rule::parse("*.crates.io").unwrap();
        assert!(r.matches("static.crates.io", 443, 443));
        assert!(r.matches("a.b.crates.io", 80, 80));
        assert!(!r.matches("crates.io", 443, 443));
        assert!(!r.matches("evilcrates.io", 443, 443));
        assert!(!r.matches("static.crates.io", 8443, 443));
        let p = Rule::parse("Mirror.Test:8443").unwrap();
        assert!(p.matches("mirror.test", 8443, 443));
        assert!(!p.matches("mirror.test", 443, 443));
        assert!(Rule::parse("*").is_err());
        assert!(Rule::parse("a.*.test").is_err());
        assert!(Rule::parse("x.test:0").is_err());
        assert!(Rule::parse("10.0.0.1").is_err());
    }

    #[test]
    fn an_entrys_ranges_go_with_its_name_only() {
        use crate::profile::RangedName;
        let ranged = AllowEntry::Ranged(RangedName {
            name: "mirror.test".into(),
            ranges: vec!["10.20.0.0/16".into()],
        });
        let rules = [
            Rule::of(&ranged).unwrap(),
            Rule::of(&AllowEntry::Name("other.test".into())).unwrap(),
        ];
        let r = allowed(&rules, "mirror.test", 443, 443).unwrap();
        assert_eq!(r, vec![&Cidr::parse("10.20.0.0/16").unwrap()]);
        assert!(allowed(&rules, "other.test", 443, 443).unwrap().is_empty());
        assert!(allowed(&rules, "third.test", 443, 443).is_none());
        assert_eq!(rules[0].show(), "mirror.test (in 10.20.0.0/16)");
        let empty = AllowEntry::Ranged(RangedName {
            name: "m.test".into(),
            ranges: vec![],
        });
        let e = Rule::of(&empty).unwrap_err();
        assert!(matches!(e, RuleError::NoRange { .. }), "{e}");
        assert!(e.to_string().contains("at least one range"));
    }
}
