//! The copy-on-write layer's bound while its instance runs (`[workspace]
//! layer_bytes`, `layer_files`). The layer is on disk (it must outlive a
//! SIGKILL and a reboot), where no unprivileged process can set a size
//! limit, so a thread measures it — as often as once a second, less often
//! when measuring takes long (at most a twentieth of the time) — and the
//! first time it is over, calls the caller's action once: `run` and
//! `shell` end the sandbox, `serve` freezes it (`runtime::freeze`). The bound is
//! checked, not kernel-enforced: a burst between two measures (a copy-up of
//! a big file included) can pass it by what the agent writes in that time.
//! The last measure is kept ([`last`]): `serve`'s metrics export it, so a
//! scrape never walks the layer.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The last measure: bytes, entries (`u64::MAX`: not measured yet). One
/// layer a process (`serve`, `run` and `shell` each have one instance).
static LAST: [AtomicU64; 2] = [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)];

/// The layer's bytes and entries at the watcher's last measure (at most 30
/// s old while its instance runs); `None` before the first.
pub(crate) fn last() -> Option<(u64, u64)> {
    let (b, f) = (
        LAST[0].load(Ordering::Relaxed),
        LAST[1].load(Ordering::Relaxed),
    );
    (b != u64::MAX && f != u64::MAX).then_some((b, f))
}

/// Stops the thread when dropped.
pub(crate) struct Watching(Arc<AtomicBool>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Watches the layer at `layer` against `(bytes, files)`; `over` gets the
/// line that says what happened.
pub(crate) fn watch(
    layer: PathBuf,
    (bytes, files): (u64, u64),
    over: impl FnOnce(String) + Send + 'static,
) -> Watching {
    let stop = Arc::new(AtomicBool::new(false));
    let seen = stop.clone();
    let upper = super::layer::writes(&layer);
    // Called once; measuring goes on after it (the metrics' gauge).
    let mut over = Some(over);
    std::thread::spawn(move || {
        let mut every = Duration::from_secs(1);
        loop {
            std::thread::sleep(every);
            if seen.load(Ordering::SeqCst) {
                return;
            }
            let t = Instant::now();
            let (b, f, _) = super::kept::usage_upto(&upper, files + 1);
            every = (t.elapsed() * 20).clamp(Duration::from_secs(1), Duration::from_secs(30));
            LAST[0].store(b, Ordering::Relaxed);
            LAST[1].store(f, Ordering::Relaxed);
            if b > bytes || f > files {
                let Some(over) = over.take() else {
                    continue;
                };
                let what = if b > bytes {
                    format!("{b} bytes, over [workspace] layer_bytes = {bytes}")
                } else {
                    format!("more than {files} entries ([workspace] layer_files)")
                };
                over(format!("the copy-on-write layer holds {what}"));
            }
        }
    });
    Watching(stop)
}
