//! Cut echoes of a credential header. A host that quotes a cut copy of the
//! request in its answer (an error quoting the first N bytes of a header,
//! a debug echo of the head) shows a credential's first bytes; were the
//! agent able to move the cut — a longer scheme word, a header put before
//! the credential's, a longer URL — it could learn the value a byte at a
//! time, each piece too short for the whole-value masks to see. The proxy
//! takes both knobs away where it can: it writes the scheme itself
//! (`Bearer`, `token`) and puts credential headers first, right after
//! `Host`. What it cannot fix is the length of the request line (the
//! agent's URL) before the headers, so every answer is also masked for
//! [`Cut`]s: the header as it was sent, from its fixed start (the scheme,
//! Basic's user, or the header's name) followed by even one byte of what
//! the proxy put in, is the header as the sandbox wrote it.

use std::sync::{Arc, Mutex};

/// Cuts remembered across requests (a host that logs a request and shows
/// the log later): the last ones sent, at most this many.
const REMEMBERED: usize = 64;

/// One credential header as sent, for masking its cut copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cut {
    /// What stands before the value as sandmux sent it, lowercase, matched
    /// without case: the scheme and its space, Basic's scheme with the
    /// base64 of its user and colon (whole groups), or — for a header that
    /// is the value alone — the header's name and `: `. Never a byte of the
    /// value itself.
    context: Vec<u8>,
    /// What followed it on the way up.
    sent: Vec<u8>,
    /// What the sandbox wrote in its place.
    wrote: Vec<u8>,
}

impl Cut {
    /// The header `name` was sent as `sent` where the sandbox wrote `wrote`.
    pub(crate) fn of(name: &str, sent: &[u8], wrote: &[u8]) -> Cut {
        let fixed = fixed(sent);
        let context = match fixed {
            0 => format!("{name}: ").into_bytes(),
            n => sent[..n].to_vec(),
        };
        Cut {
            context: context.to_ascii_lowercase(),
            sent: sent[fixed..].to_vec(),
            wrote: wrote.get(fixed..).unwrap_or_default().to_vec(),
        }
    }

    /// The longest text a match can span.
    pub(crate) fn len(&self) -> usize {
        self.context.len() + self.sent.len()
    }
}

/// How many bytes of a header value sandmux sent stand before the value:
/// its own scheme (`crate::proxy::shape`), or Basic's scheme and the whole
/// base64 groups of the user and colon; 0 for the value alone.
fn fixed(sent: &[u8]) -> usize {
    use base64::Engine;
    for s in ["Bearer ", "token "] {
        if sent.starts_with(s.as_bytes()) {
            return s.len();
        }
    }
    let Some(b64) = sent.strip_prefix(b"Basic ") else {
        return 0;
    };
    let plain = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap_or_default();
    let user = plain.iter().position(|b| *b == b':').map_or(0, |c| c + 1);
    "Basic ".len() + user / 3 * 4
}

/// The cuts of the headers sent lately, for every answer of every
/// intercepted host (a host may show a request it logged on another
/// connection).
#[derive(Debug, Default)]
pub(crate) struct Remembered(Mutex<Vec<Cut>>);

impl Remembered {
    /// Adds `cuts` (the newest last; the oldest go past [`REMEMBERED`])
    /// and returns all of them.
    pub(crate) fn with(&self, cuts: Vec<Cut>) -> Vec<Cut> {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for c in cuts {
            g.retain(|x| *x != c);
            g.push(c);
        }
        let extra = g.len().saturating_sub(REMEMBERED);
        g.drain(..extra);
        g.clone()
    }
}

/// What an answer is masked with: whole values and their spellings (each
/// replaced by its placeholder wherever it is), and the cuts of the
/// credential headers sent.
#[derive(Debug, Clone, Default)]
pub(crate) struct Masks {
    /// (what is masked, its mask).
    pub whole: Vec<(Arc<Vec<u8>>, Vec<u8>)>,
    /// Credential headers sent.
    pub cuts: Vec<Cut>,
}

/// A match in a text: where it starts, how long it is, what replaces it.
pub(crate) struct Found {
    pub at: usize,
    pub len: usize,
    pub with: Vec<u8>,
    /// It reaches the end of the text and could go on in what comes next.
    pub open: bool,
}

impl Masks {
    /// The longest text a match can span.
    pub(crate) fn longest(&self) -> usize {
        let whole = self.whole.iter().map(|(v, _)| v.len());
        whole
            .chain(self.cuts.iter().map(Cut::len))
            .max()
            .unwrap_or(1)
    }
}

/// Finds the matches of [`Masks`] in one text, left to right. Each
/// pattern's next place is kept until the scan passes it, so a text with
/// many matches is still read once per pattern, not once per match.
pub(crate) struct Scan<'a> {
    masks: &'a Masks,
    /// Each whole value's next place (`usize::MAX`: none left).
    whole: Vec<Option<usize>>,
    /// Each cut's next match (`None` inside: none left).
    cuts: Vec<Option<Option<(usize, usize)>>>,
    /// Bytes searched so far (a text is searched about once per pattern).
    searched: usize,
}

impl<'a> Scan<'a> {
    pub(crate) fn new(masks: &'a Masks) -> Scan<'a> {
        Scan {
            masks,
            whole: vec![None; masks.whole.len()],
            cuts: vec![None; masks.cuts.len()],
            searched: 0,
        }
    }

    /// The first match at or after `from` in `b` (`lower`: `b` lowercase):
    /// the earliest, at one place the longest; cut short where another
    /// match begins inside it and reaches further (an old value that
    /// shares its first bytes with the one sent, one cut's context inside
    /// another's value), so that one is found next; passed over for that
    /// one when it begins before the first's value does.
    pub(crate) fn next(&mut self, b: &[u8], lower: &[u8], from: usize) -> Option<Found> {
        let mut all = self.candidates(b, lower, from);
        all.sort_by_key(|c| (c.at, usize::MAX - c.len));
        let mut pick = *all.first()?;
        loop {
            let end = pick.at + pick.len;
            let inside = all
                .iter()
                .filter(|o| o.at > pick.at && o.at < end && o.at + o.len > end)
                .min_by_key(|o| (o.at, usize::MAX - o.len));
            match inside {
                None => break,
                Some(o) if o.at <= pick.value_at => pick = *o,
                Some(o) => {
                    (pick.len, pick.open) = (o.at - pick.at, false);
                    break;
                }
            }
        }
        Some(self.found(b, pick))
    }

    /// Each pattern's next match at or after `from`.
    fn candidates(&mut self, b: &[u8], lower: &[u8], from: usize) -> Vec<Cand> {
        let masks = self.masks;
        let mut out = Vec::new();
        for (k, (v, _)) in masks.whole.iter().enumerate() {
            let at = match self.whole[k] {
                Some(at) if at >= from => at,
                _ => {
                    let found = memchr::memmem::find(&b[from..], v);
                    self.searched += found.map_or(b.len() - from, |i| i + v.len());
                    found.map_or(usize::MAX, |i| from + i)
                }
            };
            self.whole[k] = Some(at);
            if at != usize::MAX {
                out.push(Cand {
                    at,
                    len: v.len(),
                    value_at: at,
                    open: false,
                    kind: Kind::Whole(k),
                });
            }
        }
        for (k, c) in masks.cuts.iter().enumerate() {
            let m = match self.cuts[k] {
                Some(Some((at, n))) if at >= from => Some((at, n)),
                Some(None) => None,
                _ => {
                    let m = c.find(b, lower, from);
                    self.searched += m.map_or(b.len(), |(at, n)| at + c.context.len() + n) - from;
                    m
                }
            };
            self.cuts[k] = Some(m);
            if let Some((at, n)) = m {
                let value_at = at + c.context.len();
                out.push(Cand {
                    at,
                    len: value_at + n - at,
                    value_at,
                    open: value_at + n == b.len() && n < c.sent.len(),
                    kind: Kind::Cut(k),
                });
            }
        }
        out
    }

    /// The match `c` with what replaces it.
    fn found(&self, b: &[u8], c: Cand) -> Found {
        let masked = c.len - (c.value_at - c.at);
        let with = match c.kind {
            Kind::Whole(k) => {
                let (v, p) = &self.masks.whole[k];
                let n = if masked == v.len() { p.len() } else { masked };
                p[..n.min(p.len())].to_vec()
            }
            Kind::Cut(k) => {
                let cut = &self.masks.cuts[k];
                let n = if masked == cut.sent.len() {
                    cut.wrote.len()
                } else {
                    masked
                };
                [&b[c.at..c.value_at], &cut.wrote[..n.min(cut.wrote.len())]].concat()
            }
        };
        Found {
            at: c.at,
            len: c.len,
            with,
            open: c.open,
        }
    }
}

/// A pattern's next match, before what replaces it is made.
#[derive(Debug, Clone, Copy)]
struct Cand {
    at: usize,
    len: usize,
    value_at: usize,
    open: bool,
    kind: Kind,
}

/// Which pattern matched.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Whole(usize),
    Cut(usize),
}

impl Cut {
    /// The next place at or after `from` where the context (without case)
    /// is followed by at least one byte of what was sent: (where, how many).
    fn find(&self, b: &[u8], lower: &[u8], mut from: usize) -> Option<(usize, usize)> {
        loop {
            let at = from + memchr::memmem::find(&lower[from..], &self.context)?;
            let start = at + self.context.len();
            let n = b[start..]
                .iter()
                .zip(&self.sent)
                .take_while(|(a, b)| a == b)
                .count();
            if n > 0 {
                return Some((at, n));
            }
            from = at + 1;
        }
    }
}

/// Whether a header's name (lowercase, as the proxy reads it) holds a
/// value of `masks` in any case: names are compared without case, so a
/// value is looked for without case too.
pub(crate) fn in_name(name: &[u8], masks: &Masks) -> bool {
    let name = name.to_ascii_lowercase();
    masks
        .whole
        .iter()
        .any(|(v, _)| memchr::memmem::find(&name, &v.to_ascii_lowercase()).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masks(name: &str, sent: &[u8], wrote: &[u8]) -> Masks {
        Masks {
            whole: vec![],
            cuts: vec![Cut::of(name, sent, wrote)],
        }
    }

    fn all(b: &[u8], m: &Masks) -> Vec<u8> {
        crate::proxy::scan::masked(&mut b.to_vec(), m, true)
    }

    #[test]
    fn every_cut_of_the_sent_header_is_the_written_one() {
        let m = masks(
            "authorization",
            b"Bearer real-secret-value",
            b"Bearer sandmux-cred-0123",
        );
        // The positive control: the cut quoted as the host would, unmasked.
        for cut in 1..=17 {
            let echo = [
                &b"bad header: Authorization: Bearer "[..],
                &b"real-secret-value"[..cut],
            ]
            .concat();
            assert_eq!(
                all(&echo, &m),
                [
                    &b"bad header: Authorization: Bearer "[..],
                    &b"sandmux-cred-0123"[..cut]
                ]
                .concat(),
                "{cut}"
            );
        }
        // Without case in its fixed start, the value exact.
        assert_eq!(all(b"BEARER real", &m), b"BEARER sand");
        assert_eq!(all(b"Bearer x", &m), b"Bearer x");
        assert_eq!(all(b"Bearer ", &m), b"Bearer ");
    }

    #[test]
    fn a_whole_value_header_is_known_by_its_name() {
        let m = masks("x-api-key", b"real-secret-value", b"sandmux-cred-0123456");
        assert_eq!(
            all(b"got X-Api-Key: real-se;", &m),
            b"got X-Api-Key: sandmux;"
        );
        assert_eq!(all(b"real-se", &m), b"real-se");
        // A value that begins as a placeholder does: nothing but the
        // header's name starts a cut (text with "sk" is left alone).
        let m = masks("x-api-key", b"sk-ant-secret-1", b"sandmux-cred-0123");
        assert_eq!(all(b"ask the task, risk", &m), b"ask the task, risk");
        assert_eq!(all(b"x-api-key: sk-an", &m), b"x-api-key: sandm");
    }

    #[test]
    fn basic_is_cut_after_its_user_whatever_the_case_the_agent_wrote() {
        use base64::Engine;
        let e = base64::engine::general_purpose::STANDARD;
        let sent = format!("Basic {}", e.encode("uu:ghp_realvalue1234"));
        let wrote = format!("basic {}", e.encode("uu:sandmux-cred-00000"));
        let m = masks("authorization", sent.as_bytes(), wrote.as_bytes());
        for cut in 7..sent.len() {
            let out = all(&sent.as_bytes()[..cut], &m);
            let tail = &out[6..];
            let plain = e.decode(&tail[..tail.len() / 4 * 4]).unwrap_or_default();
            assert!(
                !String::from_utf8_lossy(&plain).contains("ghp"),
                "{cut}: {plain:?}"
            );
        }
        // The control: unmasked, the same cuts decode to the value's start.
        let tail = &sent[6..sent.len() / 4 * 4 + 2];
        let plain = e.decode(&tail[..tail.len() / 4 * 4]).unwrap();
        assert!(String::from_utf8_lossy(&plain).contains("ghp"));
    }

    #[test]
    fn of_two_cuts_at_one_place_the_longer_masks() {
        // An older Basic header (user "u") and the current one (user "uu")
        // both start at `basic `: the current one's cut must win whole.
        use base64::Engine;
        let e = base64::engine::general_purpose::STANDARD;
        let cut = |u: &str| {
            let sent = format!("Basic {}", e.encode(format!("{u}:ghp_realvalue1234")));
            let wrote = format!("Basic {}", e.encode(format!("{u}:sandmux-cred-00000")));
            Cut::of("authorization", sent.as_bytes(), wrote.as_bytes())
        };
        let m = Masks {
            whole: vec![],
            cuts: vec![cut("u"), cut("uu")],
        };
        let sent = format!("Basic {}", e.encode("uu:ghp_realvalue1234"));
        let out = all(&sent.as_bytes()[..24], &m);
        let plain = e.decode(&out[6..6 + 16]).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&plain).contains("ghp"),
            "{plain:?}"
        );
    }

    #[test]
    fn many_matches_are_read_in_one_pass() {
        let m = Masks {
            whole: (0..80)
                .map(|i| {
                    (
                        Arc::new(format!("value-{i:04}-xxxxxxxx").into_bytes()),
                        b"PH".to_vec(),
                    )
                })
                .collect(),
            cuts: vec![Cut::of(
                "authorization",
                b"Bearer ghp_real",
                b"Bearer sandmux-c",
            )],
        };
        let text = "Bearer g".repeat(200_000);
        let (mut scan, lower) = (Scan::new(&m), text.to_ascii_lowercase());
        let (mut from, mut found) = (0, 0);
        while let Some(f) = scan.next(text.as_bytes(), lower.as_bytes(), from) {
            (from, found) = (f.at + f.len, found + 1);
        }
        assert_eq!(found, 200_000);
        // Each pattern reads the text about once (81 patterns), not once per
        // match (which would be 200,000 times).
        assert!(scan.searched <= 2 * 81 * text.len(), "{}", scan.searched);
    }

    #[test]
    fn a_cut_at_a_chunk_end_waits_for_the_next() {
        let m = masks(
            "authorization",
            b"Bearer real-secret-value",
            b"Bearer sandmux-cred-0123",
        );
        let text = b"echo Bearer real-secret-value end Bearer real-sec";
        for split in 0..text.len() {
            let mut held = Vec::new();
            let mut out = Vec::new();
            for part in [&text[..split], &text[split..]] {
                held.extend_from_slice(part);
                out.extend(crate::proxy::scan::masked(&mut held, &m, false));
            }
            out.extend(crate::proxy::scan::masked(&mut held, &m, true));
            assert_eq!(
                out, b"echo Bearer sandmux-cred-0123 end Bearer sandmux-",
                "split {split}"
            );
        }
    }

    #[test]
    fn an_old_value_sharing_the_first_bytes_is_masked_whole() {
        let m = Masks {
            whole: vec![
                (Arc::new(b"v1_0123456789".to_vec()), b"PH".to_vec()),
                (Arc::new(b"v3_abcdefghij".to_vec()), b"PH".to_vec()),
            ],
            cuts: vec![Cut::of(
                "authorization",
                b"Bearer v3_abcdefghij",
                b"Bearer sandmux-cred-0",
            )],
        };
        let echo = b"Bearer v1_0123456789 Bearer v3_abcdefghij Bearer v3_ab";
        assert_eq!(
            all(echo, &m),
            b"Bearer PH Bearer sandmux-cred-0 Bearer sandm"
        );
    }

    #[test]
    fn a_name_holds_a_value_in_any_case() {
        let m = Masks {
            whole: vec![(Arc::new(b"MiXeD-Secret-1".to_vec()), b"ph".to_vec())],
            cuts: vec![],
        };
        assert!(in_name(b"x-mixed-secret-1-echo", &m));
        assert!(!in_name(b"x-other", &m));
    }
}
