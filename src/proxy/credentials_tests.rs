//! Unit tests of `credentials.rs`: substitution, refusals, rotation,
//! revocation and masking.

use super::*;
use std::os::unix::fs::PermissionsExt;

fn write(p: &std::path::Path, v: &str) {
    std::fs::write(p, v).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o400)).unwrap();
}

fn vault(dir: &std::path::Path) -> (Vault, String) {
    let f = dir.join("tok");
    write(&f, "first-secret-value\n");
    let c = Credential {
        name: "TOK".into(),
        send_to: vec!["api.test".into()],
        from_file: Some(f),
        ..Default::default()
    };
    let v = Vault::open(&[c], &[]).unwrap().unwrap();
    let ph = v.held[0].placeholder.clone();
    (v, ph)
}

/// Replaced in headers (Basic too) for its host only; refused elsewhere;
/// a file rotated is read again, an unusable one sends nothing.
#[test]
fn a_placeholder_becomes_the_value_only_where_it_belongs() {
    let d = tempfile::tempdir().unwrap();
    let (v, ph) = vault(d.path());
    let bearer = format!("Bearer {ph}");
    let got = v
        .header("authorization", bearer.as_bytes(), "api.test")
        .unwrap()
        .unwrap();
    assert_eq!(got, b"Bearer first-secret-value");
    use base64::Engine;
    let e = base64::engine::general_purpose::STANDARD;
    let basic = format!("Basic {}", e.encode(format!("x:{ph}")));
    let got = v
        .header("authorization", basic.as_bytes(), "api.test")
        .unwrap()
        .unwrap();
    assert_eq!(
        got,
        format!("Basic {}", e.encode("x:first-secret-value")).as_bytes()
    );
    let r = v
        .header("authorization", bearer.as_bytes(), "other.test")
        .unwrap_err();
    assert!(r.exfiltration && r.why.contains("other.test"), "{r:?}");
    assert!(v
        .refuse_in(format!("/x?t={ph}").as_bytes(), "api.test", "in the URL")
        .is_err());
    assert_eq!(
        v.header("authorization", b"Bearer nothing", "api.test"),
        Ok(None)
    );
    only_in_its_shapes(&v, &ph);
    let got = v
        .header("authorization", ph.as_bytes(), "api.test")
        .unwrap();
    assert_eq!(got.unwrap(), b"first-secret-value");
    // Rotation: the new value at once; an unusable file sends nothing.
    let f = d.path().join("tok");
    std::fs::remove_file(&f).unwrap();
    write(&f, "second-secret-value");
    let got = v
        .header("authorization", bearer.as_bytes(), "api.test")
        .unwrap()
        .unwrap();
    assert_eq!(got, b"Bearer second-secret-value");
    // The value rotated out is still masked in answers.
    let mut b = b"old first-secret-value".to_vec();
    let out = crate::proxy::scan::mask(&mut b, &v.masks(&[]), true);
    assert_eq!(out, format!("old {ph}").as_bytes());
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = v
        .header("authorization", bearer.as_bytes(), "api.test")
        .unwrap_err();
    assert_eq!((r.code, r.exfiltration), (503, false), "{r:?}");
    // Revoked: refused, not an exfiltration; granted again: served.
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o400)).unwrap();
    assert!(v.set_granted("TOK", false) && !v.set_granted("NOPE", false));
    assert_eq!(
        v.header("authorization", bearer.as_bytes(), "api.test")
            .unwrap_err()
            .code,
        403
    );
    v.set_granted("TOK", true);
    assert!(v
        .header("authorization", bearer.as_bytes(), "api.test")
        .is_ok());
}

/// Only in its headers, and only in the shapes a credential has: anywhere
/// else the placeholder is an exfiltration.
fn only_in_its_shapes(v: &Vault, ph: &str) {
    use base64::Engine;
    let e = base64::engine::general_purpose::STANDARD;
    for (name, value) in [
        ("x-request-id", ph.to_string()),
        ("authorization", format!("Bearer {ph} more")),
        ("authorization", format!("Bearer x{ph}")),
        ("authorization", format!("https://api.test/?t={ph}")),
        (
            "authorization",
            format!("Basic {}", e.encode(format!("{ph}:x"))),
        ),
        (
            "authorization",
            format!("Basic {}", e.encode(format!("x:y{ph}"))),
        ),
    ] {
        let r = v.header(name, value.as_bytes(), "api.test").unwrap_err();
        assert!(r.exfiltration, "{name}: {value}: {r:?}");
    }
}

/// The value in an answer, as it is, in hex and in base64 at any
/// alignment, is masked.
#[test]
fn every_common_spelling_of_the_value_is_masked() {
    let d = tempfile::tempdir().unwrap();
    let (v, ph) = vault(d.path());
    use base64::Engine;
    let e = base64::engine::general_purpose::STANDARD;
    let value = "first-secret-value";
    let hex: String = value.bytes().map(|b| format!("{b:02x}")).collect();
    for text in [
        format!("token={value}!"),
        format!("hex {hex}"),
        e.encode(format!("x:{value}")),
        e.encode(format!("xy:{value}")),
        e.encode(format!("xyz:{value}")),
    ] {
        let mut b = text.clone().into_bytes();
        let out = crate::proxy::scan::mask(&mut b, &v.masks(&[]), true);
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains(&ph), "{text} -> {out}");
        let decoded = e.decode(out.as_bytes()).unwrap_or_default();
        assert!(
            !out.contains(value)
                && !out.contains(&hex)
                && !String::from_utf8_lossy(&decoded).contains(value),
            "{text} -> {out}"
        );
    }
}
