//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): a caller's
//! `traceparent` (and `tracestate`), read strictly, and the span sandmux
//! opens for the call under it. Anything that is not a valid version-00
//! `traceparent` is no trace context at all: it is ignored, never an
//! error, and never kept or echoed (only the parsed ids are). A
//! `tracestate` that does not follow the grammar is dropped on its own, as
//! the specification says.

/// Longest `tracestate` kept (the specification's limit for propagation).
pub(crate) const STATE_MAX: usize = 512;
/// Most list members a `tracestate` may have.
const STATE_MEMBERS_MAX: usize = 32;

tokio::task_local! {
    /// The trace context of the tool call the current task serves (set by
    /// the server around each call): work the call does on its own behalf,
    /// such as the items of a read batch, is traced under it.
    pub(crate) static CURRENT: Option<TraceContext>;
}

/// The current call's trace context, if it has one (see [`CURRENT`]).
pub(crate) fn current() -> Option<TraceContext> {
    CURRENT.try_with(Clone::clone).ok().flatten()
}

fn fresh_span() -> [u8; 8] {
    loop {
        let s = crate::nonce::bytes::<8>();
        if s != [0; 8] {
            return s;
        }
    }
}

/// A call's place in its caller's trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceContext {
    trace_id: [u8; 16],
    /// The caller's span: the parent of the call's.
    parent_id: [u8; 8],
    /// The call's own span, fresh for each call.
    span_id: [u8; 8],
    state: Option<String>,
    /// The caller's `sampled` flag (what an exporter follows: sandmux
    /// starts and samples no trace of its own).
    sampled: bool,
}

impl TraceContext {
    /// The context of a call made under `traceparent` (with `tracestate`
    /// if valid), with a fresh span id; `None` if `traceparent` is invalid.
    pub(crate) fn child_of(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let (trace_id, parent_id, flags) = parse_parent(traceparent)?;
        Some(TraceContext {
            trace_id,
            parent_id,
            sampled: flags & 1 == 1,
            span_id: fresh_span(),
            state: tracestate
                .filter(|s| valid_state(s))
                .map(|s| s.trim().to_string()),
        })
    }

    /// A span under this one: the same trace (and `tracestate`), this span
    /// its parent, a fresh span id.
    pub(crate) fn child(&self) -> TraceContext {
        TraceContext {
            parent_id: self.span_id,
            span_id: fresh_span(),
            ..self.clone()
        }
    }

    /// The trace id, 32 lowercase hex digits.
    pub(crate) fn trace_id(&self) -> String {
        hex(&self.trace_id)
    }

    /// The call's span id, 16 lowercase hex digits.
    pub(crate) fn span_id(&self) -> String {
        hex(&self.span_id)
    }

    /// The caller's span id (the call span's parent).
    pub(crate) fn parent_id(&self) -> String {
        hex(&self.parent_id)
    }

    /// The trace id's bytes.
    pub(crate) fn trace_bytes(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The call's span id's bytes.
    pub(crate) fn span_bytes(&self) -> [u8; 8] {
        self.span_id
    }

    /// The caller's span id's bytes.
    pub(crate) fn parent_bytes(&self) -> [u8; 8] {
        self.parent_id
    }

    /// Whether the caller sampled its trace (flag `01`).
    pub(crate) fn sampled(&self) -> bool {
        self.sampled
    }

    /// The caller's `tracestate`, if it was valid.
    pub(crate) fn state(&self) -> Option<&str> {
        self.state.as_deref()
    }
}

/// `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, nothing more; neither id all
/// zeros. Other versions are refused (this reader knows only 00). The
/// flags are returned (sandmux samples nothing itself: an exporter follows
/// the caller's `sampled` bit).
fn parse_parent(s: &str) -> Option<([u8; 16], [u8; 8], u8)> {
    let b = s.as_bytes();
    if b.len() != 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' || &b[..2] != b"00" {
        return None;
    }
    let mut trace = [0u8; 16];
    let mut parent = [0u8; 8];
    let mut flags = [0u8; 1];
    unhex(&b[3..35], &mut trace)?;
    unhex(&b[36..52], &mut parent)?;
    unhex(&b[53..55], &mut flags)?;
    if trace == [0; 16] || parent == [0; 8] {
        return None;
    }
    Some((trace, parent, flags[0]))
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn unhex(src: &[u8], out: &mut [u8]) -> Option<()> {
    for (o, pair) in out.iter_mut().zip(src.chunks(2)) {
        *o = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(())
}

fn hex(b: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    b.iter()
        .flat_map(|x| {
            [
                HEX[usize::from(x >> 4)] as char,
                HEX[usize::from(x & 15)] as char,
            ]
        })
        .collect()
}

/// A `tracestate` by the specification's grammar: at most 512 bytes and 32
/// members, each `key=value` with a lowercase key (`tenant@system` allowed)
/// and a value of printable ASCII without `,` or `=`.
fn valid_state(s: &str) -> bool {
    if s.len() > STATE_MAX {
        return false;
    }
    let members: Vec<&str> = s
        .split(',')
        .map(|m| m.trim_matches([' ', '\t']))
        .filter(|m| !m.is_empty())
        .collect();
    members.len() <= STATE_MEMBERS_MAX
        && members.iter().all(|m| {
            m.split_once('=')
                .is_some_and(|(k, v)| valid_key(k) && valid_value(v))
        })
}

fn key_char(c: u8) -> bool {
    matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/')
}

fn valid_key(k: &str) -> bool {
    let part = |p: &str, first_digit: bool, max: usize| {
        let b = p.as_bytes();
        !b.is_empty()
            && b.len() <= max
            && (b[0].is_ascii_lowercase() || (first_digit && b[0].is_ascii_digit()))
            && b.iter().all(|&c| key_char(c))
    };
    match k.split_once('@') {
        Some((tenant, system)) => part(tenant, true, 241) && part(system, false, 14),
        None => part(k, false, 256),
    }
}

fn valid_value(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && b.last() != Some(&b' ')
        && b.iter()
            .all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_parent_gives_its_ids_and_a_fresh_span() {
        let t =
            TraceContext::child_of(GOOD, Some("congo=t61rcWkgMzE, rojo=00f067aa0ba902b7")).unwrap();
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert_eq!(t.span_id().len(), 16);
        assert_ne!(t.span_id(), t.parent_id());
        let u = TraceContext::child_of(GOOD, None).unwrap();
        assert_ne!(t.span_id(), u.span_id(), "each call its own span");
        assert_eq!(t.state(), Some("congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"));
    }

    #[test]
    fn the_sampled_flag_is_the_callers_and_a_child_keeps_it() {
        let p = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-";
        for (flags, sampled) in [("01", true), ("00", false), ("03", true), ("02", false)] {
            let t = TraceContext::child_of(&format!("{p}{flags}"), None).unwrap();
            assert_eq!(
                (t.sampled(), t.child().sampled()),
                (sampled, sampled),
                "{flags}"
            );
        }
        let t = TraceContext::child_of(GOOD, None).unwrap();
        assert_eq!(t.trace_bytes()[..2], [0x4b, 0xf9]);
        assert_eq!(t.parent_bytes()[..2], [0x00, 0xf0]);
    }

    #[test]
    fn a_child_keeps_the_trace_under_its_parents_span() {
        let t = TraceContext::child_of(GOOD, Some("rojo=1")).unwrap();
        let c = t.child();
        assert_eq!((c.trace_id(), c.parent_id()), (t.trace_id(), t.span_id()));
        assert_ne!(c.span_id(), t.span_id());
        assert_eq!(c.state(), Some("rojo=1"));
    }

    #[tokio::test]
    async fn the_current_context_is_the_scopes_and_none_outside() {
        assert_eq!(current(), None);
        let t = TraceContext::child_of(GOOD, None);
        let inside = CURRENT.scope(t.clone(), async { current() }).await;
        assert_eq!(inside, t);
        assert_eq!(CURRENT.scope(None, async { current() }).await, None);
    }

    #[test]
    fn anything_else_is_no_context() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "00-4bf92f3577b34da6a3ce929d0e0e47\u{e9}-00f067aa0ba902b7-01",
        ] {
            assert!(TraceContext::child_of(bad, None).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn an_invalid_tracestate_is_dropped_alone() {
        for bad in [
            "Upper=1",
            "k=v,=x",
            "k=a,b",
            "k=\u{1b}[2J",
            "k=",
            &format!("k={}", "v".repeat(600)),
            &(0..33)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join(","),
        ] {
            let t = TraceContext::child_of(GOOD, Some(bad)).unwrap();
            assert_eq!(t.state(), None, "{bad:?}");
        }
        let t = TraceContext::child_of(GOOD, Some("t1@sys=v, ,a/b*c=1")).unwrap();
        assert_eq!(t.state(), Some("t1@sys=v, ,a/b*c=1"));
    }
}
