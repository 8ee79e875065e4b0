use super::*;
use serde_json::json;

/// The catalog's check, as the protocol layer hands it in.
fn checked_name(name: &str) -> Option<Name<'_>> {
    crate::mcp::shown::checked_name(name)
}

#[test]
fn the_arguments_are_json_that_parses_back_and_draws_nothing() {
    let args = json!({"k": "a   b\n\u{202e}\u{1f600}\x1b[2J\"}", "  x": 1});
    let d = detail(&args);
    assert_eq!(d.cut_from, None);
    assert!(
        d.text.bytes().all(|b| (0x20..0x7f).contains(&b)),
        "{}",
        d.text
    );
    assert!(!d.text.contains("  "), "{}", d.text);
    assert!(
        d.text
            .contains(r#"a \u0020\u0020b\n\u202e\ud83d\ude00\u001b[2J\"}"#),
        "{}",
        d.text
    );
    assert_eq!(serde_json::from_str::<Value>(&d.text).unwrap(), args);
}

#[test]
fn long_arguments_are_cut_between_escaped_forms() {
    for pad in 0..8 {
        let v = format!("{}{}", "x".repeat(pad), "\u{202e}".repeat(200));
        let d = detail(&json!({ "k": v }));
        assert!(d.cut_from.is_some_and(|n| n > DETAIL_MAX), "{d:?}");
        assert!(
            d.text.len() <= DETAIL_MAX && d.text.len() > DETAIL_MAX - 6,
            "{d:?}"
        );
        assert!(
            d.text.ends_with("\\u202e") || d.text.ends_with('x'),
            "{d:?}"
        );
    }
    let d = detail(&json!({ "k": "y".repeat(DETAIL_MAX - 8) }));
    assert_eq!((d.cut_from, d.text.len()), (None, DETAIL_MAX));
}

#[test]
fn chunks_fit_and_keep_escaped_forms_whole() {
    let text = detail(&json!({"k": "ab\u{202e}c\"d\\e f  g".repeat(9)})).text;
    for width in 1..40 {
        let cs = chunks(&text, width);
        assert_eq!(cs.concat(), text);
        for c in &cs {
            assert!(c.len() <= width.max(6), "{width}: {c}");
            let cut_inside = c.ends_with('\\') && !c.ends_with("\\\\")
                || c.rfind("\\u").is_some_and(|i| c.len() - i < 6);
            assert!(!cut_inside, "{width}: {c}");
        }
    }
    for line in labelled(&text, 60) {
        assert!(line.starts_with(LABEL) && line.len() < 60, "{line}");
    }
}

#[test]
fn only_sandmux_forms_of_names_are_checked() {
    assert_eq!(
        checked_name("tool kill_session"),
        Some(Name::Tool("kill_session"))
    );
    assert_eq!(
        checked_name("https://docs.example.org:443"),
        Some(Name::Host("https://docs.example.org:443"))
    );
    assert!(checked_name("http://a-b_c.test:80").is_some());
    for bad in [
        "tool no_such_tool",
        "tool kill_session with {}",
        "https://a b.test:443",
        "https://x.test:443? (waiting 1 s",
        "https://X.test:443",
        "https://127.0.0.1:443",
        "ftp://x.test:21",
        "https://x.test:0",
        "https://x.test:443:443",
        "https://x.test",
        "https://x.test:+443",
        "x.test:443",
        "",
    ] {
        assert_eq!(checked_name(bad), None, "{bad}");
    }
}
