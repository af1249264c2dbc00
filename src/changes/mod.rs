//! The one owner of changes to the node. Everything the agent changes (a MIG layout, the
//! sharing settings, a signal to a process, a hook or a built-in remediation action, a Slurm
//! drain) is a typed request ([`Change`]) handed to [`Owner::handle`], in the daemon and in the
//! CLI alike. The owner holds what acting needs and nothing else has:
//!
//! - **the audit log writer**: opened once, by the owner only (reopened when `[audit] file`
//!   changes); every record of the process goes through [`Owner::record`], and a record that
//!   cannot be written is a typed [`AuditFailed`], never a string matched back;
//! - **the NVML write session**: one session, opened at the first change that needs it and kept
//!   (no `nvmlInit` per apply; the library is never unloaded between changes), shared by the
//!   changes that write through NVML (NVML is thread-safe; what conflicts is serialised by the
//!   change's own lock, so a remediation fence never waits for a MIG apply's hook);
//! - **the node lock** (`mig-apply.lock` and its intent record, [`crate::mig::intent`]): taken by
//!   a MIG apply in whichever process runs it, so the CLI and the daemon never apply at once;
//!   inside one process, MIG applies wait their turn first (the start's, a reload's, the API's);
//! - **the poller's wake**: a change that touched the node tells the poller, whose next poll
//!   starts at once and reads what changed (a [`Waker`] the daemon gives the owner once its
//!   poller runs; the owner knows no poller).
//!
//! Each change writes its record before it acts (a change whose record cannot be written does
//! not happen), acts, records its outcome, and reports whether it touched the node; the owner
//! then wakes the poller. Outcomes stay typed (a MIG apply's `Result<Outcome, MigFailed>`,
//! `sharing::apply::Report`, `Result<slurm::drain::Done, Failed>`, [`AuditFailed`]) until the
//! HTTP handler, the CLI or a metric label renders them, once.
//!
//! Why not one thread with one mailbox: changes of different kinds do not conflict, and a
//! mailbox would queue a Slurm drain (how fast a failed GPU leaves the scheduler) behind a
//! 30 s hook timeout or a MIG creation stuck in the driver. The owner serialises what does
//! conflict (MIG applies: its MIG turn in the process, the node lock across processes; sharing
//! applies: the sharing service's) and runs each change, from async code ([`Owner::call`]), on
//! a small bounded pool of its kind's own ([`pool::Lane`]): a drain never waits behind MIG, and
//! no storm of changes takes the runtime's blocking threads. A reload's MIG apply is merged
//! with the reloads that follow it ([`reload`]): at most one runs and one waits.
//!
//! Must not: be bypassed (no other module opens the audit log for writing: `layers_tests`
//! checks the source), or act before its record is on disk.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub use crate::audit::{AuditFailed, AUDIT_FAILED};
use crate::audit::{AuditLog, Event};
use crate::config::mig::MigConfig;
use crate::gpu::Session;

pub mod mig;
pub mod notice;
pub mod pool;
pub mod reload;
pub mod step;

pub use pool::Lane;

pub use mig::{MigApply, MigFailed, MigOutcome, MigReport, OnWait};
pub use step::{Begun, Done};

/// A typed request to change the node: the change's own steps, run by [`Owner::handle`] with
/// the owner's means ([`Acting`]). `act` writes its record before each step it takes.
pub trait Change {
    /// The lane (the bounded pool) the change runs in from [`Owner::call`].
    const LANE: Lane;
    /// What the change reports, rendered only at the edge (HTTP, CLI, metrics, logs).
    type Outcome;
    /// Carries the change out; the record of each step precedes the step.
    fn act(self, node: &Acting<'_>) -> Self::Outcome;
    /// Whether the outcome says the node was touched (the poller is woken).
    fn touched(outcome: &Self::Outcome) -> bool;
}

/// What a change may use while it runs: the owner's audit writer and NVML session.
pub struct Acting<'a> {
    owner: &'a Owner,
}

impl Acting<'_> {
    /// Writes one audit record (synced before it returns).
    pub fn record(&self, event: impl Into<Event>) -> Result<(), AuditFailed> {
        self.owner.record(event)
    }

    /// The audit log, for the building blocks that take one (MIG and sharing applies).
    pub fn audit_log(&self) -> Result<AuditLog, AuditFailed> {
        self.owner.audit_log()
    }

    /// The NVML write session (shared: NVML is thread-safe).
    pub fn nvml(&self) -> Result<NvmlGuard, String> {
        self.owner.nvml()
    }

    /// The node lock (`mig-apply.lock` in the state directory, its name kept from when only MIG
    /// took it): one apply of the GPUs' settings (MIG layout or sharing) at a time on the node,
    /// across processes. Waits up to `wait` for another holder (`on_wait` is told once, with
    /// its pid when known); the error says who holds it.
    pub fn node_lock(
        &self,
        wait: std::time::Duration,
        on_wait: impl FnOnce(Option<u32>),
    ) -> Result<crate::mig::intent::NodeLock, String> {
        let dir = crate::audit::dir_of(&lock(&self.owner.setup).audit_file);
        crate::mig::intent::lock(&dir, wait, on_wait)
    }

    /// The process's MIG turn, held for a whole MIG apply: applies in one process wait for each
    /// other (the node lock then keeps other processes out).
    pub fn mig_turn(&self) -> MutexGuard<'_, ()> {
        lock(&self.owner.mig_turn)
    }

    /// The settings the owner was given (library, audit file, MIG layouts).
    pub fn setup(&self) -> Setup {
        lock(&self.owner.setup).clone()
    }
}

/// The owner's settings: the daemon (at start and on reload) and the CLI build them from their
/// configuration (`[nvml] library`, `[audit] file`, `[mig]`); the owner never reads a `Config`.
#[derive(Debug, Clone)]
pub struct Setup {
    pub nvml_lib: String,
    pub audit_file: PathBuf,
    pub mig: MigConfig,
}

/// Tells the poller that the node changed: its next poll starts at once and reads it all.
/// Returns `false` once nobody listens any more (the poller has stopped).
pub type Waker = Arc<dyn Fn() -> bool + Send + Sync>;

/// The NVML write session, lent to a change.
pub struct NvmlGuard {
    session: Arc<Session>,
}

impl NvmlGuard {
    pub fn session(&self) -> &Session {
        &self.session
    }
}

/// The owner of changes; one per process, shared by whoever asks for a change.
pub struct Owner {
    setup: Mutex<Setup>,
    /// The one audit writer of the process, opened at the first record.
    audit: Mutex<Option<AuditLog>>,
    /// The NVML write session (library, session), opened at the first change that needs it.
    nvml: Mutex<Option<(String, Arc<Session>)>>,
    /// Whose turn it is to apply a MIG layout in this process.
    mig_turn: Mutex<()>,
    /// Whether a change is running (the stop waits for MIG applies, within its budget).
    running: Mutex<u32>,
    /// The poller's wake, once it runs.
    waker: Mutex<Option<Waker>>,
    /// The threads changes run on, one bounded pool per kind.
    lanes: pool::Lanes,
    /// The reload MIG applies: one running, one pending at most.
    reload: Mutex<reload::Slot>,
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner")
            .field("setup", &*lock(&self.setup))
            .finish_non_exhaustive()
    }
}

impl Owner {
    pub fn with(setup: Setup) -> Arc<Owner> {
        Arc::new(Owner {
            setup: Mutex::new(setup),
            audit: Mutex::new(None),
            nvml: Mutex::new(None),
            mig_turn: Mutex::new(()),
            running: Mutex::new(0),
            waker: Mutex::new(None),
            lanes: pool::Lanes::default(),
            reload: Mutex::new(reload::Slot::default()),
        })
    }

    /// Takes new settings (a reload's): the next change uses them (the audit log is reopened
    /// when its path changed; the NVML session when the library did).
    pub fn set(&self, new: Setup) {
        // The audit slot before the settings, as `audit_log` takes them: one order, no deadlock.
        let mut slot = lock(&self.audit);
        let mut setup = lock(&self.setup);
        if setup.audit_file == new.audit_file {
            *setup = new;
            return;
        }
        *slot = None;
        let moved = notice::path(&setup.audit_file) != notice::path(&new.audit_file);
        *setup = new;
        // Other processes leave their notice beside the new log: watched from now on.
        if let (true, Some(w)) = (moved, lock(&self.waker).as_ref()) {
            notice::watch(&setup.audit_file, w.clone());
        }
    }

    /// Where to say that the node changed: the poller's wake (set once it runs). Changes
    /// other processes make are watched for from now on too ([`notice`]).
    pub fn set_waker(&self, wake: Waker) {
        notice::watch(&lock(&self.setup).audit_file, wake.clone());
        *lock(&self.waker) = Some(wake);
    }

    pub fn setup(&self) -> Setup {
        lock(&self.setup).clone()
    }

    /// Carries out one change (blocking: from async code use [`Owner::call`]), then wakes the
    /// poller when the node was touched.
    pub fn handle<C: Change>(&self, change: C) -> C::Outcome {
        let outcome = self.running(|| change.act(&Acting { owner: self }));
        if C::touched(&outcome) {
            self.wake();
        }
        outcome
    }

    /// Counts `f` as a change running (for [`Owner::busy`]), also when it panics. Only the
    /// requests of [`Owner::handle`] count: the stop waits for them (a MIG apply rolls back),
    /// not for a hook or a grace period, which end on their own deadlines.
    fn running<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Running<'a>(&'a Mutex<u32>);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                *lock(self.0) -= 1;
            }
        }
        *lock(&self.running) += 1;
        let _running = Running(&self.running);
        f()
    }

    /// Tells the poller that the node changed: its next poll starts now and reads it all. In
    /// a process without a poller (the CLI), the daemon's is told through the notice file.
    fn wake(&self) {
        match lock(&self.waker).as_ref() {
            Some(w) => {
                w();
            }
            None => notice::write(&lock(&self.setup).audit_file),
        }
    }

    /// [`Owner::handle`] on a thread of the change's lane ([`Change::LANE`]); `None` only when
    /// the change panicked.
    pub async fn call<C>(self: &Arc<Self>, change: C) -> Option<C::Outcome>
    where
        C: Change + Send + 'static,
        C::Outcome: Send + 'static,
    {
        let me = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.lanes.of(C::LANE).submit(Box::new(move || {
            let _ = tx.send(me.handle(change));
        }));
        rx.await.ok()
    }

    /// How many threads the lane `lane` runs now.
    pub fn lane_threads(&self, lane: Lane) -> usize {
        self.lanes.of(lane).threads()
    }

    /// Whether a change is running now.
    pub fn busy(&self) -> bool {
        *lock(&self.running) > 0
    }

    /// Writes one record that is not itself a change (a decision, an API request's receipt),
    /// through the process's one audit writer; synced before it returns.
    pub fn record(&self, event: impl Into<Event>) -> Result<(), AuditFailed> {
        let log = self.audit_log()?;
        log.record(&event.into())
            .map_err(|e| AuditFailed(e.to_string()))
    }

    /// Whether the audit log can be opened (a start-time check for the components that refuse
    /// to start without it); the error names the file.
    pub fn audit_ready(&self) -> Result<PathBuf, AuditFailed> {
        self.audit_log().map(|l| l.path().to_path_buf())
    }

    fn audit_log(&self) -> Result<AuditLog, AuditFailed> {
        let mut slot = lock(&self.audit);
        if let Some(log) = slot.as_ref() {
            return Ok(log.clone());
        }
        let path = lock(&self.setup).audit_file.clone();
        let log = AuditLog::open(&path).map_err(|e| {
            AuditFailed(format!(
                "cannot open the audit log '{}': {e}",
                path.display()
            ))
        })?;
        *slot = Some(log.clone());
        Ok(log)
    }

    fn nvml(&self) -> Result<NvmlGuard, String> {
        let lib = lock(&self.setup).nvml_lib.clone();
        let mut cached = lock(&self.nvml);
        let session = match cached.as_ref() {
            Some((l, s)) if *l == lib => s.clone(),
            _ => {
                *cached = None;
                let s = Arc::new(Session::open(&lib).map_err(|e| e.reason)?);
                *cached = Some((lib, s.clone()));
                s
            }
        };
        Ok(NvmlGuard { session })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
