//! A command's output within a result's budget: its head and its tail, the
//! middle replaced by one line that says how much is not shown. An agent
//! learns most from how a command started and how it ended; a cap that
//! kept only the tail hid the first error of a long build.

/// How much of a command's output a result returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Lines, head and tail together.
    pub lines: usize,
    /// Bytes, head and tail together (the marker line aside).
    pub bytes: usize,
}

/// The default byte budget of a `run_command` result.
pub(crate) const DEFAULT_BYTES: usize = 32 * 1024;
/// The most a call may ask for.
pub(crate) const MAX_BYTES: usize = 1 << 20;

/// What [`elide`] returns.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Elided {
    /// The head, a marker line if anything was left out, the tail.
    pub text: String,
    /// Lines left out.
    pub lines: usize,
    /// Bytes left out.
    pub bytes: usize,
}

/// The output within `caps`: whole when it fits; else its first lines and
/// its last lines, each within half of each budget (when no whole line fits,
/// the start of the first and the end of the last), joined by a marker line
/// that counts what is not shown. The output is `head` then `tail`; `gap`
/// is (bytes, lines) lost between them, which forces the marker there.
pub(crate) fn elide(head: &str, tail: &str, gap: (usize, usize), caps: Caps) -> Elided {
    let joined;
    let (a, b): (Vec<&str>, Vec<&str>) = if gap.0 == 0 {
        joined = format!("{head}{tail}");
        let all: Vec<&str> = joined.split('\n').collect();
        if all.len() <= caps.lines && joined.len() <= caps.bytes {
            return Elided {
                text: joined.clone(),
                lines: 0,
                bytes: 0,
            };
        }
        (all.clone(), all)
    } else {
        (head.split('\n').collect(), tail.split('\n').collect())
    };
    let same = gap.0 == 0;
    let total: usize = a.iter().map(|l| l.len() + 1).sum::<usize>()
        + if same {
            0
        } else {
            b.iter().map(|l| l.len() + 1).sum()
        };
    let (hl, hb) = (caps.lines.div_ceil(2), caps.bytes.div_ceil(2));
    let (tl, tb) = (caps.lines - hl, caps.bytes - hb);
    let (mut front, mut back): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    let (mut fb, mut bb) = (0, 0);
    let (mut i, mut j) = (0, b.len());
    // Lines of `a` from the front, of `b` from the back; one text: no overlap.
    let open = |i: usize, j: usize| if same { i < j } else { true };
    while i < a.len() && open(i, j) && front.len() < hl && fb + a[i].len() < hb {
        fb += a[i].len() + 1;
        front.push(a[i]);
        i += 1;
    }
    while j > 0 && open(i, j) && back.len() < tl && bb + b[j - 1].len() < tb {
        bb += b[j - 1].len() + 1;
        back.push(b[j - 1]);
        j -= 1;
    }
    let mut partly = 0;
    if front.is_empty() && back.is_empty() && i < a.len() && j > 0 && open(i, j) {
        let (p, q) = (prefix(a[i], hb), suffix(b[j - 1], tb));
        (fb, bb) = (p.len(), q.len());
        front.push(p);
        back.push(q);
        partly = if same && i + 1 == j { 1 } else { 2 };
    }
    back.reverse();
    let unshown = if same { j - i } else { (a.len() - i) + j };
    let lines = unshown.saturating_sub(partly) + gap.1;
    let bytes = total.saturating_sub(fb + bb) + gap.0;
    let marker = format!("…[{lines} lines, {bytes} bytes not shown]…");
    let text = front
        .into_iter()
        .chain([marker.as_str()])
        .chain(back)
        .collect::<Vec<_>>()
        .join("\n");
    Elided { text, lines, bytes }
}

fn prefix(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn suffix(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: Caps = Caps {
        lines: 6,
        bytes: 40,
    };

    #[test]
    fn fits_whole() {
        let e = elide("a\nb\n", "c", (0, 0), CAPS);
        assert_eq!(e.text, "a\nb\nc");
        assert_eq!((e.lines, e.bytes), (0, 0));
    }

    #[test]
    fn keeps_head_and_tail_of_many_lines() {
        let text: String = (1..=100).map(|i| format!("{i}\n")).collect();
        let e = elide(&text, "", (0, 0), CAPS);
        let lines: Vec<&str> = e.text.lines().collect();
        assert_eq!(&lines[..3], ["1", "2", "3"]);
        assert!(lines[3].starts_with("…[") && lines[3].contains(" lines, "));
        assert_eq!(lines[4..], ["99", "100"]);
        assert!(e.lines >= 94, "{e:?}");
    }

    #[test]
    fn a_huge_line_is_cut_at_both_ends() {
        let line = "é".repeat(100_000);
        let e = elide(&line, "", (0, 0), CAPS);
        assert!(e.text.len() < 100, "{}", e.text.len());
        assert!(e.bytes > 199_000, "{e:?}");
        assert!(e.text.starts_with('é') && e.text.ends_with('é'));
    }

    #[test]
    fn a_gap_is_counted_even_when_the_rest_fits() {
        let e = elide("head", "tail", (500, 7), CAPS);
        assert!(
            e.text.starts_with("head\n…[") && e.text.ends_with("]…\ntail"),
            "{}",
            e.text
        );
        assert_eq!(e.lines, 7);
        assert!(e.bytes >= 500);
    }
}
