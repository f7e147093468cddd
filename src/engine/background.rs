//! Work that yields the CPU to requests: a release's `O(n)`
//! pass and its statistics run on a thread of their own at the operating
//! system's lowest priority (`SCHED_IDLE` on Linux), so a step that wakes up
//! takes a core from it at once instead of waiting for the scheduler's
//! time slice; the pass holds the ledger's read lock only a chunk at a time,
//! so a preempted pass delays a step by at most one chunk.
//!
//! Under full CPU load a release then waits for idle CPU: requests come
//! first, dashboards after.

use super::error::{EngineError, EngineResult};

/// Run `work` on a new thread at idle priority and await its result.
pub(super) async fn background<T: Send + 'static>(
    work: impl FnOnce() -> EngineResult<T> + Send + 'static,
) -> EngineResult<T> {
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("dpledger-release".into())
        .spawn(move || {
            lower_priority();
            let _ = done.send(work());
        })
        .map_err(|e| EngineError::Internal(format!("cannot start a release thread: {e}")))?;
    result
        .await
        .map_err(|_| EngineError::Internal("the release thread stopped".to_string()))?
}

/// Put the calling thread at idle priority (Linux); elsewhere leave it.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; the parameter outlives the call.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if rc != 0 {
            tracing::debug!("cannot lower the release thread's priority");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The work runs on its own thread, at idle priority on Linux, and its
    /// result or error comes back.
    #[tokio::test]
    async fn work_runs_at_idle_priority_and_answers() {
        let caller = std::thread::current().id();
        let (thread, idle) = background(|| {
            #[cfg(target_os = "linux")]
            // SAFETY: pid 0 is the calling thread.
            let idle = unsafe { libc::sched_getscheduler(0) } == libc::SCHED_IDLE;
            #[cfg(not(target_os = "linux"))]
            let idle = true;
            Ok((std::thread::current().id(), idle))
        })
        .await
        .unwrap();
        assert_ne!(thread, caller);
        assert!(idle, "the work did not run at SCHED_IDLE");
        let refused: EngineResult<()> =
            background(|| Err(EngineError::conflict("refused".to_string()))).await;
        assert!(refused.unwrap_err().to_string().contains("refused"));
    }
}
