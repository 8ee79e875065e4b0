//! The tmux control-mode protocol (`tmux -C`), parsed as bytes.
//!
//! Control mode sends one line per notification. Command replies are framed by
//! `%begin TIME NUMBER FLAGS` … `%end|%error TIME NUMBER FLAGS`; lines between
//! are the reply, taken verbatim (a pane title containing "%end" is inside a
//! block and cannot close it early, because only a line *starting* with the
//! guard word and carrying the same number ends it). `%output %PANE DATA`
//! carries pane output with bytes below 32 and `\` escaped as `\ooo` octal;
//! everything else is raw bytes, not necessarily UTF-8.

/// One parsed control-mode event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A command reply: its number, whether it failed, and its lines.
    Reply {
        /// The command number tmux assigned.
        number: u64,
        /// `%error` instead of `%end`.
        error: bool,
        /// Reply lines (without newlines).
        lines: Vec<Vec<u8>>,
    },
    /// Output of a pane, decoded.
    Output {
        /// Pane id number (`%3` → 3).
        pane: u32,
        /// The bytes the pane wrote.
        data: Vec<u8>,
    },
    /// The client is exiting, with an optional reason.
    Exit(Option<String>),
    /// Any other notification line, raw.
    Notification(Vec<u8>),
}

/// Incremental parser: feed bytes as they arrive, get events.
#[derive(Debug, Default)]
pub struct Parser {
    buf: Vec<u8>,
    block: Option<(u64, Vec<Vec<u8>>)>,
}

/// Upper bound for one line; longer lines are cut (pane output lines are
/// bounded by tmux's own buffer sizes, so only a broken peer hits this).
pub const MAX_LINE: usize = 4 << 20;

fn guard(line: &[u8], word: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(word)?;
    let rest = rest.strip_prefix(b" ")?;
    let mut parts = rest.split(|&b| b == b' ');
    let _time = parts.next()?;
    let num = parts.next()?;
    std::str::from_utf8(num).ok()?.parse().ok()
}

/// Decodes the `\ooo` escapes of a `%output` payload.
pub fn decode_output(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (s[i + 1] - b'0') as u32 * 64
                + (s[i + 2] - b'0') as u32 * 8
                + (s[i + 3] - b'0') as u32;
            out.push((v & 0xff) as u8);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

impl Parser {
    /// A new parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns every event completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                let line = std::mem::take(&mut self.buf);
                if let Some(e) = self.line(line) {
                    events.push(e);
                }
            } else if self.buf.len() < MAX_LINE {
                self.buf.push(b);
            }
        }
        events
    }

    fn line(&mut self, mut line: Vec<u8>) -> Option<Event> {
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if let Some((num, lines)) = &mut self.block {
            for (word, error) in [(&b"%end"[..], false), (&b"%error"[..], true)] {
                if guard(&line, word) == Some(*num) {
                    let (number, lines) = self.block.take().expect("in a block");
                    return Some(Event::Reply {
                        number,
                        error,
                        lines,
                    });
                }
            }
            lines.push(line);
            return None;
        }
        if let Some(num) = guard(&line, b"%begin") {
            self.block = Some((num, Vec::new()));
            return None;
        }
        if let Some(rest) = line.strip_prefix(b"%output %") {
            let sp = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
            let pane = std::str::from_utf8(&rest[..sp])
                .ok()
                .and_then(|s| s.parse().ok());
            if let Some(pane) = pane {
                let data = decode_output(rest.get(sp + 1..).unwrap_or(&[]));
                return Some(Event::Output { pane, data });
            }
        }
        if line == b"%exit" {
            return Some(Event::Exit(None));
        }
        if let Some(r) = line.strip_prefix(b"%exit ") {
            return Some(Event::Exit(Some(String::from_utf8_lossy(r).into_owned())));
        }
        if line.is_empty() {
            return None;
        }
        Some(Event::Notification(line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_blocks_and_output() {
        let mut p = Parser::new();
        let ev = p.feed(b"%begin 1 5 0\nline one\n%end not-a-guard\n%end 1 5 0\n%output %3 a\\015\\012b\\134\n%exit\n");
        assert_eq!(
            ev,
            vec![
                Event::Reply {
                    number: 5,
                    error: false,
                    lines: vec![b"line one".to_vec(), b"%end not-a-guard".to_vec()]
                },
                Event::Output {
                    pane: 3,
                    data: b"a\r\nb\\".to_vec()
                },
                Event::Exit(None),
            ]
        );
    }

    #[test]
    fn split_feeds_and_errors() {
        let mut p = Parser::new();
        assert!(p.feed(b"%begin 1 7 0\nno such").is_empty());
        let ev = p.feed(b" pane\n%error 1 7 0\n");
        assert_eq!(
            ev,
            vec![Event::Reply {
                number: 7,
                error: true,
                lines: vec![b"no such pane".to_vec()]
            }]
        );
    }

    #[test]
    fn raw_high_bytes_survive() {
        assert_eq!(decode_output(b"\xff\xfe\\00"), b"\xff\xfe\\00".to_vec());
        assert_eq!(decode_output(b"\\033[0m"), b"\x1b[0m".to_vec());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A deterministic pseudo-random stream (xorshift) over many seeds.
        for seed in 1..200u64 {
            let mut x = seed;
            let mut bytes = Vec::new();
            for _ in 0..2000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let choices: &[&[u8]] = &[
                    b"%begin 1 2 0\n",
                    b"%end 1 2 0\n",
                    b"%error 1 2 0\n",
                    b"%output %1 ",
                    b"\\0",
                    b"\\",
                    b"\n",
                    b"x",
                    b"\xff",
                    b"%exit\n",
                ];
                bytes.extend_from_slice(choices[(x % choices.len() as u64) as usize]);
            }
            let mut p = Parser::new();
            for chunk in bytes.chunks((seed % 17 + 1) as usize) {
                let _ = p.feed(chunk);
            }
        }
    }
}
