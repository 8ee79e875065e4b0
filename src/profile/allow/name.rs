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

/// The canonical form of `raw`, or why it is not a host name.
pub fn canonical(raw: &str) -> Result<String, String> {
    let name = raw.strip_suffix('.').unwrap_or(raw);
    if name.is_empty() || name.len() > 253 {
        return Err("not a host name (empty or over 253 bytes)".into());
    }
    if !name.is_ascii() {
        return Err("not an ASCII name (write internationalized names in punycode, xn--…)".into());
    }
    if name.parse::<std::net::IpAddr>().is_ok() || name.starts_with('[') {
        return Err("an IP address: the allowlist names hosts, never addresses".into());
    }
    let lower = name.to_ascii_lowercase();
    for label in lower.split('.') {
        let ok = (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(format!("label {label:?} is not a DNS label"));
        }
    }
    let last = lower.rsplit('.').next().unwrap_or("");
    if !last.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err("the last label must start with a letter (numeric names are addresses)".into());
    }
    Ok(lower)
}

/// Splits `host:port` (a port is optional); `[v6]:port` is split too, so
/// that [`canonical`] can refuse the address by name.
pub fn split_port(s: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, "")) => (h, None),
            Some((h, p)) => (h, Some(p.strip_prefix(':').ok_or("junk after ']'")?)),
            None => return Err("unclosed '['".into()),
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
                Ok(0) | Err(_) => return Err(format!("port {p:?} is out of range")),
                Ok(n) => Some(n),
            }
        }
        Some(p) => return Err(format!("port {p:?} is not a number")),
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
    pub(crate) fn of(entry: &AllowEntry) -> Result<Rule, String> {
        let mut r = Rule::parse(entry.name())?;
        for c in entry.ranges() {
            r.ranges
                .push(Cidr::parse(c).map_err(|e| format!("{:?}: range {c:?}: {e}", entry.name()))?);
        }
        if matches!(entry, AllowEntry::Ranged(_)) && r.ranges.is_empty() {
            return Err(format!(
                "{:?}: a table entry needs at least one range (write the name alone otherwise)",
                entry.name()
            ));
        }
        Ok(r)
    }

    /// Parses an allowlist entry.
    pub fn parse(entry: &str) -> Result<Rule, String> {
        let (host, port) = split_port(entry).map_err(|e| format!("{entry:?}: {e}"))?;
        let (suffix, host) = match host.strip_prefix("*.") {
            Some(h) => (true, h),
            None => (false, host),
        };
        if host.contains('*') {
            return Err(format!(
                "{entry:?}: '*' is allowed only as a leading \"*.\""
            ));
        }
        let name = canonical(host).map_err(|e| format!("{entry:?}: {e}"))?;
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
        assert!(Rule::of(&empty).unwrap_err().contains("at least one range"));
    }
}
