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

use std::sync::Arc;

/// One credential header as sent, for masking its cut copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cut {
    /// What stands before the value, lowercase, matched without case: the
    /// part the sent and the written header share (`bearer `, Basic's
    /// scheme and the base64 of its user), or the header's name and `: `
    /// when they share nothing (the whole value).
    context: Vec<u8>,
    /// What followed it on the way up.
    sent: Vec<u8>,
    /// What the sandbox wrote in its place.
    wrote: Vec<u8>,
}

impl Cut {
    /// The header `name` was sent as `sent` where the sandbox wrote `wrote`.
    pub(crate) fn of(name: &str, sent: &[u8], wrote: &[u8]) -> Cut {
        let c = sent.iter().zip(wrote).take_while(|(a, b)| a == b).count();
        let context = if c == 0 {
            format!("{name}: ").into_bytes()
        } else {
            sent[..c].to_vec()
        };
        Cut {
            context: context.to_ascii_lowercase(),
            sent: sent[c..].to_vec(),
            wrote: wrote[c..].to_vec(),
        }
    }

    /// The longest text a match can span.
    pub(crate) fn len(&self) -> usize {
        self.context.len() + self.sent.len()
    }
}

/// What an answer is masked with: whole values and their spellings (each
/// replaced by its placeholder wherever it is), and the cuts of the
/// headers this exchange sent.
#[derive(Debug, Clone, Default)]
pub(crate) struct Masks {
    /// (what is masked, its mask).
    pub whole: Vec<(Arc<Vec<u8>>, Vec<u8>)>,
    /// The request's credential headers.
    pub cuts: Vec<Cut>,
}

/// A match in a text: where it starts, how long it is, what replaces it.
pub(crate) struct Found {
    pub at: usize,
    pub len: usize,
    /// Where what is masked begins (a cut's context is left as it is).
    pub value_at: usize,
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

    /// The first match at or after `from` in `b` (`lower`: `b` lowercase).
    pub(crate) fn next(&self, b: &[u8], lower: &[u8], from: usize) -> Option<Found> {
        let whole = self.whole.iter().filter_map(|(v, p)| {
            let at = from + memchr::memmem::find(&b[from..], v)?;
            Some(Found {
                at,
                len: v.len(),
                value_at: at,
                with: p.clone(),
                open: false,
            })
        });
        let earliest = |f: &Found| (f.at, usize::MAX - f.len);
        let w = whole.min_by_key(earliest);
        let c = self
            .cuts
            .iter()
            .filter_map(|c| c.next(b, lower, from))
            .min_by_key(earliest);
        match (w, c) {
            // A whole value where a cut's value begins is the whole value (an
            // old value that shares its first bytes with the one sent).
            (Some(w), Some(c)) if w.at <= c.value_at => Some(w),
            (_, Some(c)) => Some(c),
            (w, None) => w,
        }
    }
}

impl Cut {
    fn next(&self, b: &[u8], lower: &[u8], mut from: usize) -> Option<Found> {
        loop {
            let at = from + memchr::memmem::find(&lower[from..], &self.context)?;
            let start = at + self.context.len();
            let n = b[start..]
                .iter()
                .zip(&self.sent)
                .take_while(|(a, b)| a == b)
                .count();
            if n == 0 {
                from = at + 1;
                continue;
            }
            let with = if n == self.sent.len() {
                self.wrote.clone()
            } else {
                self.wrote[..n.min(self.wrote.len())].to_vec()
            };
            let with = [&b[at..start], &with[..]].concat();
            let open = start + n == b.len() && n < self.sent.len();
            return Some(Found {
                at,
                len: start + n - at,
                value_at: start,
                with,
                open,
            });
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
        assert_eq!(all(echo, &m), b"Bearer PH Bearer PH Bearer sandm");
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
