//! What `/proc` says about processes: a process's children (by the parent
//! link of every `/proc/PID/stat`), for the reapers that end what is left.

use nix::unistd::Pid;

/// The processes whose parent is `parent`.
pub(crate) fn children_of(parent: u32) -> Vec<Pid> {
    let me = parent.to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The parent is the second field after the command's closing parenthesis.
            stat.rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .is_some_and(|ppid| ppid == me)
        })
        .map(Pid::from_raw)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_child_is_found_and_only_while_it_is_ours() {
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let kids = super::children_of(me);
        assert!(kids.iter().any(|p| p.as_raw() as u32 == c.id()), "{kids:?}");
        // Control: the child is nobody's child of its own.
        assert!(super::children_of(c.id()).is_empty());
        let _ = c.kill();
        let _ = c.wait();
        assert!(!super::children_of(me)
            .iter()
            .any(|p| p.as_raw() as u32 == c.id()));
    }
}
