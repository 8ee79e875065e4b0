//! The audit log's unit tests.

use super::*;

/// The tests' secrets (the MCP catalogue's are tested in `mcp::catalog`).
static SECRETS: std::sync::LazyLock<Secrets> =
    std::sync::LazyLock::new(|| (vec!["keys", "text"], Vec::new()));

fn entry<'a>(tool: &'a str, args: &'a Value) -> Entry<'a> {
    Entry {
        tool,
        toolset: Some("execute"),
        outcome: "ok",
        error_type: None,
        duration_ms: 1,
        request_id: "1".into(),
        client_id: None,
        http: None,
        trace: None,
        args,
        checkpoint: None,
    }
}

fn call(a: &Audit, tool: &str, args: &Value) -> Result<(), Unadmitted> {
    a.admit(tool).map(|t| t.record(entry(tool, args)))
}

#[test]
fn chain_detects_edit_removal_reorder_torn_and_unsealed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.jsonl");
    let a = Audit::open(&p, 1 << 20, &SECRETS).unwrap();
    for i in 0..4 {
        call(
            &a,
            "send_keys",
            &json!({"text": format!("secret-{i}"), "pane_id": "%1"}),
        )
        .unwrap();
    }
    assert_eq!(
        verify(&p).unwrap(),
        Verified {
            records: 4,
            sealed: false
        }
    );
    a.seal(0);
    assert_eq!(
        verify(&p).unwrap(),
        Verified {
            records: 5,
            sealed: true
        }
    );
    // One writer at a time.
    let e = Audit::open(&p, 1 << 20, &SECRETS).err().unwrap();
    assert!(matches!(e, OpenError::Held { .. }), "{e}");
    assert!(e.to_string().contains("another running instance"), "{e}");
    drop(a);
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(!text.contains("secret-"), "secret in the log: {text}");
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&p, text.replace("%1", "%2")).unwrap();
    assert!(verify(&p).unwrap_err().to_string().contains("edited"));
    std::fs::write(&p, format!("{}\n{}\n{}\n", lines[0], lines[2], lines[3])).unwrap();
    assert!(verify(&p).is_err());
    let swapped = format!("{}\n{}\n{}\n{}\n", lines[0], lines[2], lines[1], lines[3]);
    std::fs::write(&p, swapped).unwrap();
    assert!(verify(&p).is_err());
    // A removed tail: intact, but not sealed.
    std::fs::write(&p, format!("{}\n", lines[..4].join("\n"))).unwrap();
    assert!(!verify(&p).unwrap().sealed);
    // A torn last line is named, and not continued.
    std::fs::write(
        &p,
        format!("{}\n{}", lines[..3].join("\n"), &lines[3][..40]),
    )
    .unwrap();
    let e = verify(&p).unwrap_err().to_string();
    assert!(
        e.starts_with("line 4: torn") && e.contains("3 records before it"),
        "{e}"
    );
    let e = Audit::open(&p, 1 << 20, &SECRETS).err().unwrap();
    assert!(
        matches!(e, OpenError::LastLink(file::LastLinkError::Torn { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("torn"), "{e}");
    // Reopening continues the chain.
    std::fs::write(&p, format!("{}\n", lines.join("\n"))).unwrap();
    let b = Audit::open(&p, 1 << 20, &SECRETS).unwrap();
    call(&b, "list_panes", &json!({})).unwrap();
    assert_eq!(verify(&p).unwrap().records, 6);
}

#[test]
fn every_record_and_the_window_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.jsonl");
    let a = Audit::open(&p, 1 << 30, &SECRETS).unwrap();
    let huge = "\u{1b}".repeat(10_000);
    let args =
        json!({"pattern": huge, "many": (0..2000).map(|i| i.to_string()).collect::<Vec<_>>()});
    for _ in 0..200 {
        let t = a.admit("x").unwrap();
        t.record(Entry {
            request_id: huge.clone(),
            client_id: Some(huge.clone()),
            http: None,
            ..entry(&huge, &args)
        });
    }
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(
        text.lines().all(|l| l.len() < RECORD_MAX),
        "a record over the cap"
    );
    assert!(text.len() < 200 * RECORD_MAX);
    let window: usize = a.recent(1000, usize::MAX).iter().map(|r| r.len()).sum();
    assert!(window <= WINDOW_MAX + RECORD_MAX, "{window}");
    assert_eq!(verify(&p).unwrap().records, 200);
}

#[test]
fn the_budget_refuses_calls_and_keeps_room_for_the_seal() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.jsonl");
    let a = Audit::open(&p, 64 * 1024, &SECRETS).unwrap();
    let big = json!({"pattern": "x".repeat(900)});
    let mut ran = 0;
    while call(&a, "capture_pane", &big).is_ok() {
        ran += 1;
        assert!(ran < 1000, "the budget never refused");
    }
    let e = call(&a, "capture_pane", &big).unwrap_err();
    assert!(matches!(e, Unadmitted::Full { .. }), "{e}");
    let e = e.to_string();
    assert!(e.contains("budget") && e.contains("audit_max_bytes"), "{e}");
    assert_eq!(a.status()["state"], "full");
    assert_eq!(a.status()["refused_calls"], 2);
    // Events that do not fit are counted, not written.
    assert!(!a.record(entry("(event)", &big)));
    a.seal(0);
    let v = verify(&p).unwrap();
    assert!(v.sealed && v.records == ran + 1, "{v:?}");
    assert!(std::fs::metadata(&p).unwrap().len() <= 64 * 1024);
    let last = std::fs::read_to_string(&p).unwrap();
    let seal: Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    assert_eq!(seal["args"]["refused_calls"], 2);
    assert_eq!(seal["args"]["unrecorded"], 1);
    assert_eq!(seal["args"]["budget_reached"], true);
}

#[test]
fn forged_seals_abandoned_calls_and_the_events_room() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.jsonl");
    let a = Audit::open(&p, 64 * 1024, &SECRETS).unwrap();
    // The agent names a tool "(sealed)": recorded, never taken for a seal.
    a.record(Entry {
        outcome: "refused",
        ..entry(SEAL, &Value::Null)
    });
    assert!(!verify(&p).unwrap().sealed);
    // A call whose record is never written leaves an `abandoned` one.
    drop(a.admit("run_command").unwrap());
    let last = std::fs::read_to_string(&p).unwrap();
    let v: Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    assert_eq!(
        (v["tool"].as_str(), v["error_type"].as_str()),
        (Some("run_command"), Some("abandoned"))
    );
    // Refusals stop short of the events' room; events still go in.
    let big = json!({"pattern": "x".repeat(900)});
    let mut n = 0;
    while a.record(entry("nope", &big)) {
        n += 1;
    }
    assert!(n > 10);
    assert!(a.event(entry("(oom-kill)", &big)));
    a.seal(0);
    assert!(verify(&p).unwrap().sealed);
}
