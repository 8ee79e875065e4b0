//! Property-based fuzzing of the replay filter (`runtime::replay_filter`), the
//! byte parser between pane output and a viewer's terminal. Deterministic
//! (proptest, fixed case counts) so it runs in CI; the coverage-guided
//! counterpart is `fuzz/fuzz_targets/replay_filter.rs` (bench/fuzz).
//!
//! The output is checked by an allowlist written here independently of the
//! filter: every escape sequence it holds must be one the docs say is kept.

use proptest::prelude::*;

use crate::props;
use props::check;
use proptest::test_runner::TestCaseError;
use sandmux::testing::replay_filter::{filter_all, Filter, CSI_MAX};

use crate::spec;
use spec::allowed;

/// Sequences that act on the viewer's terminal, each terminated.
const HOSTILE: &[&str] = &[
    "\x1b]52;c;SE9TVElMRQ==\x07",
    "\x1b]52;p;SE9TVElMRQ==\x1b\\",
    "\x1b]0;HOSTILE-TITLE\x07",
    "\x1b]2;HOSTILE-TITLE\x1b\\",
    "\x1b]8;;https://HOSTILE.example/\x1b\\",
    "\x1b]8;;\x1b\\",
    "\x1b]4;1;rgb:ff/00/00\x07",
    "\x1b]11;?\x07",
    "\x1bP$qm\x1b\\",
    "\x1bP+q436f\x1b\\",
    "\x1bPtmux;\x1b\x1b]52;c;SE9TVElMRQ==\x07\x1b\\",
    "\x1b_HOSTILE-APC\x1b\\",
    "\x1b^HOSTILE-PM\x1b\\",
    "\x1bXHOSTILE-SOS\x1b\\",
    "\x1bkHOSTILE-NAME\x1b\\",
    "\x1b[c",
    "\x1b[0c",
    "\x1b[>c",
    "\x1b[=c",
    "\x1b[5n",
    "\x1b[6n",
    "\x1b[?6n",
    "\x1b[21t",
    "\x1b[14t",
    "\x1b[8;100;300t",
    "\x1b[>q",
    "\x1b[?u",
    "\x1b[$p",
    "\x1b[?1$p",
    "\x1b[?1000h",
    "\x1b[?1002h",
    "\x1b[?1003h",
    "\x1b[?1004h",
    "\x1b[?1006h",
    "\x1b[?1015h",
    "\x1b[?9h",
    "\x1b[?1h",
    "\x1b[?3h",
    "\x1b[>4;2m",
    "\x1b[2 q",
    "\x1b[!p",
    "\x1b[3J",
    "\x1b[20h",
    "\x1b[5i",
    "\x1bZ",
    "\x1bc",
    "\x1b=",
    "\x1b#8",
    "\x07",
    "\x05",
    "\u{9b}",
    "\u{9d}",
    "\u{90}",
];

/// Escape sequences and text the docs say are kept unchanged.
fn benign() -> impl Strategy<Value = String> {
    let n = || 0u32..300;
    prop_oneof![
        4 => "[a-zA-Z0-9 .,é漢🙂\t\r\n]{0,12}",
        1 => prop::collection::vec(0u32..256, 0..6).prop_map(|v| {
            let p: Vec<String> = v.iter().map(|x| x.to_string()).collect();
            format!("\x1b[{}m", p.join(";"))
        }),
        1 => (0u32..256, 0u32..256, 0u32..256).prop_map(|(r, g, b)| format!("\x1b[38:2::{r}:{g}:{b}m")),
        1 => (n(), n()).prop_map(|(a, b)| format!("\x1b[{a};{b}H")),
        1 => (n(), prop::sample::select(&b"@ABCDEFGIKLMPSXZ`abdefgT"[..])).prop_map(|(a, f)| format!("\x1b[{a}{}", f as char)),
        1 => (0u32..3).prop_map(|a| format!("\x1b[{a}J")),
        1 => (n(), n()).prop_map(|(a, b)| format!("\x1b[{a};{b}r")),
        1 => prop::sample::select(&[5u32, 6, 7, 25, 47, 1047, 1048, 1049, 2004, 2026][..])
            .prop_flat_map(|m| prop::sample::select(&["h", "l"][..]).prop_map(move |f| format!("\x1b[?{m}{f}"))),
        1 => prop::sample::select(&["\x1b7", "\x1b8", "\x1bD", "\x1bE", "\x1bH", "\x1bM", "\x1b(0", "\x1b(B", "\x1b)0", "\x1b[s", "\x1b[u", "\x1b[4h", "\x1b[4l", "\x0e", "\x0f", "\x08"][..]).prop_map(str::to_string),
    ]
}

/// Byte soup biased towards what the filter reacts to.
fn soup() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..12),
        2 => prop::sample::select(HOSTILE).prop_map(|s| s.as_bytes().to_vec()),
        2 => benign().prop_map(String::into_bytes),
        2 => prop::sample::select(vec![
            &b"\x1b"[..], b"\x1b[", b"\x1b]", b"\x1bP", b"\x1b_", b"\x1b\\", b"\x07", b"\x18", b"\x1a",
            b"?", b">", b";", b":", b"1", b"65535", b"65536", b"m", b"h", b"l", b"c", b"n", b"t", b" ",
            b"\xc3", b"\xe6\xbc", b"\xf0\x9f", b"\xed\xa0\x80", b"\xc2\x9b", b"\xc2\x9c", b"\xff", b"\x7f", b"\x00",
        ])
        .prop_map(<[u8]>::to_vec),
        1 => (0usize..400).prop_map(|n| vec![b'1'; n]),
    ];
    prop::collection::vec(token, 0..40).prop_map(|v| v.concat())
}

fn feed_chunks(input: &[u8], cuts: &[usize]) -> (String, usize) {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|c| c % (input.len() + 1))
        .chain([0, input.len()])
        .collect();
    at.sort_unstable();
    let (mut f, mut out, mut held) = (Filter::new(), String::new(), 0);
    for w in at.windows(2) {
        f.feed(&input[w[0]..w[1]], &mut out);
        held = held.max(f.held());
    }
    f.finish(&mut out);
    (out, held)
}

#[test]
fn any_input_gives_the_same_output_however_split() {
    let s = (soup(), prop::collection::vec(any::<usize>(), 0..12));
    check("same_output_however_split", 2000, s, |(input, cuts)| {
        let whole = filter_all(&input);
        let (chunked, _) = feed_chunks(&input, &cuts);
        let cuts_all: Vec<usize> = (0..input.len()).collect();
        let (bytewise, _) = feed_chunks(&input, &cuts_all);
        prop_assert_eq!(&whole, &chunked);
        prop_assert_eq!(&whole, &bytewise);
        Ok(())
    });
}

#[test]
fn output_holds_only_kept_sequences_and_growth_is_bounded() {
    let s = (soup(), prop::collection::vec(any::<usize>(), 0..12));
    check("only_kept_sequences", 2000, s, |(input, cuts)| {
        let (out, held) = feed_chunks(&input, &cuts);
        if let Err(e) = allowed(&out) {
            return Err(TestCaseError::fail(format!("{e} in {out:?}")));
        }
        prop_assert!(
            out.len() <= 3 * input.len(),
            "{} > 3 x {}",
            out.len(),
            input.len()
        );
        prop_assert!(held <= CSI_MAX + 4, "held {held}");
        Ok(())
    });
}

#[test]
fn hostile_sequences_vanish_and_the_text_around_them_survives() {
    let item = prop_oneof![
        prop::sample::select(HOSTILE).prop_map(|s| (s.to_string(), String::new())),
        benign().prop_map(|b| (b.clone(), b)),
    ];
    let s = (
        prop::collection::vec(item, 0..30),
        prop::collection::vec(any::<usize>(), 0..8),
    );
    check("hostile_vanish", 2000, s, |(items, cuts)| {
        let input: String = items.iter().map(|(i, _)| i.as_str()).collect();
        let want: String = items.iter().map(|(_, w)| w.as_str()).collect();
        let (out, _) = feed_chunks(input.as_bytes(), &cuts);
        prop_assert_eq!(out, want);
        Ok(())
    });
}

#[test]
fn text_without_controls_decodes_as_lossy_utf8() {
    let byte = prop_oneof![0x20u8..0x7F, 0x80u8..=0xFF];
    let s = (
        prop::collection::vec(byte, 0..64),
        prop::collection::vec(any::<usize>(), 0..8),
    );
    check("lossy_utf8", 2000, s, |(input, cuts)| {
        let (out, _) = feed_chunks(&input, &cuts);
        let want: String = String::from_utf8_lossy(&input)
            .chars()
            .filter(|c| !('\u{80}'..='\u{9f}').contains(c))
            .collect();
        prop_assert_eq!(out, want);
        Ok(())
    });
}

#[test]
fn an_unterminated_string_flood_holds_nothing() {
    for opener in ["\x1b]52;c;", "\x1bP", "\x1b_", "\x1b[?"] {
        let mut f = Filter::new();
        let mut out = String::new();
        f.feed(opener.as_bytes(), &mut out);
        let flood = if opener.ends_with('?') {
            [b'1'; 65536]
        } else {
            [b'A'; 65536]
        };
        for _ in 0..160 {
            f.feed(&flood, &mut out);
            assert!(f.held() <= CSI_MAX, "{opener:?}: held {}", f.held());
        }
        assert_eq!(out, "", "{opener:?}");
        f.feed(b"\x1b\\after", &mut out);
        assert_eq!(out, "after", "{opener:?}");
    }
}
