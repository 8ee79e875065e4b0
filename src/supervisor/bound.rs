//! The copy-on-write layer's bound while its instance runs (`[workspace]
//! layer_bytes`, `layer_files`). The layer is on disk (it must outlive a
//! SIGKILL and a reboot), where no unprivileged process can set a size
//! limit, so a thread measures it — as often as once a second, less often
//! when measuring takes long (at most a twentieth of the time) — and the
//! first time it is over, calls the caller's action once: `run` and
//! `shell` end the sandbox, `serve` freezes it (`mcp`). The bound is
//! checked, not kernel-enforced: a burst between two measures (a copy-up of
//! a big file included) can pass it by what the agent writes in that time.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
            if b > bytes || f > files {
                let what = if b > bytes {
                    format!("{b} bytes, over [workspace] layer_bytes = {bytes}")
                } else {
                    format!("more than {files} entries ([workspace] layer_files)")
                };
                over(format!("the copy-on-write layer holds {what}"));
                return;
            }
        }
    });
    Watching(stop)
}
