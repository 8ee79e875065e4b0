//! Recording (`sandmux serve --record FILE.cast`): the first session's first
//! pane, as an asciicast v2 file that `asciinema play` replays. It starts with
//! a snapshot of the screen (so a recording begun after the pane drew its
//! prompt still replays to the same screen), then every `%output` chunk with
//! its time. Typed input is never recorded: only what the pane writes.
//!
//! Everything written passes the replay filter ([`super::replay_filter`]), so
//! a replay cannot act on the viewer's terminal. The file never grows past
//! the profile's `[recording] max_bytes`: when the next event would not fit,
//! a visible notice and a marker event (`[t, "m", …]`) end it, both counted
//! in the cap, and nothing more is written.

use super::replay_filter::Filter;
use crate::tmux::client::TmuxError;
use crate::tmux::hub::{Cmd, Hub};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Pane output per event, at most (before filtering and JSON escaping), so
/// every line stays far below `export_replay`'s window.
const EVENT_INPUT: usize = 4096;
/// Output held while the first snapshot is taken; past it, dropped (the
/// snapshot shows its effect).
const HELD_MAX: usize = 1 << 20;
/// Times are written with this as their ceiling (31 years), so the closing
/// events have a known greatest length.
const MAX_T: f64 = 1e9;
/// The marker label that ends a cut recording.
pub(crate) const CUT_MARKER: &str = "sandmux: recording cut at max_bytes";

/// Builds the asciicast header line.
pub(crate) fn header(width: u32, height: u32) -> String {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({"version": 2, "width": width, "height": height, "timestamp": ts, "env": {"TERM": "screen"}, "title": "sandmux"}).to_string()
}

/// One event line, newline included: `[t, kind, data]`.
/// The number of a pane id (`%3` → 3), as the hub's taps are keyed (the
/// same parse as `mcp::targets::pane_num`, which this layer may not name).
fn pane_num(id: &str) -> Option<u32> {
    id.strip_prefix('%')?.parse().ok()
}

fn event_line(t: f64, kind: &str, data: &str) -> String {
    let data = serde_json::Value::String(data.to_string());
    format!("[{:.6}, \"{kind}\", {data}]\n", t.clamp(0.0, MAX_T))
}

/// The lines that end a cut recording: a notice the viewer sees, then the marker.
fn closing(t: f64, max: u64) -> String {
    let notice = format!(
        "{}\r\n[sandmux: recording cut: it reached [recording] max_bytes = {max}]\r\n",
        super::replay_filter::RESTORE
    );
    event_line(t, "o", &notice) + &event_line(t, "m", CUT_MARKER)
}

/// Why a pane could not be recorded or snapshot.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordError {
    /// A tmux command failed.
    #[error(transparent)]
    Tmux(#[from] TmuxError),
    /// tmux's answer named no size and cursor.
    #[error("cannot read the pane size")]
    PaneSize,
    /// The pane's id is not `%N`.
    #[error("bad pane id")]
    BadPane,
    /// Every session is the control session's.
    #[error("no session to record (serve was started with --no-session)")]
    NoSession,
}

/// Why the recording's file could not be made or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordFileError {
    /// The file could not be opened.
    #[error("{}: {source}", path.display())]
    Open {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// Reading it failed.
    #[error("{0}")]
    Read(std::io::Error),
    /// The offset asked for is past the end.
    #[error("offset {offset} is past the end ({size} bytes)")]
    PastEnd { offset: u64, size: u64 },
    /// The offset asked for is inside a line.
    #[error("offset {0} is not the start of a line")]
    NotALineStart(u64),
    /// One line is longer than the window.
    #[error("the line at {offset} is longer than {max} bytes")]
    LongLine { offset: u64, max: usize },
    /// The lines are not UTF-8.
    #[error("not UTF-8: {0}")]
    NotUtf8(std::string::FromUtf8Error),
}

/// A pane's screen as terminal output: clear, the lines with their colours,
/// the cursor. Unfiltered; returns the text, width and height.
async fn screen(hub: &Hub, pane: &str) -> Result<(Vec<u8>, u32, u32), RecordError> {
    let info = hub
        .run(
            &Cmd::new("display-message")
                .flag("-p")
                .opt("-t", pane)
                .arg("#{pane_width} #{pane_height} #{cursor_x} #{cursor_y}"),
        )
        .await?;
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
        return Err(RecordError::PaneSize);
    };
    let lines = hub
        .run_checked(
            &Cmd::new("capture-pane")
                .flag("-p")
                .flag("-e")
                .opt("-t", pane),
        )
        .await?;
    let mut out = b"\x1b[H\x1b[2J".to_vec();
    for (i, l) in lines.iter().take(h as usize).enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(l);
    }
    out.extend_from_slice(format!("\x1b[0m\x1b[{};{}H", y + 1, x + 1).as_bytes());
    Ok((out, w, h))
}

/// A pane's screen now as a whole asciicast (header and filtered events).
pub(crate) async fn snapshot_cast(hub: &Hub, pane: &str) -> Result<String, RecordError> {
    let (text, w, h) = screen(hub, pane).await?;
    let mut cast = header(w, h) + "\n";
    let (mut filter, mut out) = (Filter::new(), String::new());
    for piece in text.chunks(EVENT_INPUT) {
        out.clear();
        filter.feed(piece, &mut out);
        cast += &event_line(0.0, "o", &out);
    }
    cast += &event_line(0.0, "o", super::replay_filter::RESTORE);
    Ok(cast)
}

/// What `sandbox_status` says about the recording.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct View {
    /// The file.
    pub path: String,
    /// Bytes written.
    pub bytes: u64,
    /// The profile's [recording] max_bytes.
    pub max_bytes: u64,
    /// Whether it stopped at max_bytes (a notice and a marker end it).
    pub cut: bool,
    /// Why writing failed, if it did.
    pub error: Option<String>,
}

/// A running (or finished) recording.
pub(crate) struct Recording {
    path: PathBuf,
    max: u64,
    inner: Mutex<Inner>,
}

struct Inner {
    file: std::fs::File,
    t0: Instant,
    filter: Filter,
    written: u64,
    cut: bool,
    error: Option<String>,
    ready: bool,
    held: Vec<(f64, Vec<u8>)>,
    held_bytes: usize,
}

impl Recording {
    /// Creates (or empties) the file, mode 0600, never through a symlink.
    pub(crate) fn open(path: &Path, max_bytes: u64) -> Result<Arc<Recording>, RecordFileError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|source| RecordFileError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Arc::new(Recording {
            path: path.to_path_buf(),
            max: max_bytes,
            inner: Mutex::new(Inner {
                file,
                t0: Instant::now(),
                filter: Filter::new(),
                written: 0,
                cut: false,
                error: None,
                ready: false,
                held: Vec::new(),
                held_bytes: 0,
            }),
        }))
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the status reports.
    pub(crate) fn view(&self) -> View {
        let r = self.lock();
        View {
            path: self.path.display().to_string(),
            bytes: r.written,
            max_bytes: self.max,
            cut: r.cut,
            error: r.error.clone(),
        }
    }

    /// Starts recording the first pane of the first session other than
    /// `control_id`.
    pub(crate) async fn start(
        self: &Arc<Self>,
        hub: &Arc<Hub>,
        control_id: &str,
    ) -> Result<(), RecordError> {
        let pane = first_pane(hub, control_id).await?;
        let num = pane_num(&pane).ok_or(RecordError::BadPane)?;
        let me = self.clone();
        hub.set_tap(num, Box::new(move |data: &[u8]| me.tapped(data)));
        let (text, w, h) = screen(hub, &pane).await?;
        let mut r = self.lock();
        r.line(&(header(w, h) + "\n"), 0.0, self.max);
        r.output(0.0, &text, &mut Filter::new(), self.max);
        let mut filter = std::mem::take(&mut r.filter);
        for (t, d) in std::mem::take(&mut r.held) {
            r.output(t, &d, &mut filter, self.max);
        }
        r.filter = filter;
        r.ready = true;
        Ok(())
    }

    fn tapped(&self, data: &[u8]) {
        let mut r = self.lock();
        let t = r.t0.elapsed().as_secs_f64();
        if r.ready {
            let mut filter = std::mem::take(&mut r.filter);
            r.output(t, data, &mut filter, self.max);
            r.filter = filter;
        } else if r.held_bytes + data.len() <= HELD_MAX {
            r.held_bytes += data.len();
            r.held.push((t, data.to_vec()));
        }
    }
}

impl Inner {
    fn stopped(&self) -> bool {
        self.cut || self.error.is_some()
    }

    /// Filters `data` into events of at most [`EVENT_INPUT`] input bytes each.
    fn output(&mut self, t: f64, data: &[u8], filter: &mut Filter, max: u64) {
        let mut text = String::new();
        for piece in data.chunks(EVENT_INPUT) {
            if self.stopped() {
                return;
            }
            text.clear();
            filter.feed(piece, &mut text);
            if !text.is_empty() {
                self.line(&event_line(t, "o", &text), t, max);
            }
        }
    }

    /// Writes one line if it fits with the closing lines after it; else
    /// writes the closing lines and stops.
    fn line(&mut self, line: &str, t: f64, max: u64) {
        if self.stopped() {
            return;
        }
        let reserve = closing(MAX_T, max).len() as u64;
        if self.written + line.len() as u64 + reserve <= max {
            self.write(line);
        } else {
            self.cut = true;
            self.write(&closing(t, max));
        }
    }

    fn write(&mut self, s: &str) {
        match self.file.write_all(s.as_bytes()) {
            Ok(()) => self.written += s.len() as u64,
            Err(e) => self.error = Some(format!("writing the recording: {e}")),
        }
    }
}

/// The first pane of the first session other than `control_id`.
async fn first_pane(hub: &Hub, control_id: &str) -> Result<String, RecordError> {
    let rows = hub
        .run(
            &Cmd::new("list-panes")
                .flag("-a")
                .opt("-F", "#{session_id} #{pane_id}"),
        )
        .await?;
    rows.iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .find(|l| !l.starts_with(&format!("{control_id} ")))
        .and_then(|l| l.split(' ').nth(1).map(str::to_string))
        .ok_or(RecordError::NoSession)
}

/// Part of a recording: whole lines from `offset`, at most `max` bytes.
#[derive(Debug)]
pub(crate) struct Window {
    /// The lines.
    pub text: String,
    /// The file's size when read.
    pub size: u64,
    /// Where the next window starts, if more of the file follows.
    pub next: Option<u64>,
}

/// Reads whole lines of the file from `offset` (0 or the start of a line),
/// at most `max` bytes: never more of the file than that.
pub(crate) fn read_window(path: &Path, offset: u64, max: usize) -> Result<Window, RecordFileError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).map_err(|source| RecordFileError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let size = f.metadata().map_err(RecordFileError::Read)?.len();
    if offset > size {
        return Err(RecordFileError::PastEnd { offset, size });
    }
    let start = offset.saturating_sub(1);
    f.seek(SeekFrom::Start(start))
        .map_err(RecordFileError::Read)?;
    let mut buf = Vec::with_capacity(max.min(1 << 20) + 1);
    f.take(max as u64 + (offset - start))
        .read_to_end(&mut buf)
        .map_err(RecordFileError::Read)?;
    if offset > 0 {
        if buf.first() != Some(&b'\n') {
            return Err(RecordFileError::NotALineStart(offset));
        }
        buf.remove(0);
    }
    let end = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if end == 0 && !buf.is_empty() && offset + (buf.len() as u64) < size {
        return Err(RecordFileError::LongLine { offset, max });
    }
    buf.truncate(end);
    let after = offset + end as u64;
    let text = String::from_utf8(buf).map_err(RecordFileError::NotUtf8)?;
    Ok(Window {
        text,
        size,
        next: (after < size).then_some(after),
    })
}

/// Whole lines of `text`, at most `max` bytes; and whether any were left out.
pub(crate) fn cut_lines(mut text: String, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let end = text.as_bytes()[..max]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    text.truncate(end);
    (text, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_cap_holds_a_header_and_the_closing_lines() {
        let head = header(10000, 10000).len() + 1;
        let big = closing(MAX_T, u64::MAX).len();
        assert!(head + big < crate::profile::MIN_RECORDING_BYTES as usize);
        assert!(closing(123.4, 1 << 20).len() <= closing(MAX_T, 1 << 20).len());
        assert!(closing(1e12, 1 << 20).len() <= closing(MAX_T, 1 << 20).len());
    }

    fn recording(max: u64) -> (tempfile::TempDir, Arc<Recording>) {
        let d = tempfile::tempdir().unwrap();
        let r = Recording::open(&d.path().join("x.cast"), max).unwrap();
        (d, r)
    }

    #[test]
    fn a_flood_stops_at_the_cap_with_a_marker() {
        let (_d, rec) = recording(10_000);
        rec.lock().line(&(header(80, 24) + "\n"), 0.0, 10_000);
        rec.lock().ready = true;
        for _ in 0..100 {
            rec.tapped(&b"y\r\n\x1b]52;c;eA==\x07".repeat(100));
        }
        let text = std::fs::read_to_string(rec.path()).unwrap();
        assert!(text.len() <= 10_000 && text.len() > 9_000, "{}", text.len());
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last[1], "m");
        assert_eq!(last[2], CUT_MARKER);
        assert!(!text.contains("\\u001b]"));
        let v = rec.view();
        assert!(v.cut && v.bytes == text.len() as u64, "{v:?}");
    }

    #[test]
    fn windows_are_bounded_whole_lines_and_page_through() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("w.cast");
        let lines: Vec<String> = (0..1000)
            .map(|i| format!("[{i}, \"o\", \"é{i}\"]\n"))
            .collect();
        std::fs::write(&p, lines.concat()).unwrap();
        let (mut at, mut got) = (0, String::new());
        loop {
            let w = read_window(&p, at, 1000).unwrap();
            assert!(w.text.len() <= 1000 && w.text.ends_with('\n'));
            got += &w.text;
            match w.next {
                Some(n) => at = n,
                None => break,
            }
        }
        assert_eq!(got, lines.concat());
        assert!(matches!(
            read_window(&p, 3, 1000),
            Err(RecordFileError::NotALineStart(3))
        ));
        assert!(matches!(
            read_window(&p, 1 << 40, 1000),
            Err(RecordFileError::PastEnd { .. })
        ));
        let e = read_window(&p, 0, 5).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
    }
}
