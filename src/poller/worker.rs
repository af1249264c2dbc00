//! One thread per GPU: it owns its device's NVML state (capabilities, process-utilization
//! cursor, GPM samples, the last reading) and answers the observer's poll requests.
//!
//! Polling GPUs on their own threads makes a poll of eight GPUs take about as long as one, and
//! keeps a GPU whose NVML calls hang from stalling the others: the observer publishes without
//! it and says so. The reading is kept between polls and each read updates only its own
//! fields, so values of the slow tier stay published between their reads, and a source's
//! status is its reads' last outcome: it does not flicker with the tier.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::schedule::{Cadence, Due, Schedule};
use crate::gpu::{GpuReader, Handle, IdentityRead, ReadOutcome, Tier, READS};
use crate::snapshot::{GpuIdentity, GpuReading, GpuStatus, NvmlCode, SourceStatus};

/// What a worker shares with the observer while it works.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Since when the worker has been working on a job (`None`: idle). Set by the observer
    /// when it sends a job, cleared by the worker once the reply and the background reads
    /// after it are done.
    pub since: Option<Instant>,
    /// The identity the worker read last, told as soon as it is read: a GPU whose calls hang
    /// later in the same poll (its first one, say) is still known by its UUID.
    pub identity: Option<Arc<GpuIdentity>>,
}

pub(super) type Busy = Arc<Mutex<Progress>>;

/// What the observer asks of a worker.
pub(super) enum Job {
    Poll {
        seq: u64,
        now: Instant,
        cadence: Cadence,
        /// The enumeration changed: check that the index still names the same board.
        verify: bool,
    },
    Stop,
}

/// A worker's answer to one poll.
pub(super) struct Reply {
    pub index: u32,
    pub seq: u64,
    pub gpu: Observed,
}

/// What one worker knows of its GPU after a poll.
#[derive(Debug, Clone)]
pub(super) struct Observed {
    pub identity: Option<Arc<GpuIdentity>>,
    pub status: GpuStatus,
    pub reading: GpuReading,
    /// Calls that failed in the last run of each read (the slow ones included).
    pub failed_calls: u32,
    /// The most consecutive runs of any one read that failed, up to the last.
    pub failing_runs: u32,
    /// Errors and call costs since the previous reply (background reads included).
    pub errors: Vec<(&'static str, NvmlCode)>,
    pub costs: Vec<(&'static str, u64, Duration)>,
    /// Per source: the last run of each of its reads.
    pub sources: Vec<(&'static str, SourceStatus)>,
    /// Whether a slow or expensive tier ran in this poll.
    pub slow: bool,
}

impl Observed {
    /// A GPU that has not answered yet, known only by what it is presumed to be.
    pub fn unknown(identity: Option<Arc<GpuIdentity>>) -> Self {
        Observed {
            identity,
            status: GpuStatus::Up,
            reading: GpuReading::default(),
            failed_calls: 0,
            failing_runs: 0,
            errors: Vec::new(),
            costs: Vec::new(),
            sources: Vec::new(),
            slow: false,
        }
    }
}

/// The runs of one read so far.
#[derive(Debug, Clone, Copy, Default)]
struct Record {
    last: Option<ReadOutcome>,
    /// Consecutive failed runs, up to the last.
    failing_runs: u32,
}

impl Record {
    fn push(&mut self, o: ReadOutcome) {
        self.failing_runs = if o.failures > 0 {
            self.failing_runs + 1
        } else {
            0
        };
        self.last = Some(o);
    }
}

/// The slot of the handle lookup and identity read, after those of `READS`.
const IDENTITY: usize = READS.len();

pub(super) struct Worker {
    reader: GpuReader,
    identity: Option<Arc<GpuIdentity>>,
    /// The last identity read had no failure: it is not read again.
    identity_complete: bool,
    reading: GpuReading,
    /// The runs of each read of `READS`, by position, then of the identity read.
    records: Vec<Record>,
    schedule: Schedule,
    status: Option<GpuStatus>,
    /// The expensive tier ran in the last poll: background reads follow the reply.
    background_due: bool,
    busy: Busy,
}

impl Worker {
    /// A worker for `reader`'s GPU; `presumed` is the identity an earlier enumeration found
    /// at this index, kept while the GPU cannot say who it is (lost).
    pub fn new(reader: GpuReader, presumed: Option<Arc<GpuIdentity>>, busy: Busy) -> Self {
        Worker {
            reader,
            identity: presumed,
            identity_complete: false,
            reading: GpuReading::default(),
            records: vec![Record::default(); READS.len() + 1],
            schedule: Schedule::default(),
            status: None,
            background_due: false,
            busy,
        }
    }

    /// The thread's loop: answers each job, runs what is due in the background, then says it
    /// is idle.
    pub fn run(mut self, jobs: Receiver<Job>, replies: Sender<Reply>) {
        while let Ok(Job::Poll {
            seq,
            now,
            cadence,
            verify,
        }) = jobs.recv()
        {
            let gpu = self.poll(now, cadence, verify);
            let reply = Reply {
                index: self.reader.index(),
                seq,
                gpu,
            };
            if replies.send(reply).is_err() {
                return;
            }
            self.background();
            self.busy
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .since = None;
        }
    }

    fn poll(&mut self, now: Instant, cadence: Cadence, verify: bool) -> Observed {
        self.reader.log.begin_poll();
        let first_time = self.never_ran(Tier::Background);
        let started = Instant::now();
        let mut due = Due::default();
        let result = self.with_device(|w, device| {
            if verify || !w.identity_complete {
                w.read_identity(device, started)?;
            } else {
                w.records[IDENTITY].push(ReadOutcome {
                    duration: started.elapsed(),
                    failures: 0,
                });
            }
            due = w.schedule.due(now, cadence);
            for (i, read) in READS.iter().enumerate() {
                let run = match read.tier {
                    Tier::Fast => true,
                    Tier::Slow => due.slow,
                    Tier::Expensive => due.expensive,
                    Tier::Profiling => due.profiling,
                    // Inline only the first time, so that the first publication is whole.
                    Tier::Background => w.records[i].last.is_none(),
                };
                if run && !w.reader.log.lost {
                    let o = w.reader.run(read, device, &mut w.reading);
                    w.records[i].push(o);
                }
            }
            Ok(())
        });
        let status = match result {
            Ok(()) if self.reader.log.lost => GpuStatus::Lost,
            Ok(()) => GpuStatus::Up,
            Err(NvmlCode::GpuIsLost) => GpuStatus::Lost,
            Err(code) => GpuStatus::Unreadable(format!("NVML cannot read this GPU: {code}")),
        };
        if status != GpuStatus::Up {
            // Nothing read before the loss is current: everything, identity included, is read
            // again on return.
            self.reading = GpuReading::default();
            self.records.iter_mut().for_each(|r| *r = Record::default());
            self.schedule.reset();
            self.identity_complete = false;
            // A lost GPU is a verdict on the GPU; one NVML cannot read fails the source.
            self.records[IDENTITY].push(ReadOutcome {
                duration: started.elapsed(),
                failures: u32::from(status != GpuStatus::Lost),
            });
        }
        // Background reads that ran inline this poll (their first time) need not run again.
        let ran_inline = first_time && !self.never_ran(Tier::Background);
        self.background_due = due.expensive && status == GpuStatus::Up && !ran_inline;
        self.log_transition(&status);
        self.observed(status, due.slow || due.expensive)
    }

    /// Reads the identity, checking first that the index still names the board it did: if
    /// not, nothing learned about the old board holds.
    fn read_identity(&mut self, device: &Handle, started: Instant) -> Result<(), NvmlCode> {
        self.reader.log.begin_read();
        let uuid = self.reader.uuid(device)?;
        if self.identity.as_ref().is_some_and(|old| old.uuid != uuid) {
            self.reader.forget_board();
            self.reading = GpuReading::default();
            self.records.iter_mut().for_each(|r| *r = Record::default());
            self.schedule.reset();
            self.identity = None;
        }
        let read = self.reader.identity(device);
        self.records[IDENTITY].push(ReadOutcome {
            duration: started.elapsed(),
            failures: self.reader.log.read_failures(),
        });
        adopt(read?, &mut self.identity, &mut self.identity_complete);
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .identity = self.identity.clone();
        Ok(())
    }

    /// Runs `f` with this poll's device handle.
    fn with_device(
        &mut self,
        f: impl FnOnce(&mut Worker, &Handle) -> Result<(), NvmlCode>,
    ) -> Result<(), NvmlCode> {
        let library = self.reader.library();
        let device = self.reader.handle(&library)?;
        f(self, &device)
    }

    fn never_ran(&self, tier: Tier) -> bool {
        READS
            .iter()
            .zip(&self.records)
            .any(|(r, rec)| r.tier == tier && rec.last.is_none())
    }

    /// Runs the background reads (PCIe throughput: 20 ms of wall time per direction) after the
    /// reply, so that they never delay a publication. Their results go out with the next poll.
    fn background(&mut self) {
        if !std::mem::take(&mut self.background_due) {
            return;
        }
        let _ = self.with_device(|w, device| {
            for (i, read) in READS.iter().enumerate() {
                if read.tier == Tier::Background && !w.reader.log.lost {
                    let o = w.reader.run(read, device, &mut w.reading);
                    w.records[i].push(o);
                }
            }
            Ok(())
        });
    }

    fn observed(&mut self, status: GpuStatus, slow: bool) -> Observed {
        let (errors, costs) = self.reader.log.take();
        let mut sources: Vec<(&'static str, SourceStatus)> = Vec::new();
        let named = READS
            .iter()
            .map(|r| (r.source, r.tier == Tier::Background))
            .chain(std::iter::once(("identity", false)));
        for ((source, background), record) in named.zip(&self.records) {
            let Some(o) = record.last else { continue };
            // Background reads are off the poll's path: their time is not the poll's.
            let duration = if background {
                Duration::ZERO
            } else {
                o.duration
            };
            match sources.iter_mut().find(|(s, _)| *s == source) {
                Some((_, s)) => {
                    s.duration += duration;
                    s.success &= o.failures == 0;
                }
                None => sources.push((
                    source,
                    SourceStatus {
                        duration,
                        success: o.failures == 0,
                    },
                )),
            }
        }
        let last = || self.records.iter().filter_map(|r| r.last);
        Observed {
            identity: self.identity.clone(),
            status,
            reading: self.reading.clone(),
            failed_calls: last().map(|o| o.failures).sum(),
            failing_runs: self
                .records
                .iter()
                .map(|r| r.failing_runs)
                .max()
                .unwrap_or(0),
            errors,
            costs: costs.into_iter().map(|(f, (n, t))| (f, n, t)).collect(),
            sources,
            slow,
        }
    }

    fn log_transition(&mut self, status: &GpuStatus) {
        if self.status.as_ref() == Some(status) {
            return;
        }
        let index = self.reader.index();
        let uuid = self.identity.as_ref().map_or("", |i| i.uuid.as_str());
        match status {
            GpuStatus::Up if self.status.is_some() => {
                tracing::info!(gpu = index, uuid, "GPU readable again")
            }
            GpuStatus::Up => {}
            GpuStatus::Lost => tracing::error!(
                gpu = index,
                uuid,
                "GPU is lost (fallen off the bus or inaccessible)"
            ),
            GpuStatus::Unreadable(why) => {
                tracing::error!(gpu = index, uuid, reason = %why, "GPU unreadable")
            }
        }
        self.status = Some(status.clone());
    }
}

/// Takes an identity read, merged with what was known of the same board.
fn adopt(read: IdentityRead, identity: &mut Option<Arc<GpuIdentity>>, complete: &mut bool) {
    *complete = read.complete;
    *identity = Some(Arc::new(read.merged(identity.as_deref())));
}
