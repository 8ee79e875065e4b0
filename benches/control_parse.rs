//! The control-mode parser alone (`src/tmux/control.rs`): how many MB/s of
//! `%output` lines it turns into decoded events, fed in the 64 KiB reads the
//! hub makes. Run by `bench/control-parse` (`cargo bench --bench
//! control_parse`); no test asserts on it (issue 27's goal: at least 200 MB/s).
//!
//! Three kinds of pane output, each escaped the way tmux 3.3 writes it
//! (`control_write_output`: a byte below a space, and `\`, as `\ooo`) in
//! `%output` lines of 4 KiB of pane output each:
//! - a build log: lines of 60–120 printable characters ending in CR LF;
//! - `yes`: `y` CR LF, the worst case for escapes per byte;
//! - random bytes, about one in eight escaped.

use sandmux::testing::control::{Event, Parser};
use std::time::Instant;

const PANE_BYTES: usize = 32 << 20;
const CHUNK: usize = 4096;
const READ: usize = 64 << 10;
const ROUNDS: usize = 7;

fn escape(data: &[u8], out: &mut Vec<u8>) {
    for &b in data {
        if b < b' ' || b == b'\\' {
            out.extend_from_slice(format!("\\{b:03o}").as_bytes());
        } else {
            out.push(b);
        }
    }
}

/// A small deterministic generator (xorshift), so every run feeds the same bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn build_log(rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::with_capacity(PANE_BYTES + 256);
    while v.len() < PANE_BYTES {
        let n = 60 + (rng.next() % 61) as usize;
        for _ in 0..n {
            v.push(b' ' + 1 + (rng.next() % 94) as u8);
        }
        v.extend_from_slice(b"\r\n");
    }
    v.truncate(PANE_BYTES);
    v
}

fn yes() -> Vec<u8> {
    b"y\r\n".repeat(PANE_BYTES / 3)
}

fn random(rng: &mut Rng) -> Vec<u8> {
    (0..PANE_BYTES).map(|_| rng.next() as u8).collect()
}

/// The stream tmux would write to a control client for this pane output.
fn stream(pane: &[u8]) -> Vec<u8> {
    let mut s = Vec::with_capacity(pane.len() * 2);
    for c in pane.chunks(CHUNK) {
        s.extend_from_slice(b"%output %3 ");
        escape(c, &mut s);
        s.push(b'\n');
    }
    s
}

/// Seconds to parse `s` whole, and the decoded bytes (checked against `want`).
fn once(s: &[u8], want: usize) -> f64 {
    let t = Instant::now();
    let mut p = Parser::new();
    let mut got = 0usize;
    for r in s.chunks(READ) {
        for e in p.feed(r) {
            if let Event::Output { data, .. } = e {
                got += data.len();
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(got, want, "the parser lost or invented bytes");
    secs
}

fn main() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let cases = [
        ("build log (text lines, CR LF)", build_log(&mut rng)),
        ("`yes` (y CR LF)", yes()),
        ("random bytes", random(&mut rng)),
    ];
    println!("| pane output | `%output` stream MB | median MB/s of `%output` | min–max MB/s | pane MB/s (decoded) |");
    println!("|---|---:|---:|---:|---:|");
    for (name, pane) in &cases {
        let s = stream(pane);
        let mut times: Vec<f64> = (0..ROUNDS).map(|_| once(&s, pane.len())).collect();
        times.sort_by(f64::total_cmp);
        let mb = |bytes: usize, secs: f64| bytes as f64 / 1e6 / secs;
        let med = times[ROUNDS / 2];
        println!(
            "| {name} | {:.1} | {:.0} | {:.0}–{:.0} | {:.0} |",
            s.len() as f64 / 1e6,
            mb(s.len(), med),
            mb(s.len(), times[ROUNDS - 1]),
            mb(s.len(), times[0]),
            mb(pane.len(), med),
        );
    }
}
