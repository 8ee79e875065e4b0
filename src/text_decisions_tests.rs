//! No decision reads message text (issue 42): what sandmux decides is
//! decided on types, and a message is rendered from the type, never
//! searched.
//!
//! The scan lists every `.contains("…")`, `.starts_with("…")` and
//! `.ends_with("…")` with a string literal in the code (not the tests) of
//! every file under `src/`; each one found must be on [`DATA`], with why
//! what it reads is data (a path, a kernel file, a protocol word, a name),
//! not a message. A new one fails the test until it is made typed or
//! listed. What it cannot see: a pattern that is not a literal (a
//! constant, a `format!`), and `==` on a rendered string (the tmux
//! client's closing reasons were such constants: they are
//! `tmux::closing::Closing` now).

use std::path::Path;

/// (file under `src/`, method, literal): why it is data.
const DATA: &[(&str, &str, &str, &str)] = &[
    (
        "sandbox/view.rs",
        "ends_with",
        "resolv.conf",
        "a path of the plan",
    ),
    (
        "sandbox/view.rs",
        "ends_with",
        "hosts",
        "a path of the plan",
    ),
    (
        "sandbox/pane.rs",
        "contains",
        "__sandmux_prompt",
        "the value of PROMPT_COMMAND",
    ),
    (
        "sandbox/namespaces.rs",
        "starts_with",
        "/proc/",
        "a mount point in mountinfo",
    ),
    (
        "sandbox/observe.rs",
        "ends_with",
        "0000000000000000",
        "a capability mask in /proc",
    ),
    (
        "sandbox/observe.rs",
        "contains",
        "sandmux",
        "PID 1's command line",
    ),
    (
        "sandbox/seccomp.rs",
        "starts_with",
        "mknod",
        "a syscall's name",
    ),
    (
        "supervisor/rundir.rs",
        "starts_with",
        ".new-",
        "a directory's name",
    ),
    (
        "supervisor/probe.rs",
        "contains",
        "errno",
        "the kernel's seccomp actions",
    ),
    ("check/mirror_profile.rs", "ends_with", "-mirror", "a profile's name"),
    ("cli/approvals_cmd.rs", "contains", "  ", "how a detail is shown (quoted or not)"),
    ("door/named.rs", "starts_with", "includeif.", "a git config key"),
    ("door/named.rs", "ends_with", ".path", "a git config key"),
    ("door/named.rs", "starts_with", "~/", "a path in git config"),
    ("door/refs.rs", "contains", "..", "a ref's name (git's rules)"),
    ("door/refs.rs", "contains", "//", "a ref's name (git's rules)"),
    ("door/refs.rs", "ends_with", ".lock", "a ref's name (git's rules)"),
    ("guard/commit.rs", "ends_with", ".lock", "a git file's name"),
    ("log.rs", "starts_with", "sandmux::", "a tracing target"),
    ("mcp/catalog.rs", "starts_with", "socket", "a schema property's name"),
    ("mcp/http/router.rs", "starts_with", "x-forwarded-", "an HTTP header's name"),
    ("mcp/http/router.rs", "starts_with", "mcp-", "an HTTP header's name"),
    ("mcp/metrics.rs", "starts_with", "resource:", "a metric's key"),
    ("mcp/metrics.rs", "starts_with", "prompt:", "a metric's key"),
    ("mcp/schema.rs", "contains", "\\", "a JSON schema (a `$ref` in it)"),
    (
        "mcp/targets.rs",
        "contains",
        "can't find pane",
        "tmux's %error reply (tmux 3.3 has no error codes): only the hint of a not-found pane depends on it",
    ),
    ("mcp/text.rs", "starts_with", "'\\\\''", "shell quoting of a command"),
    ("mcp/tools/read.rs", "ends_with", "\\n\\n", "a pane's captured text"),
    ("mcp/tools/spawn.rs", "starts_with", "/tmp", "a path"),
    ("mcp/toolsets.rs", "starts_with", "SANDMUX_", "an environment variable's name"),
    ("otlp/mod.rs", "starts_with", "resource:", "a call's key"),
    ("otlp/mod.rs", "starts_with", "prompt:", "a call's key"),
    ("profile/credentials.rs", "starts_with", "proxy-", "an HTTP header's name"),
    ("profile/schema.rs", "starts_with", "TMUX", "an environment variable's name"),
    ("profile/schema.rs", "starts_with", "SANDMUX", "an environment variable's name"),
    ("profile/schema.rs", "starts_with", "LD_", "an environment variable's name"),
    ("profile/schema.rs", "starts_with", "DBUS_", "an environment variable's name"),
    ("profile/schema.rs", "starts_with", "SSH_", "an environment variable's name"),
    ("profile/schema.rs", "starts_with", "TERM_PROGRAM", "an environment variable's name"),
    ("profile/toolchains/find.rs", "starts_with", "/usr/", "a path"),
    ("profile/toolchains/find.rs", "starts_with", "/opt/", "a path"),
    ("proxy/intercept.rs", "starts_with", "proxy-", "an HTTP header's name"),
];

/// Every (file, method, literal) in the code of `dir`.
fn found(src: &Path, dir: &str, out: &mut Vec<(String, String, String)>) {
    for e in std::fs::read_dir(src.join(dir)).unwrap().flatten() {
        let p = e.path();
        let rel = p.strip_prefix(src).unwrap().display().to_string();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            found(src, &rel, out);
            continue;
        }
        if !name.ends_with(".rs") || name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let code = text.split("\n#[cfg(test)]").next().unwrap_or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for m in ["contains", "starts_with", "ends_with"] {
                let open = format!(".{m}(\"");
                for (i, _) in line.match_indices(&open) {
                    let lit = &line[i + open.len()..];
                    let lit = lit.split('"').next().unwrap_or_default();
                    out.push((rel.clone(), m.to_string(), lit.to_string()));
                }
            }
        }
    }
}

#[test]
fn no_decision_reads_message_text() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    found(&src, "", &mut all);
    let listed = |f: &str, m: &str, l: &str| {
        DATA.iter()
            .any(|(df, dm, dl, _)| *df == f && *dm == m && *dl == l)
    };
    let mut wrong: Vec<String> = all
        .iter()
        .filter(|(f, m, l)| !listed(f, m, l))
        .map(|(f, m, l)| {
            format!("{f}: .{m}(\"{l}\"): decide on a type, or list it in DATA with why it is data")
        })
        .collect();
    for (f, m, l, _) in DATA {
        if !all.iter().any(|(af, am, al)| af == f && am == m && al == l) {
            wrong.push(format!("{f}: .{m}(\"{l}\") is gone: take it off DATA"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The scan sees what it looks for: a decision on a message, as
/// `container.rs` made before the refusal was typed, is found.
#[test]
fn the_scan_finds_a_decision_on_a_message() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("sandbox")).unwrap();
    std::fs::write(
        d.path().join("sandbox/container.rs"),
        "fn fix(message: &str) -> bool {\n    message.contains(\"procfs\")\n}\n#[cfg(test)]\nmod tests {\n    fn t() { assert!(s.contains(\"x\")); }\n}\n",
    )
    .unwrap();
    let mut all = Vec::new();
    found(d.path(), "sandbox", &mut all);
    let want = (
        "sandbox/container.rs".into(),
        "contains".into(),
        "procfs".into(),
    );
    assert_eq!(all, vec![want]);
}
