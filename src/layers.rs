//! The layers of the crate, lowest first, and the test that keeps them:
//! a module may name (`crate::…`) only modules of a lower layer. Every
//! top-level module must be placed here; a new one fails the test until it
//! is. `docs/architecture.md` ("Layers") says the same in words.
//!
//! An instance's life on the host (its generations, cgroup and plan, the
//! `Instance`, the broker) is `supervisor`; what runs inside the sandbox is
//! `sandbox`; tmux itself is `tmux`; `serve`'s running instance apart from
//! the MCP protocol (approvals, freeze, the operator endpoint, recording,
//! generations) is `runtime`, below `mcp`.

/// Lowest first; the modules of one layer may not name each other.
pub(crate) const LAYERS: &[&[&str]] = &[
    &["term", "nonce", "secretfile", "secretcmd"],
    &["log", "tracectx"],
    &["otlp"],
    &["profile", "audit"],
    &["sandbox"],
    &["confine"],
    &["guard", "proxy"],
    &["tmux"],
    &["supervisor"],
    &["runtime"],
    &["check", "mcp", "door"],
    &["operator", "tables", "entrypoint"],
    &["attach"],
    &["cli"],
];

/// Imports that still run upward, each with the move that ends it. The test
/// fails when one of them is gone (take it off) or a new one appears.
pub(crate) const NOT_YET: &[(&str, &str, &str)] = &[];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    fn layer_of(m: &str) -> Option<usize> {
        LAYERS.iter().position(|l| l.contains(&m))
    }

    /// Top-level module of a file under `src/` (`None`: the crate root).
    /// A unit-test file (`tests.rs`, `NAME_tests.rs`) belongs to none: it
    /// drives its module from above (the profile's tests hand in the guard's
    /// real planner; the supervisor's confine a thread and read a rotated
    /// credential through the proxy's vault).
    fn module_of(rel: &Path) -> Option<String> {
        let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            return None;
        }
        let first = rel.components().next()?.as_os_str().to_str()?;
        let m = first.trim_end_matches(".rs");
        (!["lib", "main", "layers"].contains(&m)).then(|| m.to_string())
    }

    /// Every `crate::NAME` in code (not comments) of each file: (from, to) → files.
    fn imports() -> BTreeMap<(String, String), BTreeSet<String>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        let mut stack = vec![src.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let rel = p.strip_prefix(&src).unwrap();
                let (Some(from), Some("rs")) =
                    (module_of(rel), p.extension().and_then(|x| x.to_str()))
                else {
                    continue;
                };
                for line in std::fs::read_to_string(&p).unwrap().lines() {
                    let code = line.split("//").next().unwrap_or("");
                    for (i, _) in code.match_indices("crate::") {
                        let to: String = code[i + 7..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        if to != from && !to.is_empty() {
                            out.entry((from.clone(), to))
                                .or_default()
                                .insert(rel.display().to_string());
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn imports_only_point_down() {
        let all = imports();
        let mut wrong = Vec::new();
        for ((from, to), files) in &all {
            let (Some(a), Some(b)) = (layer_of(from), layer_of(to)) else {
                wrong.push(format!(
                    "{from} -> {to}: place every top-level module in LAYERS"
                ));
                continue;
            };
            let listed = NOT_YET.iter().any(|(f, t, _)| f == from && t == to);
            if a <= b && !listed {
                wrong.push(format!(
                    "{from} -> {to} runs upward or sideways ({files:?})"
                ));
            }
        }
        for (f, t, why) in NOT_YET {
            if !all.contains_key(&(f.to_string(), t.to_string())) {
                wrong.push(format!("{f} -> {t} is gone: take it off NOT_YET ({why})"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// What runs inside the sandbox acts on the compiled blueprint alone:
    /// no file of `__init`, PID 1, the payload or the pane gate names the
    /// profile's policy (issue 25: one compiled value crosses).
    #[test]
    fn the_policy_does_not_cross_into_the_sandbox() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sandbox");
        let inside = [
            "init.rs",
            "pid1.rs",
            "payload.rs",
            "pane.rs",
            "observe.rs",
            "uid.rs",
            "limits.rs",
            "env.rs",
            "hostview.rs",
            "plan/gate.rs",
            "mounts",
        ];
        let mut files: Vec<std::path::PathBuf> = Vec::new();
        for f in inside {
            let p = src.join(f);
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
            } else {
                files.push(p);
            }
        }
        let mut named = Vec::new();
        for p in files {
            for (n, line) in std::fs::read_to_string(&p).unwrap().lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if code.contains("Policy") {
                    named.push(format!("{}:{}: {}", p.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(named.is_empty(), "{}", named.join("\n"));
        assert!(
            std::fs::read_to_string(src.join("mod.rs"))
                .unwrap()
                .contains("pub blueprint: plan::Blueprint,"),
            "the Plan carries the blueprint"
        );
    }

    #[test]
    fn every_top_level_module_is_placed() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for e in std::fs::read_dir(src).unwrap().flatten() {
            if let Some(m) = module_of(Path::new(&e.file_name())) {
                assert!(layer_of(&m).is_some(), "{m} is in no layer of LAYERS");
            }
        }
    }
}
