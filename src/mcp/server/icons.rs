//! The icon (MCP 2025-11-25 `Icon`: `src`, `mimeType`, `sizes`) on the
//! server's implementation, its resources, resource templates and prompts.
//!
//! One 16×16 two-colour PNG (a terminal: `>` and `_` in a frame), 116 bytes,
//! as a `data:` URI with Base64 data, the form the spec names besides HTTP(S)
//! URLs: nothing for a client to fetch, and PNG is a type every client that
//! shows icons MUST support and that carries no script (the spec warns that
//! SVG can). Tools carry none: 49 copies of even a 1×1 PNG add about 6.7 KB
//! to `tools/list`, whose default surface has a 36,000-byte budget
//! (tests/mcp/test_surface.py); clients show the server's icon beside its
//! tools.

use rmcp::model::Icon;

/// The PNG, Base64 (made from a 16×16 bitmap, palette #1e1e1e / #33cc33).
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAABAAAAAQAQMAAAAlPW0iAAAABlBMVEUeHh4zzDMNH3H2AAAAKUlEQVR42mNgYGCo/8fgwMQQwMTgwcTgwsTgBCY9wCJAcYdfIBKoBgwAqGgHA8/l1gkAAAAASUVORK5CYII=";

/// The icons of everything but tools.
pub(crate) fn icons() -> Vec<Icon> {
    let mut i = Icon::new(format!("data:image/png;base64,{PNG}"));
    i.mime_type = Some("image/png".into());
    i.sizes = Some(vec!["16x16".into()]);
    vec![i]
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    #[test]
    fn the_icon_is_a_16_by_16_png() {
        let b = base64::engine::general_purpose::STANDARD
            .decode(super::PNG)
            .unwrap();
        assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&b[12..16], b"IHDR");
        assert_eq!(
            (&b[16..20], &b[20..24]),
            (&[0, 0, 0, 16][..], &[0, 0, 0, 16][..])
        );
        assert!(b.ends_with(b"IEND\xaeB`\x82"));
    }
}
