//! What the replay filter may emit, written independently of the filter (an
//! allowlist tokenizer, not a state machine): used by `tests/replay_filter.rs`
//! and the coverage-guided target `fuzz/fuzz_targets/replay_filter.rs`.

/// The allowlist: Err names the first thing in `out` that is not kept.
pub(crate) fn allowed(out: &str) -> Result<(), String> {
    let mut it = out.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        let code = c as u32;
        if c == '\x1b' {
            let rest = &out[i + 1..];
            let len = token_len(rest)
                .ok_or_else(|| format!("escape at {i}: {:?}", &rest[..rest.len().min(20)]))?;
            for _ in 0..len {
                it.next();
            }
        } else if code < 0x20 && !(0x08..=0x0F).contains(&code) || (0x7F..=0x9F).contains(&code) {
            return Err(format!("control {code:#x} at {i}"));
        }
    }
    Ok(())
}

/// Length (in chars, all ASCII) after ESC of a kept sequence starting `s`.
fn token_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    match *b.first()? {
        b'7' | b'8' | b'D' | b'E' | b'H' | b'M' => Some(1),
        b'(' | b')' | b'*' | b'+' => matches!(b.get(1)?, b'0' | b'A' | b'B').then_some(2),
        b'[' => {
            let end = b[1..].iter().position(|c| (0x40..=0x7E).contains(c))? + 1;
            let (params, f) = (&s[1..end], b[end]);
            csi_ok(params, f).then_some(end + 1)
        }
        _ => None,
    }
}

fn csi_ok(params: &str, f: u8) -> bool {
    let nums_ok = |p: &str, seps: &[char]| {
        p.split(seps).all(|n| {
            n.is_empty()
                || n.len() <= 5
                    && n.chars().all(|c| c.is_ascii_digit())
                    && n.parse::<u32>().unwrap() <= 65535
        })
    };
    if let Some(modes) = params.strip_prefix('?') {
        let kept = [5u32, 6, 7, 25, 47, 1047, 1048, 1049, 2004, 2026];
        return matches!(f, b'h' | b'l')
            && modes
                .split(';')
                .all(|m| m.parse::<u32>().is_ok_and(|m| kept.contains(&m)));
    }
    if f == b'm' {
        return nums_ok(params, &[';', ':']);
    }
    if !nums_ok(params, &[';']) {
        return false;
    }
    let first: u32 = params.split(';').next().unwrap_or("").parse().unwrap_or(0);
    match f {
        b'@' | b'A'..=b'I' | b'K' | b'L' | b'M' | b'P' | b'S' | b'X' | b'Z' | b'`' => true,
        b'a' | b'b' | b'd' | b'e' | b'f' | b'g' | b'r' | b's' => true,
        b'J' => first <= 2,
        b'T' => !params.contains(';'),
        b'u' => params.is_empty(),
        b'h' | b'l' => params.parse::<u32>() == Ok(4),
        _ => false,
    }
}
