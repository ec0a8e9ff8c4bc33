//! Long native work (staging, indexing, warming) on a thread of its own, waited for in short steps so that Ctrl-C reaches Python at once.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// How long one wait may hold off signal handling.
const POLL: Duration = Duration::from_millis(50);

/// Runs `work` on a new thread, the GIL released, checking for signals every 50 ms. On
/// Ctrl-C (or another handler raising) the exception is raised at once and `work` is told
/// through its flag, which it polls where it can; what it still returns is dropped.
pub fn run<T: Send + 'static>(
    py: Python<'_>,
    what: &str,
    work: impl FnOnce(&AtomicBool) -> T + Send + 'static,
) -> PyResult<T> {
    let (tx, mut rx) = mpsc::sync_channel(1);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name(format!("stagefs-{what}"))
        .spawn(move || {
            let _ = tx.send(catch_unwind(AssertUnwindSafe(|| work(&flag))));
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a thread for {what}: {e}")))?;
    loop {
        // By `&mut`: a Receiver may move to another thread, not be shared with one.
        let waiting = &mut rx;
        match py.detach(move || waiting.recv_timeout(POLL)) {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(panic)) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                return Err(PyRuntimeError::new_err(format!(
                    "stagefs: {what} failed: {why} (a bug: please report it)"
                )));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(format!("stagefs: the thread of {what} ended without a result")));
            }
        }
    }
}
