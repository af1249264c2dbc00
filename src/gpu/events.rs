//! A blocking waiter for XID events, on its own thread so that a long `nvmlEventSetWait` never
//! delays a poll. It registers every reachable GPU for `nvmlEventTypeXidCriticalError` and sends
//! what arrives to the poller, which counts it into the next snapshot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, EventSet, Nvml};

use super::error_code;

/// How long one wait blocks before the thread checks whether it should stop.
const WAIT_MS: u32 = 250;

/// What the watcher tells the poller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XidEvent {
    /// An XID on the GPU at `index` (`None` if the event's device could not be matched).
    Xid {
        index: Option<u32>,
        xid: u64,
        at: SystemTime,
    },
    /// An NVML call of the watcher failed.
    Error {
        function: &'static str,
        code: String,
    },
}

/// The running watcher. Dropping it stops and joins the thread.
pub struct XidWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// GPU indices the watcher tried to register (it had their handle); the poller restarts the
    /// watcher when a reachable GPU is missing here (a GPU that was added or recovered).
    pub covered: Vec<u32>,
    /// How many of them accepted the registration (NOT_SUPPORTED ones did not).
    pub registered: usize,
}

impl XidWatcher {
    pub(super) fn start(nvml: Arc<Nvml>, sink: Sender<XidEvent>) -> XidWatcher {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("xid-watcher".into())
            .spawn(move || run(&nvml, &sink, &thread_stop, ready_tx));
        let (thread, (covered, registered)) = match thread {
            Ok(t) => (Some(t), ready_rx.recv().unwrap_or_default()),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the XID watcher thread");
                (None, (Vec::new(), 0))
            }
        };
        XidWatcher {
            stop,
            thread,
            covered,
            registered,
        }
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(nvml: &Nvml, sink: &Sender<XidEvent>, stop: &AtomicBool, ready: Sender<(Vec<u32>, usize)>) {
    let report = |function: &'static str, e: &NvmlError| {
        let _ = sink.send(XidEvent::Error {
            function,
            code: error_code(e),
        });
    };
    let set = match nvml.create_event_set() {
        Ok(set) => set,
        Err(e) => {
            report("nvmlEventSetCreate", &e);
            let _ = ready.send((Vec::new(), 0));
            return;
        }
    };
    let count = nvml.device_count().unwrap_or(0);
    let mut handles: Vec<(usize, u32)> = Vec::new();
    let mut covered = Vec::new();
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue; // lost or unreadable: the poller reports it
        };
        covered.push(index);
        match register_xids(&device, &set) {
            // SAFETY: reading the raw handle value only, to compare it with event handles later.
            Ok(()) => handles.push((unsafe { device.handle() } as usize, index)),
            Err(NvmlError::NotSupported) => {}
            Err(e) => report("nvmlDeviceRegisterEvents", &e),
        }
    }
    let _ = ready.send((covered, handles.len()));
    if handles.is_empty() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        match set.wait(WAIT_MS) {
            Ok(data) => {
                let Some(XidError::Value(xid)) = data.event_data else {
                    continue;
                };
                // SAFETY: reading the raw handle value only, for comparison.
                let handle = unsafe { data.device.handle() } as usize;
                let index = handles.iter().find(|h| h.0 == handle).map(|h| h.1);
                let event = XidEvent::Xid {
                    index,
                    xid,
                    at: SystemTime::now(),
                };
                if sink.send(event).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                report("nvmlEventSetWait_v2", &e);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// nvml-wrapper's `register_events` frees the whole set when one device refuses registration, so
/// one unsupported GPU would silence the rest; call the raw symbol instead.
fn register_xids(device: &Device, set: &EventSet) -> Result<(), NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceRegisterEvents.as_ref())?;
    // SAFETY: both handles are live for the duration of the call (`device` and `set` are
    // borrowed), and `nvmlDeviceRegisterEvents(nvmlDevice_t, unsigned long long, nvmlEventSet_t)`
    // takes them by value.
    unsafe {
        nvml_try(sym(
            device.handle(),
            EventTypes::CRITICAL_XID_ERROR.bits(),
            set.handle(),
        ))
    }
}
