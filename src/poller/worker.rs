//! One thread per GPU: it owns its device's NVML state (capabilities, process-utilization
//! cursor, GPM samples, the last reading) and answers the observer's poll requests.
//!
//! Polling GPUs on their own threads makes a poll of eight GPUs take about as long as one, and
//! keeps a GPU whose NVML calls hang from stalling the others: the observer publishes without
//! it and says so. The reading is kept between polls and each read updates only its own
//! fields, so values of the slow tier stay published between their reads, and a source's
//! status is its reads' last outcome: it does not flicker with the tier.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::schedule::{Cadence, Due, Schedule};
use crate::gpu::{GpuReader, IdentityRead, ReadOutcome, Tier, READS};
use crate::snapshot::{GpuIdentity, GpuReading, GpuStatus, NvmlCode, SourceStatus};

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
    /// Errors and call costs since the previous reply (background reads included).
    pub errors: Vec<(&'static str, NvmlCode)>,
    pub costs: Vec<(&'static str, u64, Duration)>,
    /// Per source: the last run of each of its reads.
    pub sources: Vec<(&'static str, SourceStatus)>,
    /// Whether a slow or expensive tier ran in this poll.
    pub slow: bool,
}

pub(super) struct Worker {
    reader: GpuReader,
    identity: Option<Arc<GpuIdentity>>,
    /// The last identity read had no failure: it is not read again.
    identity_complete: bool,
    reading: GpuReading,
    /// The last outcome of each read of `READS`, by position; the handle and identity read
    /// last.
    outcomes: Vec<Option<ReadOutcome>>,
    schedule: Schedule,
    status: Option<GpuStatus>,
    /// The expensive tier ran in the last poll: background reads follow the reply.
    background_due: bool,
}

impl Worker {
    /// A worker for `reader`'s GPU; `presumed` is the identity an earlier enumeration found
    /// at this index, kept while the GPU cannot say who it is (lost).
    pub fn new(reader: GpuReader, presumed: Option<Arc<GpuIdentity>>) -> Self {
        Worker {
            reader,
            identity: presumed,
            identity_complete: false,
            reading: GpuReading::default(),
            outcomes: vec![None; READS.len() + 1],
            schedule: Schedule::default(),
            status: None,
            background_due: false,
        }
    }

    /// The thread's loop: answers each job, then runs what is due in the background.
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
        }
    }

    fn poll(&mut self, now: Instant, cadence: Cadence, verify: bool) -> Observed {
        self.reader.log.begin_poll();
        let had_background = READS
            .iter()
            .zip(&self.outcomes)
            .any(|(r, o)| r.tier == Tier::Background && o.is_some());
        let mut due = Due::default();
        let started = Instant::now();
        // The handle lookup and identity read, reported as the `identity` source.
        let mut identity_outcome = ReadOutcome {
            duration: Duration::ZERO,
            failures: 0,
        };
        let result = {
            let Worker {
                reader,
                identity,
                identity_complete,
                reading,
                outcomes,
                schedule,
                ..
            } = self;
            reader.with_device(|reader, device| {
                if verify || !*identity_complete {
                    reader.log.begin_read();
                    let read = reader.identity(device);
                    identity_outcome.failures = reader.log.read_failures();
                    identity_outcome.duration = started.elapsed();
                    adopt(read?, identity, identity_complete, || {
                        // Another board at this index: nothing learned about the old one holds.
                        reader.forget_board();
                        *reading = GpuReading::default();
                        outcomes.iter_mut().for_each(|o| *o = None);
                        schedule.reset();
                    });
                } else {
                    identity_outcome.duration = started.elapsed();
                }
                due = schedule.due(now, cadence);
                for (i, read) in READS.iter().enumerate() {
                    let run = match read.tier {
                        Tier::Fast => true,
                        Tier::Slow => due.slow,
                        Tier::Expensive => due.expensive,
                        // Inline only the first time, so that the first publication is whole.
                        Tier::Background => outcomes[i].is_none(),
                    };
                    if run && !reader.log.lost {
                        outcomes[i] = Some(reader.run(read, device, reading));
                    }
                }
                Ok::<(), NvmlCode>(())
            })
        };
        let status = match result.and_then(|r| r) {
            Ok(()) if self.reader.log.lost => GpuStatus::Lost,
            Ok(()) => GpuStatus::Up,
            Err(NvmlCode::GpuIsLost) => GpuStatus::Lost,
            Err(code) => GpuStatus::Unreadable(format!("NVML cannot read this GPU: {code}")),
        };
        if status != GpuStatus::Up {
            // Nothing read before the loss is current; everything is read again on return.
            self.reading = GpuReading::default();
            self.outcomes.iter_mut().for_each(|o| *o = None);
            self.schedule.reset();
            // A lost GPU is a verdict on the GPU; one NVML cannot read fails the source.
            identity_outcome.failures = u32::from(status != GpuStatus::Lost);
        }
        self.outcomes[READS.len()] = Some(identity_outcome);
        // Background reads that ran inline need not run again right away.
        let inline = READS
            .iter()
            .zip(&self.outcomes)
            .any(|(r, o)| r.tier == Tier::Background && o.is_some() && !had_background);
        self.background_due = due.expensive && status == GpuStatus::Up && !inline;
        self.log_transition(&status);
        self.observed(status, due.slow || due.expensive)
    }

    /// Runs the background reads (PCIe throughput: 20 ms of wall time per direction) after the
    /// reply, so that they never delay a publication. Their results go out with the next poll.
    fn background(&mut self) {
        if !std::mem::take(&mut self.background_due) {
            return;
        }
        let Worker {
            reader,
            reading,
            outcomes,
            ..
        } = self;
        let _ = reader.with_device(|reader, device| {
            for (i, read) in READS.iter().enumerate() {
                if read.tier == Tier::Background && !reader.log.lost {
                    outcomes[i] = Some(reader.run(read, device, reading));
                }
            }
        });
    }

    fn observed(&mut self, status: GpuStatus, slow: bool) -> Observed {
        let (errors, costs) = self.reader.log.take();
        let mut sources: Vec<(&'static str, SourceStatus)> = Vec::new();
        let named = READS
            .iter()
            .map(|r| r.source)
            .chain(std::iter::once("identity"));
        for (source, outcome) in named.zip(&self.outcomes) {
            let Some(o) = outcome else { continue };
            match sources.iter_mut().find(|(s, _)| *s == source) {
                Some((_, s)) => {
                    s.duration += o.duration;
                    s.success &= o.failures == 0;
                }
                None => sources.push((
                    source,
                    SourceStatus {
                        duration: o.duration,
                        success: o.failures == 0,
                    },
                )),
            }
        }
        Observed {
            identity: self.identity.clone(),
            status,
            reading: self.reading.clone(),
            failed_calls: self.outcomes.iter().flatten().map(|o| o.failures).sum(),
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

/// Takes an identity read: merged with what was known when it is the same board, else
/// replacing it (after `other_board` clears what belonged to the old one).
fn adopt(
    read: IdentityRead,
    identity: &mut Option<Arc<GpuIdentity>>,
    complete: &mut bool,
    other_board: impl FnOnce(),
) {
    let same = identity
        .as_ref()
        .is_some_and(|old| old.uuid == read.identity.uuid);
    if identity.is_some() && !same {
        other_board();
    }
    *complete = read.complete;
    *identity = Some(Arc::new(read.merged(identity.as_deref())));
}
