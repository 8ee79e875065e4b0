//! Property-based fuzzing of what the proxy parses from inside the sandbox
//! (`sandmux::proxy`): the ClientHello parser and the request-head checks on
//! arbitrary and mutated bytes (never a panic, every verdict bounded), the
//! name matcher against a reference model, and the address classifier
//! against the standard library's own predicates. Every test prints how
//! many inputs it ran (`fuzz_proxy: ...`).

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sandmux::testing::addr::{check as addr_check, class, Cidr};
use sandmux::testing::head::{self, Parsed};
use sandmux::testing::hello::{self, Hello};
use sandmux::testing::name::{canonical, Rule};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::props;
use props::check;

/// A valid ClientHello with some bytes flipped, cut or appended.
fn mutated_hello() -> impl Strategy<Value = Vec<u8>> {
    (
        "[a-z]{1,10}\\.test",
        prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        any::<usize>(),
        prop::collection::vec(any::<u8>(), 0..8),
    )
        .prop_map(|(sni, flips, cut, tail)| {
            let mut h = hello::sample(&sni);
            for (at, b) in flips {
                let i = at % h.len();
                h[i] = b;
            }
            h.truncate(cut % (h.len() + 1));
            h.extend(tail);
            h
        })
}

#[test]
fn hello_parser_never_panics_and_is_bounded() {
    let bytes = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..600),
        mutated_hello(),
        // Record headers that claim much more than there is.
        (any::<u16>(), any::<u8>()).prop_map(|(len, t)| {
            let mut v = vec![22, 3, 1];
            v.extend(len.to_be_bytes());
            v.extend([t, 0xff, 0xff, 0xff]);
            v
        }),
    ];
    check("hello_parser", 20_000, bytes, |b| {
        match hello::parse(&b) {
            Hello::More => prop_assert!(b.len() < hello::MAX_BYTES),
            Hello::Sni(n) => {
                prop_assert_eq!(canonical(&n).ok(), Some(n.clone()));
                prop_assert!(n.len() <= 253);
            }
            Hello::Refused(why) => prop_assert!(!why.is_empty() && why.len() < 200),
        }
        Ok(())
    });
}

#[test]
fn hello_parser_finds_the_name_however_the_bytes_arrive() {
    check(
        "hello_in_pieces",
        2_000,
        ("[a-zA-Z0-9-]{1,20}(\\.[a-z]{1,8}){1,3}\\.?", any::<usize>()),
        |(sni, cut)| {
            let h = hello::sample(&sni);
            let cut = cut % h.len();
            prop_assert_eq!(hello::parse(&h[..cut]), Hello::More);
            match (canonical(&sni), hello::parse(&h)) {
                (Ok(want), Hello::Sni(got)) => prop_assert_eq!(want, got),
                (Err(_), Hello::Refused(_)) => {}
                (w, g) => prop_assert!(false, "{:?} vs {:?}", w, g),
            }
            Ok(())
        },
    );
}

/// Request heads: well-formed shapes with random parts, and junk.
fn heads() -> impl Strategy<Value = Vec<u8>> {
    let method = prop_oneof![
        Just("CONNECT".to_string()),
        Just("GET".to_string()),
        Just("POST".to_string()),
        "[A-Z]{1,7}"
    ];
    let target = prop_oneof![
        "[a-zA-Z0-9.-]{0,20}(:[0-9]{0,6})?",
        "(http|https|HTTP|ftp)://[a-zA-Z0-9.@\\[\\]:-]{0,24}(/[ -~]{0,10})?",
        "/[ -~]{0,10}",
    ];
    let header = prop_oneof![
        "(Host|Content-Length|Transfer-Encoding|Proxy-Authorization|X)(: ?)[ -~]{0,16}",
        "[ -~]{0,20}",
    ];
    prop_oneof![
        (
            method,
            target,
            prop::collection::vec(header, 0..6),
            any::<bool>()
        )
            .prop_map(|(m, t, hs, end)| {
                let mut s = format!("{m} {t} HTTP/1.1\r\n");
                for h in hs {
                    s.push_str(&h);
                    s.push_str("\r\n");
                }
                if end {
                    s.push_str("\r\n");
                }
                s.into_bytes()
            }),
        prop::collection::vec(any::<u8>(), 0..300),
    ]
}

#[test]
fn request_heads_never_panic_and_what_passes_is_consistent() {
    check("request_heads", 20_000, heads(), |b| {
        match head::parse(&b) {
            Parsed::More | Parsed::Bad(..) => {}
            Parsed::Done(r) => {
                prop_assert!(r.len <= b.len());
                prop_assert_eq!(canonical(&r.host).ok(), Some(r.host.clone()));
                prop_assert!(r.port != 0);
                prop_assert_eq!(r.method == "CONNECT", r.forward.is_none());
                if let Some((up, _)) = &r.forward {
                    let text = String::from_utf8_lossy(up).to_ascii_lowercase();
                    prop_assert!(!text.contains("\r\nproxy-"), "{}", text);
                    prop_assert!(!text.contains("\r\ntransfer-encoding"), "{}", text);
                    prop_assert!(text.ends_with("connection: close\r\n\r\n"));
                    prop_assert_eq!(text.matches("\r\nhost:").count(), 1);
                }
            }
        }
        Ok(())
    });
}

/// The reference: a name matches an entry when equal, or for `*.x` when it
/// ends with `.x` and has more before it.
fn model(entry: &str, suffix: bool, host: &str) -> bool {
    if suffix {
        host.strip_suffix(entry)
            .is_some_and(|p| p.len() > 1 && p.ends_with('.'))
    } else {
        host == entry
    }
}

#[test]
fn matcher_agrees_with_the_model_in_any_case_and_spelling() {
    let label = "[a-c]{1,3}";
    let name = prop::collection::vec(label, 1..4).prop_map(|v| v.join("."));
    check(
        "matcher",
        20_000,
        (
            name.clone(),
            name,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            prop::option::of(prop_oneof![Just(443u16), Just(8443)]),
        ),
        |(entry, host, suffix, upper, dot, port)| {
            let e = format!(
                "{}{entry}.x{}",
                if suffix { "*." } else { "" },
                port.map(|p| format!(":{p}")).unwrap_or_default()
            );
            let rule = Rule::parse(&e).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut asked = format!("{host}.x");
            if upper {
                asked = asked.to_ascii_uppercase();
            }
            if dot {
                asked.push('.');
            }
            let canon = canonical(&asked).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want = model(&format!("{entry}.x"), suffix, &format!("{host}.x"));
            prop_assert_eq!(rule.matches(&canon, port.unwrap_or(443), 443), want);
            // Another port never matches.
            prop_assert!(!rule.matches(&canon, 9, 443));
            Ok(())
        },
    );
}

#[test]
fn names_with_other_bytes_are_refused() {
    check("names_refused", 10_000, "[ -~\u{a0}-\u{17f}]{1,20}", |s| {
        if let Ok(c) = canonical(&s) {
            prop_assert!(c.bytes().all(|b| b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || b == b'.'
                || b == b'-'
                || b == b'_'));
            prop_assert!(c.parse::<IpAddr>().is_err());
            prop_assert!(!c.ends_with('.'));
        }
        Ok(())
    });
}

#[test]
fn classifier_refuses_what_the_standard_library_calls_special() {
    let v4 = any::<u32>().prop_map(|n| IpAddr::V4(Ipv4Addr::from(n)));
    let v6 = prop_oneof![
        any::<u128>().prop_map(|n| IpAddr::V6(Ipv6Addr::from(n))),
        any::<u32>().prop_map(|n| IpAddr::V6(Ipv4Addr::from(n).to_ipv6_mapped())),
        any::<u32>().prop_map(|n| IpAddr::V6(Ipv6Addr::from((0x64_ff9b_u128 << 96) | n as u128))),
    ];
    check("classifier", 50_000, prop_oneof![v4, v6], |ip| {
        let special = match ip {
            IpAddr::V4(a) => {
                a.is_loopback()
                    || a.is_private()
                    || a.is_link_local()
                    || a.is_unspecified()
                    || a.is_multicast()
                    || a.is_broadcast()
                    || a.is_documentation()
                    || (a.octets()[0] == 100 && (a.octets()[1] & 0xc0) == 64)
            }
            IpAddr::V6(a) => {
                a.is_loopback()
                    || a.is_unspecified()
                    || a.is_multicast()
                    || a.to_ipv4_mapped().is_some()
                    || (a.segments()[0] & 0xfe00) == 0xfc00
                    || (a.segments()[0] & 0xffc0) == 0xfe80
            }
        };
        if special {
            prop_assert!(class(ip).is_some(), "{} passed", ip);
            prop_assert!(addr_check(ip, &[]).is_err());
        }
        // A range covering the address always lets it through; an IPv6
        // address that embeds an IPv4 one (mapped, compatible, NAT64) is
        // judged as that IPv4 address: only an IPv4 range opens it.
        let embeds = match ip {
            IpAddr::V6(a) => {
                let (n, top) = (u128::from(a), u128::from(a) >> 32);
                top == 0xffff || (top == 0 && n > 1) || top == 0x64_ff9b << 64
            }
            IpAddr::V4(_) => false,
        };
        let all4 = Cidr::parse("0.0.0.0/0").map_err(|e| TestCaseError::fail(e.to_string()))?;
        let all6 = Cidr::parse("::/0").map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (opens, not) = match (ip.is_ipv4(), embeds) {
            (true, _) | (false, true) => (all4, all6),
            (false, false) => (all6, all4),
        };
        prop_assert!(addr_check(ip, &[opens]).is_ok());
        if class(ip).is_some() {
            prop_assert!(addr_check(ip, &[not]).is_err(), "{} opened by {}", ip, not);
        }
        Ok(())
    });
}
