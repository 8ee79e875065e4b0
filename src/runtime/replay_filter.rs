//! The replay filter: what a recording may make the viewer's terminal do.
//!
//! A recording is played on a human's terminal, so pane output goes through
//! this filter before it is written to a cast (and so does a snapshot). It
//! keeps what draws the screen and drops what acts on the viewer's terminal:
//!
//! - kept: printable text (valid UTF-8; an invalid sequence becomes U+FFFD),
//!   BS, HT, LF, VT, FF, CR, SO, SI; `ESC 7`/`8` (save/restore cursor), `ESC
//!   D`/`E`/`M`/`H` (index, next line, reverse index, tab set), charset
//!   designations `ESC (`/`)`/`*`/`+` with `0`, `A` or `B`; CSI without a
//!   prefix or intermediates for cursor movement (`A`–`I`, `Z`, `` ` ``, `a`,
//!   `d`, `e`, `f`), erasing (`J` 0–2, `K`, `X`), inserting and deleting (`@`,
//!   `L`, `M`, `P`, `b`), scrolling (`S`, `T` with one parameter, `r`), tabs
//!   (`g`), SGR (`m`, colon sub-parameters included), `s`, `u` (no
//!   parameters), `h`/`l` for mode 4 (insert) only; `CSI ? … h/l` for the
//!   private modes in [`KEPT_MODES`] (others are removed from the list).
//! - dropped: every OSC (titles, clipboard, hyperlinks, colours), DCS, APC,
//!   PM, SOS and screen's `ESC k` title strings, with their payload; every
//!   other CSI (device attributes and status reports, window operations,
//!   `CSI > …`, `CSI = …`, `CSI ? … n`, cursor style, soft reset, …); every
//!   other escape (`ESC Z`, `ESC c`, keypad modes, …); BEL, ENQ and the other
//!   C0 controls, DEL, and C1 controls (U+0080–U+009F).
//!
//! A parameter above 65535 or a sequence longer than [`CSI_MAX`] drops the
//! sequence. The filter is a byte-at-a-time state machine: input split
//! anywhere gives the same output, its state is at most [`CSI_MAX`] + 4
//! bytes (a string sequence is skipped, never buffered), the output is at
//! most three bytes per input byte, and it only ever emits whole sequences.
//! It assumes the viewer's terminal reads UTF-8.

/// Longest CSI parameter and intermediate text kept; longer is dropped.
pub const CSI_MAX: usize = 128;

/// Private modes (`CSI ? N h/l`) kept: reverse video, origin mode, autowrap,
/// cursor visibility, the alternate screen (47, 1047, 1048, 1049), bracketed
/// paste and synchronized output. Mouse reporting, focus events, cursor-key
/// and keypad modes, 132 columns and the rest are dropped.
pub const KEPT_MODES: &[u32] = &[5, 6, 7, 25, 47, 1047, 1048, 1049, 2004, 2026];

const MAX_PARAM: u32 = 65535;

/// Most repetitions `CSI n b` may ask for (a screen's worth): more would
/// only make the viewer's terminal draw for minutes.
const MAX_REPEAT: u32 = 10_000;

/// What puts a viewer's terminal back as it was, written after a cut
/// recording and a snapshot: SGR, charsets (G0, G1, SI), insert mode, the
/// scrolling region, and the kept private modes to their defaults.
pub const RESTORE: &str = "\x1b[0m\x1b(B\x1b)B\x0f\x1b[4l\x1b[r\x1b[?5l\x1b[?6l\x1b[?7h\x1b[?25h\x1b[?2004l\x1b[?2026l\x1b[?1049l";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Ground,
    Esc,
    /// `ESC` then intermediates: the first, and whether there were more.
    EscInter(u8, bool),
    Csi,
    /// A CSI that grew past `CSI_MAX`: skipped up to its final byte.
    CsiSkip,
    /// OSC (which BEL also ends), DCS, APC, PM, SOS, `ESC k`: skipped.
    Str {
        osc: bool,
    },
}

/// The filter's state between chunks.
#[derive(Debug, Clone)]
pub struct Filter {
    state: State,
    csi: Vec<u8>,
    /// A UTF-8 sequence in progress: code point so far, bytes still needed,
    /// and the range the next byte must fall in.
    cp: u32,
    need: u8,
    lo: u8,
    hi: u8,
    pending: u8,
}

impl Default for Filter {
    fn default() -> Self {
        Filter::new()
    }
}

/// Filters one complete text (a snapshot).
pub fn filter_all(input: &[u8]) -> String {
    let mut out = String::new();
    let mut f = Filter::new();
    f.feed(input, &mut out);
    f.finish(&mut out);
    out
}

impl Filter {
    /// A filter in the ground state.
    pub fn new() -> Filter {
        Filter {
            state: State::Ground,
            csi: Vec::new(),
            cp: 0,
            need: 0,
            lo: 0x80,
            hi: 0xBF,
            pending: 0,
        }
    }

    /// Bytes of input held back for the next chunk (an unfinished CSI or
    /// UTF-8 sequence).
    pub fn held(&self) -> usize {
        self.csi.len() + self.pending as usize
    }

    /// Filters one chunk, appending what may reach the viewer to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut String) {
        for &b in input {
            self.byte(b, out);
        }
    }

    /// Ends the text: an unfinished UTF-8 sequence becomes U+FFFD, an
    /// unfinished escape sequence is dropped.
    pub fn finish(&mut self, out: &mut String) {
        if self.need > 0 {
            out.push('\u{FFFD}');
        }
        *self = Filter::new();
    }

    fn byte(&mut self, b: u8, out: &mut String) {
        if self.need > 0 {
            if (self.lo..=self.hi).contains(&b) {
                self.continue_utf8(b, out);
                return;
            }
            self.reset_utf8();
            out.push('\u{FFFD}');
        }
        match b {
            0x1B => {
                self.csi.clear();
                self.state = State::Esc;
            }
            0x18 | 0x1A => {
                self.csi.clear();
                self.state = State::Ground;
            }
            _ => match self.state {
                State::Ground => self.ground(b, out),
                State::Esc => self.esc(b, out),
                State::EscInter(first, more) => self.esc_inter(first, more, b, out),
                State::Csi | State::CsiSkip => self.csi_byte(b, out),
                State::Str { osc } => {
                    if osc && b == 0x07 {
                        self.state = State::Ground;
                    }
                }
            },
        }
    }

    fn ground(&mut self, b: u8, out: &mut String) {
        match b {
            0x08..=0x0F | 0x20..=0x7E => out.push(b as char),
            0x80.. => self.start_utf8(b, out),
            _ => {}
        }
    }

    /// A C0 control inside an escape or CSI: executed as in the ground state.
    fn control(&mut self, b: u8, out: &mut String) -> bool {
        if b < 0x20 {
            if (0x08..=0x0F).contains(&b) {
                out.push(b as char);
            }
            return true;
        }
        if b >= 0x7F {
            // DEL is ignored; a non-ASCII byte ends the sequence unsent.
            if b > 0x7F {
                self.csi.clear();
                self.state = State::Ground;
                self.ground(b, out);
            }
            return true;
        }
        false
    }

    fn esc(&mut self, b: u8, out: &mut String) {
        if self.control(b, out) {
            return;
        }
        self.state = State::Ground;
        match b {
            b'[' => self.state = State::Csi,
            b']' => self.state = State::Str { osc: true },
            b'P' | b'X' | b'^' | b'_' | b'k' => self.state = State::Str { osc: false },
            0x20..=0x2F => self.state = State::EscInter(b, false),
            b'7' | b'8' | b'D' | b'E' | b'H' | b'M' => {
                out.push('\x1b');
                out.push(b as char);
            }
            _ => {}
        }
    }

    fn esc_inter(&mut self, first: u8, more: bool, b: u8, out: &mut String) {
        if self.control(b, out) {
            return;
        }
        if (0x20..=0x2F).contains(&b) {
            self.state = State::EscInter(first, true);
            return;
        }
        self.state = State::Ground;
        if !more && matches!(first, b'(' | b')' | b'*' | b'+') && matches!(b, b'0' | b'A' | b'B') {
            out.push('\x1b');
            out.push(first as char);
            out.push(b as char);
        }
    }

    fn csi_byte(&mut self, b: u8, out: &mut String) {
        if self.control(b, out) {
            return;
        }
        if (0x20..=0x3F).contains(&b) {
            if self.state == State::Csi {
                if self.csi.len() < CSI_MAX {
                    self.csi.push(b);
                } else {
                    self.csi.clear();
                    self.state = State::CsiSkip;
                }
            }
            return;
        }
        // A final byte (0x40–0x7E).
        if self.state == State::Csi {
            if let Some(seq) = csi_kept(&self.csi, b) {
                out.push_str(&seq);
            }
        }
        self.csi.clear();
        self.state = State::Ground;
    }

    fn start_utf8(&mut self, b: u8, out: &mut String) {
        let (need, lo, hi, bits) = match b {
            0xC2..=0xDF => (1, 0x80, 0xBF, b & 0x1F),
            0xE0 => (2, 0xA0, 0xBF, b & 0x0F),
            0xED => (2, 0x80, 0x9F, b & 0x0F),
            0xE1..=0xEF => (2, 0x80, 0xBF, b & 0x0F),
            0xF0 => (3, 0x90, 0xBF, b & 0x07),
            0xF4 => (3, 0x80, 0x8F, b & 0x07),
            0xF1..=0xF3 => (3, 0x80, 0xBF, b & 0x07),
            _ => {
                out.push('\u{FFFD}');
                return;
            }
        };
        (self.need, self.lo, self.hi, self.cp, self.pending) = (need, lo, hi, bits as u32, 1);
    }

    fn continue_utf8(&mut self, b: u8, out: &mut String) {
        self.cp = (self.cp << 6) | (b & 0x3F) as u32;
        self.need -= 1;
        self.pending += 1;
        (self.lo, self.hi) = (0x80, 0xBF);
        if self.need == 0 {
            let c = char::from_u32(self.cp).unwrap_or('\u{FFFD}');
            if !('\u{80}'..='\u{9F}').contains(&c) {
                out.push(c);
            }
            self.reset_utf8();
        }
    }

    fn reset_utf8(&mut self) {
        (self.need, self.lo, self.hi, self.cp, self.pending) = (0, 0x80, 0xBF, 0, 0);
    }
}

/// The CSI to send for parameters/intermediates `p` and final byte `f`, if any.
fn csi_kept(p: &[u8], f: u8) -> Option<String> {
    let (private, params) = match p.first() {
        Some(b'?') => (true, &p[1..]),
        Some(b'<' | b'=' | b'>') => return None,
        _ => (false, p),
    };
    // Digits, `;` and (for SGR) `:` only: no intermediates, no late prefix.
    let colon_ok = !private && f == b'm';
    if !params
        .iter()
        .all(|&c| c.is_ascii_digit() || c == b';' || (colon_ok && c == b':'))
    {
        return None;
    }
    let text = std::str::from_utf8(params).ok()?;
    let mut nums = Vec::new();
    for group in text.split(';') {
        for n in group.split(':') {
            nums.push(parse_param(n)?);
        }
    }
    if private {
        return private_modes(&nums, f);
    }
    let first = nums.first().copied().flatten().unwrap_or(0);
    let ok = match f {
        b'@' | b'A'..=b'I' | b'K' | b'L' | b'M' | b'P' | b'S' | b'X' | b'Z' | b'`' => true,
        b'a' | b'd' | b'e' | b'f' | b'g' | b'm' | b'r' | b's' => true,
        b'b' => first <= MAX_REPEAT,
        b'J' => first <= 2,
        b'T' => nums.len() == 1,
        b'u' => params.is_empty(),
        b'h' | b'l' => nums.len() == 1 && first == 4,
        _ => false,
    };
    ok.then(|| format!("\x1b[{text}{}", f as char))
}

/// One parameter: empty (`None`) or a number up to 65535.
fn parse_param(n: &str) -> Option<Option<u32>> {
    if n.is_empty() {
        return Some(None);
    }
    if n.len() > 5 {
        return None;
    }
    let v: u32 = n.parse().ok()?;
    (v <= MAX_PARAM).then_some(Some(v))
}

/// `CSI ? modes h/l` with only the kept modes, or nothing.
fn private_modes(nums: &[Option<u32>], f: u8) -> Option<String> {
    if f != b'h' && f != b'l' {
        return None;
    }
    let kept: Vec<String> = nums
        .iter()
        .flatten()
        .filter(|m| KEPT_MODES.contains(m))
        .map(|m| m.to_string())
        .collect();
    (!kept.is_empty()).then(|| format!("\x1b[?{}{}", kept.join(";"), f as char))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &[u8]) -> String {
        filter_all(s)
    }

    #[test]
    fn screen_drawing_is_kept() {
        for s in [
            "plain é 漢 🙂\r\n\t",
            "\x1b[1;31mred\x1b[0m \x1b[38:2::1:2:3mx\x1b[m",
            "\x1b[H\x1b[2J\x1b[10;20H\x1b[K\x1b[3A\x1b[2;24r\x1b[4h\x1b[4l",
            "\x1b[?1049h\x1b[?25l\x1b[?2004h\x1b[?7l",
            "\x1b7\x1b8\x1bM\x1b(0qqq\x1b(B",
        ] {
            assert_eq!(f(s.as_bytes()), s, "{s:?}");
        }
    }

    #[test]
    fn what_acts_on_the_viewer_is_dropped() {
        for s in [
            "\x1b]52;c;aGVsbG8=\x07",
            "\x1b]0;title\x1b\\",
            "\x1b]8;;http://x\x1b\\",
            "\x1bPq#0;2;0;0;0\x1b\\",
            "\x1b_apc\x1b\\\x1b^pm\x1b\\\x1bXsos\x1b\\\x1bkname\x1b\\",
            "\x1b[c\x1b[>c\x1b[=c\x1b[5n\x1b[6n\x1b[?6n\x1b[21t\x1b[14t\x1b[8;1;1t",
            "\x1bP$qm\x1b\\\x1bP+q544e\x1b\\\x1b[>q\x1b[?u\x1b[$p",
            "\x1b[?1000h\x1b[?1006h\x1b[?1004h\x1b[?1h\x1b=\x1b>\x1bZ\x1bc",
            "\x07\x05\x00\x7f\u{9b}\u{9d}\u{9c}\u{90}",
            "\x1b[2 q\x1b[!p\x1b[3J\x1b[20h\x1b[99999999H",
        ] {
            assert_eq!(f(s.as_bytes()), "", "{s:?}");
        }
    }

    #[test]
    fn c1_controls_are_dropped_and_what_follows_is_text() {
        assert_eq!(f("\u{9b}6n\u{9d}0;t\u{9c}".as_bytes()), "6n0;t");
    }

    #[test]
    fn private_mode_lists_keep_only_kept_modes() {
        assert_eq!(f(b"\x1b[?1049;1000;2004h"), "\x1b[?1049;2004h");
        assert_eq!(f(b"\x1b[?1000;1006l"), "");
    }

    #[test]
    fn a_split_sequence_is_handled() {
        let mut flt = Filter::new();
        let mut out = String::new();
        for part in [
            &b"a\x1b]5"[..],
            b"2;c;eA==",
            b"\x07b\x1b[3",
            b"1mc\xe6",
            b"\xbc\xa2",
        ] {
            flt.feed(part, &mut out);
        }
        assert_eq!(out, "ab\x1b[31mc漢");
    }

    #[test]
    fn strings_are_skipped_not_buffered() {
        let mut flt = Filter::new();
        let mut out = String::new();
        flt.feed(b"\x1b]52;c;", &mut out);
        for _ in 0..1000 {
            flt.feed(&[b'A'; 1000], &mut out);
            assert_eq!(flt.held(), 0);
        }
        flt.feed(b"\x1b\\ok", &mut out);
        assert_eq!(out, "ok");
        flt.feed(b"\x1b[", &mut out);
        flt.feed(&[b'1'; 10_000], &mut out);
        assert!(flt.held() <= CSI_MAX);
        flt.feed(b"m!", &mut out);
        assert_eq!(out, "ok!");
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        assert_eq!(f(b"a\xffb\xc3"), "a\u{FFFD}b\u{FFFD}");
        assert_eq!(f(b"\xc3\x1b[1mx"), "\u{FFFD}\x1b[1mx");
        assert_eq!(f(b"\xed\xa0\x80"), "\u{FFFD}\u{FFFD}\u{FFFD}");
    }
}
