//! A reload's MIG apply: at most one runs and at most one waits. A reload while one runs
//! leaves one apply pending (a newer reload replaces it, not adds to it); the pending apply
//! reads the layout in force when it starts, so a storm of reloads ends in one apply of the
//! last layout, and an apply that hangs in the driver holds one thread, not one per reload.
//!
//! Must not: queue one apply per reload, or read the layout when the reload is asked for
//! rather than when its apply starts.

use std::future::Future;
use std::sync::Arc;

use super::{lock, Owner};

/// The reload applies of the process: whether one runs, whether one waits.
#[derive(Debug, Default)]
pub(super) struct Slot {
    running: bool,
    pending: bool,
    /// Reloads folded into the pending apply since the last one started (for the log).
    merged: u64,
}

/// What [`Owner::after_reload`] did with the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// No reload apply was running: this one starts now.
    Started,
    /// One runs: this one waits for it (replacing any that waited).
    Pending,
}

impl Owner {
    /// Runs `apply` (a reload's convergence to the layout in force) on the runtime: now when
    /// none runs, else once the running one is done, in place of any that waited.
    pub fn after_reload<F, Fut>(self: &Arc<Self>, apply: F) -> Asked
    where
        F: Fn(Arc<Owner>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        {
            let mut s = lock(&self.reload);
            if s.running {
                if s.pending {
                    s.merged += 1;
                }
                s.pending = true;
                return Asked::Pending;
            }
            s.running = true;
        }
        let me = self.clone();
        tokio::spawn(async move {
            // Whatever ends this task (a panic too) frees the slot.
            struct Free(Arc<Owner>);
            impl Drop for Free {
                fn drop(&mut self) {
                    let mut s = lock(&self.0.reload);
                    s.running = false;
                    s.pending = false;
                }
            }
            let _free = Free(me.clone());
            loop {
                apply(me.clone()).await;
                let merged = {
                    let mut s = lock(&me.reload);
                    if !s.pending {
                        break;
                    }
                    s.pending = false;
                    std::mem::take(&mut s.merged)
                };
                if merged > 0 {
                    tracing::info!(
                        merged,
                        "reloads came during a MIG apply: one apply of the layout now in force"
                    );
                }
            }
        });
        Asked::Started
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::Setup;
    use crate::config::mig::MigConfig;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_storm_of_reloads_runs_one_apply_and_one_more_with_the_last_layout() {
        let owner = Owner::with(Setup {
            nvml_lib: String::new(),
            audit_file: "/nonexistent/audit.jsonl".into(),
            mig: MigConfig::default(),
        });
        let runs = Arc::new(AtomicUsize::new(0));
        let (gate_tx, gate_rx) = tokio::sync::watch::channel(false);
        let mut asked = Vec::new();
        for _ in 0..100 {
            let (runs, gate) = (runs.clone(), gate_rx.clone());
            asked.push(owner.after_reload(move |_| {
                let (runs, mut gate) = (runs.clone(), gate.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // The first apply hangs until released, as one stuck in the driver.
                    let _ = gate.wait_for(|open| *open).await;
                }
            }));
        }
        assert_eq!(asked[0], Asked::Started);
        assert!(asked[1..].iter().all(|a| *a == Asked::Pending));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "one apply while it hangs");
        gate_tx.send(true).expect("open");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "then exactly one more");
        // The slot is free again: the next reload starts at once.
        let runs2 = runs.clone();
        let a = owner.after_reload(move |_| {
            let runs = runs2.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
            }
        });
        assert_eq!(a, Asked::Started);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }
}
