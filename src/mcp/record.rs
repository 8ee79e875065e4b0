//! Recording (`sandmux serve --record FILE.cast`): the first session's first
//! pane, as an asciicast v2 file that `asciinema play` replays. It starts with
//! a snapshot of the screen (so a recording begun after the pane drew its
//! prompt still replays to the same screen), then every `%output` chunk with
//! its time. Typed input is never recorded: only what the pane writes.

use crate::tmux::hub::{Cmd, Hub};
use serde_json::json;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Builds the asciicast header line.
pub fn header(width: u32, height: u32) -> String {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({"version": 2, "width": width, "height": height, "timestamp": ts, "env": {"TERM": "screen"}, "title": "sandmux"}).to_string()
}

/// One output event line.
pub fn event(t: f64, data: &str) -> String {
    json!([t, "o", data]).to_string()
}

/// A screen snapshot as terminal output: clear, the lines with their colours, the cursor.
pub async fn snapshot(hub: &Hub, pane: &str) -> Result<(String, u32, u32), String> {
    let info = hub
        .run(
            &Cmd::new("display-message")
                .flag("-p")
                .opt("-t", pane)
                .arg("#{pane_width} #{pane_height} #{cursor_x} #{cursor_y}"),
        )
        .await
        .map_err(|e| e.to_string())?;
    let nums: Vec<u32> = info
        .first()
        .map(|l| {
            String::from_utf8_lossy(l)
                .split(' ')
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let [w, h, x, y] = nums[..] else {
        return Err("cannot read the pane size".into());
    };
    let lines = hub
        .run_checked(
            &Cmd::new("capture-pane")
                .flag("-p")
                .flag("-e")
                .opt("-t", pane),
        )
        .await
        .map_err(|e| e.to_string())?;
    let body: Vec<String> = lines
        .iter()
        .take(h as usize)
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect();
    Ok((
        format!(
            "\x1b[H\x1b[2J{}\x1b[0m\x1b[{};{}H",
            body.join("\r\n"),
            y + 1,
            x + 1
        ),
        w,
        h,
    ))
}

/// Starts recording to `path`.
pub async fn start(hub: &Arc<Hub>, path: &Path, control_id: &str) -> Result<(), String> {
    let rows = hub
        .run(
            &Cmd::new("list-panes")
                .flag("-a")
                .opt("-F", "#{session_id} #{pane_id}"),
        )
        .await
        .map_err(|e| e.to_string())?;
    let pane = rows
        .iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .find(|l| !l.starts_with(&format!("{control_id} ")))
        .and_then(|l| l.split(' ').nth(1).map(str::to_string))
        .ok_or("no session to record (serve was started with --no-session)")?;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    struct Rec {
        file: std::fs::File,
        t0: Instant,
        carry: Vec<u8>,
        ready: bool,
        held: Vec<(f64, Vec<u8>)>,
    }
    let rec = Arc::new(Mutex::new(Rec {
        file,
        t0: Instant::now(),
        carry: Vec::new(),
        ready: false,
        held: Vec::new(),
    }));
    let write = |r: &mut Rec, t: f64, data: &[u8]| {
        r.carry.extend_from_slice(data);
        // Keep an incomplete UTF-8 sequence for the next chunk.
        let cut = match std::str::from_utf8(&r.carry) {
            Ok(_) => r.carry.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => r.carry.len(),
        };
        let chunk: Vec<u8> = r.carry.drain(..cut).collect();
        if !chunk.is_empty() {
            let line = event(t, &String::from_utf8_lossy(&chunk));
            let _ = writeln!(r.file, "{line}");
        }
    };
    let r2 = rec.clone();
    let num: u32 = pane[1..].parse().map_err(|_| "bad pane id")?;
    hub.set_tap(
        num,
        Box::new(move |data: &[u8]| {
            let mut r = r2.lock().unwrap_or_else(|p| p.into_inner());
            let t = r.t0.elapsed().as_secs_f64();
            if r.ready {
                write(&mut r, t, data);
            } else {
                r.held.push((t, data.to_vec()));
            }
        }),
    );
    let (snap, w, h) = snapshot(hub, &pane).await?;
    let mut r = rec.lock().unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(r.file, "{}", header(w, h));
    let _ = writeln!(r.file, "{}", event(0.0, &snap));
    for (t, d) in std::mem::take(&mut r.held) {
        write(&mut r, t, &d);
    }
    r.ready = true;
    Ok(())
}
