//! A blocking waiter for XID events, on its own thread so that a long `nvmlEventSetWait` never
//! delays a poll, and what it has registered.
//!
//! One watcher, and one event set, per NVML session: a driver delivers an event only to the sets
//! registered when it occurs, so dropping a set and creating another would lose what happens in
//! between. The thread owns the set and takes registration requests (GPU indices) from the
//! poller through a channel it checks between waits (waits last `WAIT_MS`); it reports what it
//! registered in a shared [`Coverage`]. Each event is sent with the UUID of its GPU, so that
//! the poller credits it to that board whatever index the board has by then.

use std::collections::BTreeSet;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, EventSet, Nvml};

use super::code;
use crate::snapshot::NvmlCode;

/// The XID NVML reports when the driver cannot say which (`XidError::Unknown` in nvml-wrapper).
const UNKNOWN_XID: u64 = 999;

/// How long one wait blocks before the thread looks at its requests and whether to stop.
const WAIT_MS: u32 = 250;

/// Called by the watcher after each XID it reports.
pub type OnXid = Box<dyn Fn() + Send>;

/// What the watcher tells the poller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XidEvent {
    /// An XID on the GPU with `uuid` (`None` if the event's device could not be identified),
    /// which had `index` when it was registered (for logs only: indices change).
    Xid {
        uuid: Option<String>,
        index: Option<u32>,
        xid: u64,
        at: SystemTime,
    },
    /// An NVML call of the watcher failed.
    Error {
        function: &'static str,
        code: NvmlCode,
    },
}

/// What the watcher has done with the poller's registration requests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// UUIDs of GPUs with nothing more to do: registered on the set, or NOT_SUPPORTED.
    pub settled: BTreeSet<String>,
    /// Requests handled so far.
    pub handled: u64,
    /// The last request had a failure other than NOT_SUPPORTED (creating the set, reading a
    /// handle or UUID, registering); its GPUs are not settled and will be asked again.
    pub registration_failed: bool,
    /// The last wait failed with something other than TIMEOUT.
    pub wait_failed: bool,
}

/// The running watcher. Dropping it stops and joins the thread (within one wait).
pub struct XidWatcher {
    requests: Option<Sender<Vec<u32>>>,
    coverage: Arc<Mutex<Coverage>>,
    sent: u64,
    thread: Option<JoinHandle<()>>,
}

impl XidWatcher {
    /// `on_xid` runs on the watcher's thread right after each XID is sent to `sink`, so that
    /// whoever drains `sink` can be woken at once (the poller polls on an XID, not at its
    /// next tick).
    pub(super) fn start(nvml: Arc<Nvml>, sink: Sender<XidEvent>, on_xid: OnXid) -> XidWatcher {
        let (requests, rx) = mpsc::channel();
        let coverage = Arc::new(Mutex::new(Coverage::default()));
        let shared = coverage.clone();
        let thread = std::thread::Builder::new()
            .name("xid-watcher".into())
            .spawn(move || run(&nvml, &sink, &rx, &shared, &on_xid));
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the XID watcher thread");
                None
            }
        };
        XidWatcher {
            requests: Some(requests),
            coverage,
            sent: 0,
            thread,
        }
    }

    /// What the watcher has registered so far.
    pub fn coverage(&self) -> Coverage {
        self.coverage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// True while an earlier request has not been handled yet.
    pub fn busy(&self) -> bool {
        self.coverage().handled < self.sent
    }

    /// Asks the thread to register the GPUs at `indices` on its event set.
    pub fn register(&mut self, indices: Vec<u32>) {
        if let Some(tx) = &self.requests {
            if tx.send(indices).is_ok() {
                self.sent += 1;
            }
        }
    }

    /// False when the thread is not running or its last registration or wait failed with an
    /// error; "not supported" is not one (those GPUs simply have no XID stream).
    pub fn healthy(&self) -> bool {
        let c = self.coverage();
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
            && !c.registration_failed
            && !c.wait_failed
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        // Closing the channel is the stop signal, seen within one wait.
        self.requests = None;
        let Some(t) = self.thread.take() else {
            return;
        };
        let deadline = std::time::Instant::now() + Duration::from_millis(u64::from(WAIT_MS) * 4);
        while !t.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if t.is_finished() {
            let _ = t.join();
        } else {
            tracing::warn!("the XID watcher is stuck in an NVML call; leaving it behind");
        }
    }
}

/// A device registered on the set: its raw handle (to match events), index and UUID.
struct Registered {
    handle: usize,
    index: u32,
    uuid: String,
}

fn run(
    nvml: &Nvml,
    sink: &Sender<XidEvent>,
    requests: &Receiver<Vec<u32>>,
    coverage: &Mutex<Coverage>,
    on_xid: &OnXid,
) {
    let report = |function: &'static str, e: &NvmlError| {
        let _ = sink.send(XidEvent::Error {
            function,
            code: code(e),
        });
    };
    let update = |f: &mut dyn FnMut(&mut Coverage)| {
        f(&mut coverage.lock().unwrap_or_else(PoisonError::into_inner));
    };
    let mut set: Option<EventSet<'_>> = None;
    let mut registered: Vec<Registered> = Vec::new();
    loop {
        // Nothing to wait on yet: block on the next request instead.
        let request = if registered.is_empty() {
            match requests.recv() {
                Ok(r) => Some(r),
                Err(_) => return,
            }
        } else {
            match requests.try_recv() {
                Ok(r) => Some(r),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return,
            }
        };
        if let Some(indices) = request {
            let (settled, failed) = handle_request(nvml, &mut set, &mut registered, &indices);
            for (function, e) in failed.iter().flatten() {
                report(function, e);
            }
            update(&mut |c| {
                c.settled.extend(settled.iter().cloned());
                c.handled += 1;
                c.registration_failed = failed.is_some();
            });
        }
        let Some(set) = set.as_ref().filter(|_| !registered.is_empty()) else {
            continue;
        };
        match set.wait(WAIT_MS) {
            Ok(data) => {
                update(&mut |c| c.wait_failed = false);
                let xid = match data.event_data {
                    Some(XidError::Value(xid)) => xid,
                    // NVML's "unknown XID" (999): the driver saw an error it has no number
                    // for. Still an XID, counted like any other.
                    Some(XidError::Unknown) => UNKNOWN_XID,
                    // Not an XID: the only other type registered is the driver's recovery
                    // action changing (`nvmlEventTypeGpuRecoveryAction`, which nvml-wrapper
                    // 0.13 does not name). Poll now: the poll reads the action on the fast tier.
                    None => {
                        tracing::info!(
                            "nvml: the driver changed a GPU's recommended recovery action"
                        );
                        on_xid();
                        continue;
                    }
                };
                // SAFETY: reading the raw handle value only, for comparison.
                let handle = unsafe { data.device.handle() } as usize;
                let known = registered.iter().find(|r| r.handle == handle);
                // The board registered at this handle (NVML handles name boards, not indices);
                // asked only of a device registered by another path. Not asked first: an XID
                // such as 119 or 79 often comes just before calls on that GPU hang.
                let uuid = known
                    .map(|r| r.uuid.clone())
                    .or_else(|| data.device.uuid().ok());
                let event = XidEvent::Xid {
                    uuid,
                    index: known.map(|r| r.index),
                    xid,
                    at: SystemTime::now(),
                };
                if sink.send(event).is_err() {
                    return;
                }
                on_xid();
            }
            Err(NvmlError::Timeout) => update(&mut |c| c.wait_failed = false),
            Err(e) => {
                report("nvmlEventSetWait_v2", &e);
                update(&mut |c| c.wait_failed = true);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// Registers the GPUs at `indices` (creating the set first if needed). Returns the UUIDs now
/// settled and the failures (function, error) other than NOT_SUPPORTED, if any.
#[allow(clippy::type_complexity)]
fn handle_request<'n>(
    nvml: &'n Nvml,
    set: &mut Option<EventSet<'n>>,
    registered: &mut Vec<Registered>,
    indices: &[u32],
) -> (Vec<String>, Option<Vec<(&'static str, NvmlError)>>) {
    let mut settled = Vec::new();
    let mut failed = Vec::new();
    if set.is_none() {
        match nvml.create_event_set() {
            Ok(s) => *set = Some(s),
            Err(e) => return (settled, Some(vec![("nvmlEventSetCreate", e)])),
        }
    }
    let Some(set) = set.as_ref() else {
        return (settled, None);
    };
    for &index in indices {
        let device = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                failed.push(("nvmlDeviceGetHandleByIndex_v2", e));
                continue;
            }
        };
        let uuid = match device.uuid() {
            Ok(u) => u,
            Err(e) => {
                failed.push(("nvmlDeviceGetUUID", e));
                continue;
            }
        };
        // SAFETY: reading the raw handle value only, to compare it with event handles later.
        let handle = unsafe { device.handle() } as usize;
        if registered.iter().any(|r| r.handle == handle) {
            settled.push(uuid);
            continue;
        }
        match register_xids(&device, set) {
            Ok(()) => {
                registered.push(Registered {
                    handle,
                    index,
                    uuid: uuid.clone(),
                });
                settled.push(uuid);
            }
            Err(NvmlError::NotSupported) => settled.push(uuid),
            Err(e) => failed.push(("nvmlDeviceRegisterEvents", e)),
        }
    }
    (settled, (!failed.is_empty()).then_some(failed))
}

/// `nvmlEventTypeGpuRecoveryAction` (driver 565 and newer; not in nvml-wrapper 0.13's
/// `EventTypes`).
pub const GPU_RECOVERY_ACTION_EVENT: u64 = 0x8000;

/// The event types the agent registers on `device`: critical XIDs, and the driver's recovery
/// action where the driver offers it (`nvmlDeviceGetSupportedEventTypes`: the real H100 and
/// H200 of driver 580 answer 0xFF9F). Asked once per device and NVML session, on the watcher's
/// thread (1.6 µs on the real H100: `nvml-sim/costs/h100-driver-580.json`).
fn event_mask(device: &Device) -> u64 {
    let xids = EventTypes::CRITICAL_XID_ERROR.bits();
    let Ok(sym) = nvml_sym(
        device
            .nvml()
            .lib()
            .nvmlDeviceGetSupportedEventTypes
            .as_ref(),
    ) else {
        return xids;
    };
    let mut supported: u64 = 0;
    // SAFETY: the device handle is live (borrowed) and `supported` outlives the call, which
    // writes one `unsigned long long`.
    let ok = unsafe { nvml_try(sym(device.handle(), &mut supported)) }.is_ok();
    if ok && supported & GPU_RECOVERY_ACTION_EVENT != 0 {
        xids | GPU_RECOVERY_ACTION_EVENT
    } else {
        xids
    }
}

/// nvml-wrapper's `register_events` frees the whole set when one device refuses registration, so
/// one unsupported GPU would silence the rest; call the raw symbol instead.
fn register_xids(device: &Device, set: &EventSet) -> Result<(), NvmlError> {
    let mask = event_mask(device);
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceRegisterEvents.as_ref())?;
    // SAFETY: both handles are live for the duration of the call (`device` and `set` are
    // borrowed), and `nvmlDeviceRegisterEvents(nvmlDevice_t, unsigned long long, nvmlEventSet_t)`
    // takes them by value.
    unsafe { nvml_try(sym(device.handle(), mask, set.handle())) }
}
