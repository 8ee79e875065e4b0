//! The command line: profiles (clear errors, exit 2, nothing starts), `check`
//! (observed, fail closed with exit 3 and a named layer and fix).

use crate::common;
use common::*;

fn write(dir: &std::path::Path, name: &str, body: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn profile_list_show_validate() {
    let o = sandmux(&["profile", "list"]).output().unwrap();
    let t = text(&o);
    for n in ["default", "ci", "dev", "container"] {
        assert!(t.contains(n), "{t}");
    }
    let o = sandmux(&["profile", "show", "dev"]).output().unwrap();
    assert!(text(&o).contains("mode = \"host\""));
    let ws = Ws::new();
    let o = sandmux(&[
        "profile",
        "show",
        "default",
        "--resolved",
        "-w",
        ws.path().to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["fs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["path"] == ws.path().to_str().unwrap()));
    let dir = host_dir();
    let f = profile_file(dir.path(), "mine", "ci", |t| t);
    let o = sandmux(&["profile", "validate", f.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        o.status.success() && text(&o).contains("valid"),
        "{}",
        text(&o)
    );
}

/// Rust enum tags (`{"Builtin": …}`, `{"Symlink": …}`, `"ReadOnly"`) in a
/// value: keys or strings in CamelCase.
fn enum_tags(v: &serde_json::Value, at: &str, found: &mut Vec<String>) {
    let camel = |s: &str| {
        let b = s.as_bytes();
        b.len() > 1 && b[0].is_ascii_uppercase() && b[1].is_ascii_lowercase()
    };
    match v {
        serde_json::Value::Object(m) => {
            // The profile's own prose is no tag.
            for (k, x) in m.iter().filter(|(k, _)| *k != "description") {
                if camel(k) {
                    found.push(format!("{at}.{k}"));
                }
                enum_tags(x, &format!("{at}.{k}"), found);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                enum_tags(x, &format!("{at}[{i}]"), found);
            }
        }
        serde_json::Value::String(s)
            if camel(s) && s.chars().skip(1).any(|c| c.is_ascii_uppercase()) =>
        {
            found.push(format!("{at} = {s}"))
        }
        _ => {}
    }
}

fn without_nulls(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => m
            .into_iter()
            .filter(|(_, x)| !x.is_null())
            .map(|(k, x)| (k, without_nulls(x)))
            .collect(),
        serde_json::Value::Array(a) => a.into_iter().map(without_nulls).collect(),
        x => x,
    }
}

/// `profile show --resolved` shows the whole sandbox (every mount, `/dev`,
/// `/proc`, `/run/sandmux` and `/etc` included; each layer's requirement;
/// the Landlock rules of every role), in JSON and in TOML, the same data
/// both ways, with no Rust enum tags anywhere.
#[test]
fn resolved_profile_shows_the_whole_sandbox_without_enum_tags() {
    let ws = Ws::new();
    std::fs::create_dir_all(ws.path().join("a/.vscode")).unwrap();
    let wsp = ws.path().to_path_buf();
    for name in ["default", "container"] {
        let show = |format: &str| {
            let w = wsp.to_str().unwrap();
            let o = sandmux(&[
                "profile",
                "show",
                name,
                "--resolved",
                "-w",
                w,
                "--format",
                format,
            ])
            .output()
            .unwrap();
            assert!(o.status.success(), "{name} {format}: {}", text(&o));
            String::from_utf8(o.stdout).unwrap()
        };
        let json: serde_json::Value = serde_json::from_str(&show("json")).unwrap();
        let table: toml::Table = toml::from_str(&show("toml")).unwrap();
        let from_toml = serde_json::to_value(&table).unwrap();
        assert_eq!(
            without_nulls(json.clone()),
            from_toml,
            "{name}: JSON and TOML differ"
        );
        let mut tags = Vec::new();
        enum_tags(&json, "", &mut tags);
        assert!(tags.is_empty(), "{name}: enum tags at {tags:?}");
        assert_eq!(json["source"], format!("builtin:{name}"));
        let ws_entry = json["fs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"] == ws.path().to_str().unwrap());
        assert_eq!(ws_entry.unwrap()["kind"], "read-write", "{json}");
        let plan = &json["plan"];
        let mounts = plan["mounts"].as_array().unwrap();
        let at = |p: &str| mounts.iter().filter(|m| m["path"] == p).count();
        for p in [
            "/",
            "/dev",
            "/dev/pts",
            "/proc",
            "/run/sandmux",
            "/run/sandmux/sock",
            "/etc/passwd",
        ] {
            assert!(at(p) > 0, "{name}: no mount step at {p}: {plan}");
        }
        // Copy-on-write, the built-ins' mode: an overlay over the
        // workspace, and no guard's mount inside it.
        let protect = ws.path().join("a/.vscode");
        assert!(
            mounts
                .iter()
                .any(|m| m["path"] == ws.path().to_str().unwrap() && m["op"] == "overlay"),
            "{plan}"
        );
        assert!(
            !mounts
                .iter()
                .any(|m| m["path"] == protect.to_str().unwrap()),
            "{plan}"
        );
        assert!(mounts
            .iter()
            .all(|m| ["required", "if-present", "best-effort", "if-dropped"]
                .contains(&m["need"].as_str().unwrap())));
        let roles: Vec<&str> = plan["landlock"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["server", "pane", "command"]);
        let layers = plan["layers"].as_array().unwrap();
        let need = |l: &str| {
            layers
                .iter()
                .find(|x| x["layer"] == l)
                .map(|x| x["need"].clone())
        };
        assert_eq!(need("cgroup"), Some("best-effort".into()));
        let userns = if name == "container" {
            "best-effort"
        } else {
            "required"
        };
        assert_eq!(need("userns"), Some(userns.into()));
        assert_eq!(plan["paths"]["socket"], "/run/sandmux/sock/tmux.sock");
    }
}

#[test]
fn invalid_profiles_name_file_line_key_and_start_nothing() {
    let dir = host_dir();
    let ws = Ws::new();
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "unknown.toml",
            "version = 1\ndescription = \"x\"\n[network]\nmode = \"none\"\nmdoe = \"host\"\n",
            &["line 5", "mdoe"],
        ),
        (
            "type.toml",
            "version = 1\ndescription = \"x\"\n[limits]\nnofile = \"lots\"\n",
            &["line 4", "nofile"],
        ),
        (
            "mode.toml",
            "version = 1\ndescription = \"x\"\n[network]\nmode = \"internet\"\n",
            &["line 4", "internet"],
        ),
        (
            "layer.toml",
            "version = 1\ndescription = \"x\"\n[enforcement]\nbest_effort = [\"landlok\"]\n",
            &["line 4", "landlok"],
        ),
        (
            "missing.toml",
            "version = 1\ndescription = \"x\"\n[filesystem]\nread_only = [\"/no/such/dir\"]\n",
            &[
                "line 4",
                "filesystem.read_only",
                "/no/such/dir",
                "does not exist",
            ],
        ),
        (
            "uid.toml",
            "version = 1\ndescription = \"x\"\n[sandbox]\nuid = 0\n",
            &["line 4", "sandbox.uid"],
        ),
        (
            "sessions.toml",
            "version = 1\ndescription = \"x\"\n[limits]\nmax_sessions = 0\n",
            &["line 4", "limits.max_sessions", "outside 1-256"],
        ),
        (
            "env.toml",
            "version = 1\ndescription = \"x\"\n[environment]\nkeep = [\"LD_PRELOAD\"]\n",
            &["line 4", "environment.keep", "LD_PRELOAD"],
        ),
    ];
    for (name, body, needles) in cases {
        let p = write(dir.path(), name, body);
        let marker = ws.join("ran");
        let o = run(ws.path())
            .profile(&p)
            .cmd(["touch", marker.to_str().unwrap()])
            .output();
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {t}");
        assert!(
            t.contains(p.to_str().unwrap()),
            "{name}: file not named: {t}"
        );
        for n in *needles {
            assert!(t.contains(n), "{name}: {n:?} missing from: {t}");
        }
        assert!(!marker.exists(), "{name}: something ran");
        let o = sandmux(&["profile", "validate", p.to_str().unwrap()])
            .output()
            .unwrap();
        if *name != "missing.toml" {
            assert_eq!(o.status.code(), Some(2), "validate {name}: {}", text(&o));
        }
    }
}

#[test]
fn bad_workspace_and_profile_sources() {
    let dir = host_dir();
    let ws = Ws::new();
    // A symlinked workspace is refused.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(ws.path(), &link).unwrap();
    run(&link).cmd(["true"]).output().code(2).says("symlink");
    // A missing workspace is refused.
    run("/no/such/workspace")
        .cmd(["true"])
        .output()
        .code(2)
        .says("/no/such/workspace");
    // A profile inside the workspace is refused (E30: the agent must not widen its sandbox).
    let p = profile_file(&ws.path(), "evil", "dev", |t| t);
    run(ws.path())
        .profile(&p)
        .cmd(["true"])
        .output()
        .code(2)
        .says("inside the workspace");
    // An unknown profile name lists the built-ins.
    ran(&mut sandmux(&["run", "-p", "nosuch", "--", "true"]))
        .code(2)
        .says("default, ci, dev, container");
}

#[test]
fn check_observes_every_layer_from_inside() {
    let ws = Ws::new();
    for profile in ["default", "ci"] {
        let o = sandmux(&[
            "check",
            "--json",
            "-p",
            profile,
            "-w",
            ws.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
        assert_eq!(o.status.code(), Some(0), "{profile}: {v:#}");
        assert_eq!(v["all_passed"], true);
        let names: Vec<&str> = v["observations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap())
            .collect();
        for n in [
            "no_new_privs",
            "capabilities",
            "seccomp",
            "tmux_socket",
            "tmux_server_reach",
            "tcp_connect",
            "tiocsti",
            "unshare_user",
            "write_outside_workspace",
            "read_secrets",
            "environment",
        ] {
            assert!(names.contains(&n), "{n} not probed: {names:?}");
        }
        let layers = v["layers"].as_array().unwrap();
        let enforced = |l: &str| {
            layers
                .iter()
                .any(|x| x["layer"] == l && x["enforced"] == true)
        };
        for l in [
            "userns",
            "mount",
            "pid",
            "net",
            "landlock",
            "landlock-scope",
            "seccomp",
            "caps",
            "no-new-privs",
            "rlimits",
            "keyring",
        ] {
            assert!(enforced(l), "{l} not enforced: {v:#}");
        }
    }
}

/// E17/E32: a profile pinned to an ABI without scopes refuses to start (the
/// layer is required), naming the layer and the fix; the explicit opt-in starts
/// and the report lists exactly that layer as dropped.
#[test]
fn fail_closed_on_missing_layer_and_report_the_opt_in() {
    let dir = host_dir();
    let ws = Ws::new();
    let pinned = profile_file(dir.path(), "abi5", "default", |t| {
        t.replace("[enforcement]\n", "[enforcement]\nlandlock_abi = 5\n")
    });
    let o = sandmux(&[
        "check",
        "-p",
        pinned.to_str().unwrap(),
        "-w",
        ws.path().to_str().unwrap(),
    ])
    .output()
    .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(t.contains("landlock-scope") && t.contains("fix:"), "{t}");
    run(ws.path())
        .profile(&pinned)
        .cmd(["touch", "ran"])
        .output()
        .code(3);
    assert!(
        !ws.join("ran").exists(),
        "the command ran without a required layer"
    );

    let opted = profile_file(dir.path(), "abi5opt", "default", |t| {
        t.replace("[enforcement]\n", "[enforcement]\nlandlock_abi = 5\n")
            .replace(
                "best_effort = [\"cgroup\"]",
                "best_effort = [\"cgroup\", \"landlock-scope\"]",
            )
    });
    let o = sandmux(&[
        "check",
        "--json",
        "-p",
        opted.to_str().unwrap(),
        "-w",
        ws.path().to_str().unwrap(),
    ])
    .output()
    .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let dropped: Vec<&str> = v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["enforced"] == false)
        .map(|l| l["layer"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = if dropped.contains(&"cgroup") {
        vec!["cgroup", "landlock-scope"]
    } else {
        vec!["landlock-scope"]
    };
    assert_eq!(dropped, expected, "{v:#}");
    // Without the scope, the pane really can signal the tmux server: the report is observed, not planned.
    let reach = v["observations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "tmux_server_reach")
        .unwrap();
    assert!(
        reach["observed"]
            .as_str()
            .unwrap()
            .contains("SIGNAL DELIVERED"),
        "{reach}"
    );
}

/// docs/architecture.md's tables about the sandbox are generated from the
/// code and must match it.
#[test]
fn docs_sandbox_tables_match_the_code() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md"))
        .unwrap();
    for name in ["seccomp-denied", "layers", "landlock", "mount-view"] {
        let o = sandmux(&["__tables-doc", name]).output().unwrap();
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let table = String::from_utf8(o.stdout).unwrap();
        let (b, e) = (
            format!("<!-- {name}:begin -->\n"),
            format!("<!-- {name}:end -->"),
        );
        let begin = doc
            .find(&b)
            .unwrap_or_else(|| panic!("no {b} in docs/architecture.md"))
            + b.len();
        let end = doc.find(&e).unwrap_or_else(|| panic!("no {e}"));
        assert_eq!(
            &doc[begin..end],
            table,
            "regenerate with: sandmux __tables-doc {name}"
        );
    }
}

/// docs/mcp.md's tool table is generated from the catalogue and must match it.
#[test]
fn docs_tool_table_matches_the_catalogue() {
    let o = sandmux(&["__tools-doc"]).output().unwrap();
    let table = String::from_utf8(o.stdout).unwrap();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/mcp.md")).unwrap();
    let begin = doc.find("<!-- tools:begin -->\n").unwrap() + "<!-- tools:begin -->\n".len();
    let end = doc.find("<!-- tools:end -->").unwrap();
    assert_eq!(
        &doc[begin..end],
        table,
        "regenerate with: sandmux __tools-doc"
    );
    assert_eq!(table.lines().count(), 2 + 57);
}

/// Issue 26: `serve --help` names every built-in profile (as `profile
/// list` does) and the `core` preset; `run -q` says nothing when
/// `--on-end apply` brought everything in, and still says what it left.
#[test]
fn help_names_every_built_in_and_run_q_is_quiet() {
    let help = sandmux(&["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let list = sandmux(&["profile", "list"]).output().unwrap();
    let builtins: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|l| l.contains(" builtin "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(builtins.len() >= 5, "{builtins:?}");
    for b in &builtins {
        assert!(
            help.contains(b.as_str()),
            "serve --help misses {b}:\n{help}"
        );
    }
    assert!(help.contains("`core`"), "{help}");
    let ws = Ws::new();
    let state = host_dir();
    let o = run(ws.path())
        .quiet()
        .state(state.path())
        .script("echo work > notes.txt")
        .output();
    assert_eq!(o.stderr(), "", "run -q said something");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes.txt")).unwrap(),
        "work\n"
    );
    let o = run(ws.path())
        .quiet()
        .state(state.path())
        .script("mkdir -p .vscode && echo '{}' > .vscode/tasks.json")
        .output();
    assert!(o.stderr().contains("held back"), "{}", o.stderr());
}

/// An optional user config that cannot be read (a `HOME` that is not this
/// user's: a directory where the file should be; as non-root also a file
/// of mode 000) is said once with its fix, and `run` goes on with every
/// default. Control: the same path holding a readable but wrong file stops
/// the start naming file and key (it is read where it can be).
#[test]
fn an_unreadable_user_config_is_a_warning_with_its_fix() {
    let host = host_dir();
    let ws = Ws::new();
    let cfg = host.path().join("cfg");
    let file = cfg.join("sandmux/config.toml");
    std::fs::create_dir_all(&file).unwrap();
    let go = || {
        run(ws.path())
            .state(host.path().join("state"))
            .script("echo ran-ok")
            .command()
            .env("XDG_CONFIG_HOME", &cfg)
            .output()
            .unwrap()
    };
    let mut cases = vec!["a directory"];
    if !nix::unistd::geteuid().is_root() {
        cases.push("mode 000");
    }
    for case in cases {
        if case == "mode 000" {
            std::fs::remove_dir(&file).unwrap();
            std::fs::write(&file, "[workspace]\nkeep_days = 3\n").unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).unwrap();
        }
        let o = go();
        let t = text(&o);
        assert!(o.status.success() && t.contains("ran-ok"), "{case}: {t}");
        assert!(
            t.contains("not read") && t.contains("XDG_CONFIG_HOME"),
            "{case}: {t}"
        );
    }
    // Control: readable and wrong is an error naming the key.
    let _ = std::fs::remove_dir(&file);
    let _ = std::fs::remove_file(&file);
    std::fs::write(&file, "[workspace]\nkeep_days = 99999\n").unwrap();
    let o = go();
    let t = text(&o);
    assert!(!o.status.success() && !t.contains("ran-ok"), "{t}");
    assert!(t.contains("keep_days"), "{t}");
}
