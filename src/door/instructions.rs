//! Files that AI coding tools read as standing instructions when they next
//! start in a directory: an agent's words, obeyed by the human's next,
//! unconfined agent. Held back and shown apart in review, like control.
//!
//! Tools find them by name, so this is a list — kept as a class by two
//! rules beside it: a name compares without regard to ASCII case, at any
//! depth; and anything in a `rules`, `instructions`, `prompts`, `steering`,
//! `agents`, `commands`, `memories` or `chatmodes` folder of a dot
//! directory (`.cursor/rules/`, `.kiro/steering/`, `.github/prompts/`, and
//! the next tool's) counts, whatever the tool.

use std::path::Path;

/// Names (files or folders) that coding agents read as instructions,
/// settings or hooks.
const NAMES: [&str; 53] = [
    "AGENTS.md",
    "AGENTS.override.md",
    "AGENT.md",
    "CLAUDE.md",
    "CLAUDE.local.md",
    ".claude",
    "GEMINI.md",
    ".gemini",
    ".cursorrules",
    ".cursor",
    ".windsurfrules",
    ".windsurf",
    ".clinerules",
    ".cline",
    ".roo",
    ".roorules",
    ".kiro",
    ".amazonq",
    ".codex",
    ".continue",
    ".continuerules",
    ".aider.conf.yml",
    "CONVENTIONS.md",
    ".goosehints",
    ".junie",
    ".augment",
    ".augment-guidelines",
    ".rules",
    ".trae",
    ".qwen",
    "QWEN.md",
    "CRUSH.md",
    ".crush",
    "WARP.md",
    ".kilocode",
    ".openhands",
    ".opencode",
    "opencode.json",
    "opencode.jsonc",
    ".mcp.json",
    ".copilot",
    "copilot-instructions.md",
    ".aiassistant",
    ".tabnine",
    ".zed/rules",
    ".idx/airules.md",
    ".roomodes",
    "crush.json",
    ".crush.json",
    ".factory",
    ".agent",
    ".agents",
    ".amp",
];

/// Folders of a dot directory whose files are instructions for a tool.
const FOLDERS: [&str; 8] = [
    "rules",
    "instructions",
    "prompts",
    "steering",
    "agents",
    "commands",
    "memories",
    "chatmodes",
];

/// [`NAMES`] by their first component, and [`FOLDERS`], lower-cased: one
/// lookup a path component.
struct Index {
    by_first: std::collections::HashMap<String, Vec<Vec<String>>>,
    folders: std::collections::HashSet<String>,
}

fn index() -> &'static Index {
    static INDEX: std::sync::OnceLock<Index> = std::sync::OnceLock::new();
    INDEX.get_or_init(|| {
        let mut by_first: std::collections::HashMap<String, Vec<Vec<String>>> = Default::default();
        for n in NAMES {
            let parts: Vec<String> = n.split('/').map(str::to_ascii_lowercase).collect();
            by_first.entry(parts[0].clone()).or_default().push(parts);
        }
        let folders = FOLDERS.iter().map(|f| f.to_ascii_lowercase()).collect();
        Index { by_first, folders }
    })
}

/// Whether `rel` is, or lies in, a file coding agents read as instructions.
pub(crate) fn is_instructions(rel: &Path) -> bool {
    let ix = index();
    let parts: Vec<String> = rel
        .iter()
        .filter_map(|p| p.to_str())
        .map(str::to_ascii_lowercase)
        .collect();
    for i in 0..parts.len() {
        let named = ix.by_first.get(&parts[i]).is_some_and(|names| {
            names.iter().any(|want| {
                parts
                    .get(i..i + want.len())
                    .is_some_and(|got| got == want.as_slice())
            })
        });
        let dot_folder =
            parts[i].starts_with('.') && parts.get(i + 1).is_some_and(|f| ix.folders.contains(f));
        if named || dot_folder {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instruction_files_are_known_at_any_depth_and_case() {
        for p in [
            "AGENTS.md",
            "sub/dir/claude.md",
            ".github/copilot-instructions.md",
            ".github/prompts/x.prompt.md",
            ".newtool/rules/style.md",
            ".cursor/rules/a.mdc",
            "pkg/.clinerules",
        ] {
            assert!(is_instructions(Path::new(p)), "{p}");
        }
        for p in [
            "README.md",
            "src/agents.rs",
            "docs/rules/x.md",
            ".github/workflows/ci.yml",
        ] {
            assert!(!is_instructions(Path::new(p)), "{p}");
        }
    }
}
