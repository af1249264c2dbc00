//! The cost model (`NVML_SIM_COST`): a JSON table in the format of
//! `nvml-sim/costs/h100-driver-580.json` (`{"functions": {"nvmlSymbol": {"wall_us": f,
//! "cpu_us": f|null}}}`) read at the `nvmlInit*` that takes the ref count from 0 to 1 and
//! dropped at the last `nvmlShutdown`. While it is loaded, a call of a listed export costs its
//! price measured from the call's entry: busy until this thread has used `cpu_us` of CPU time
//! since the entry (`wall_us` when `cpu_us` is null), then asleep until `wall_us` have passed
//! since the entry: a 21 ms `nvmlDeviceGetPcieThroughput` with 0.9 ms of CPU, as on a real
//! H100. The simulator's own work in the call counts towards the price, not on top of it (the
//! real driver's work is what the price measured); a call whose simulated work alone exceeds its
//! price costs that work (the event wait's look at the scenario file, say).
//!
//! The rest of the price is spent after the export's body, by [`crate::ffi::run`], with no lock
//! of the simulator held: calls on different threads (one per GPU, as a parallel poller makes
//! them) overlap in time as they do on a real driver. The table itself sits behind a read-write
//! lock taken only to copy one entry out. It must not be used to make a call cheaper than the
//! simulator's work in it, nor to spend a price twice.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// What one call costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Time from the start of the cost to the return.
    pub wall: Duration,
    /// CPU time burnt first (busy, on the calling thread).
    pub cpu: Duration,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    #[serde(rename = "_about", default)]
    _about: Option<String>,
    functions: BTreeMap<String, RawCost>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCost {
    wall_us: f64,
    #[serde(default)]
    cpu_us: Option<f64>,
    /// Where the figure comes from (free text, ignored).
    #[serde(default)]
    source: Option<String>,
}

type Table = HashMap<String, Cost>;

static TABLE: RwLock<Option<Arc<Table>>> = RwLock::new(None);

/// Most a single call may be made to cost: an hour, a typo guard that still lets a test make a
/// call hang as a wedged driver does (the real maximum is ~21 ms; the agent's stop budget is
/// tested against a creation that never returns within it).
const MAX_US: f64 = 3_600_000_000.0;

fn micros(what: &str, name: &str, us: f64) -> Result<Duration, String> {
    if !(0.0..=MAX_US).contains(&us) {
        return Err(format!(
            "'{name}': {what} {us} is not a number of microseconds between 0 and {MAX_US}"
        ));
    }
    Ok(Duration::from_secs_f64(us / 1e6))
}

/// Parses a cost table; `Err` is the message (without the file name). Every function must be
/// one this library exports.
pub fn parse(text: &str) -> Result<HashMap<String, Cost>, String> {
    let raw: RawTable = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut table = HashMap::new();
    for (name, c) in raw.functions {
        let _ = c.source;
        if !crate::EXPORTED.contains(&name.as_str()) {
            return Err(format!("'{name}' is not a function this library exports"));
        }
        let wall = micros("wall_us", &name, c.wall_us)?;
        let cpu = match c.cpu_us {
            Some(us) => micros("cpu_us", &name, us)?,
            None => wall,
        };
        table.insert(name, Cost { wall, cpu });
    }
    Ok(table)
}

/// At the 0 → 1 init: loads `NVML_SIM_COST` (unset: no cost). `Err` is the stderr line
/// `nvml-sim: FILE: message`; the previous table is dropped either way.
pub fn load_from_env() -> Result<(), String> {
    unload();
    let Some(path) = std::env::var_os("NVML_SIM_COST") else {
        return Ok(());
    };
    let shown = std::path::Path::new(&path).display().to_string();
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("nvml-sim: {shown}: cannot read the cost table: {e}"))?;
    let table = parse(&text).map_err(|e| format!("nvml-sim: {shown}: {e}"))?;
    *TABLE.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(table));
    Ok(())
}

/// At the last shutdown: calls cost nothing until the next init loads a table.
pub fn unload() {
    *TABLE.write().unwrap_or_else(PoisonError::into_inner) = None;
}

/// The cost of `function`, if a table is loaded and lists it. Holds the read lock only to copy.
pub fn of(function: &str) -> Option<Cost> {
    let table = TABLE.read().unwrap_or_else(PoisonError::into_inner);
    table.as_ref()?.get(function).copied()
}

/// CPU time this thread has used.
fn thread_cpu() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs nothing else.
    let ret = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (ret == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// Where a priced call began: its wall clock and, when the call was priced at its entry, this
/// thread's CPU clock.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    at: Instant,
    cpu: Option<Duration>,
}

/// At a call's entry: the instants its price is measured from. The thread's CPU clock (a system
/// call) is read only when a table prices `function`, so calls cost nothing extra without one.
pub fn enter(function: &str) -> Entry {
    let at = Instant::now();
    let cpu = of(function).and_then(|_| thread_cpu());
    Entry { at, cpu }
}

/// After a call's body: spends what is left of its price, if a table prices `function`. The
/// call that loads the table (the 0 → 1 init) was not priced at its entry: its CPU price is
/// spent in full after the body, its wall price from the entry.
pub fn settle(function: &str, entry: Entry) {
    if let Some(cost) = of(function) {
        spend(cost, entry);
    }
}

/// Spends what is left of `cost` since `entry` on the calling thread: busy until the thread has
/// used `cost.cpu` of CPU time since the entry (on a loaded machine that takes longer than
/// `cost.cpu` of wall time, as it would for the real driver), then asleep until `cost.wall` has
/// passed since the entry. Must be called with no lock held.
pub fn spend(cost: Cost, entry: Entry) {
    if !cost.cpu.is_zero() {
        match entry.cpu.or_else(thread_cpu) {
            Some(cpu0) => {
                // Stop spinning after a generous wall bound too, in case the clock stalls.
                let give_up = cost.cpu * 20 + Duration::from_secs(1);
                while thread_cpu().is_some_and(|t| t.saturating_sub(cpu0) < cost.cpu)
                    && entry.at.elapsed() < give_up
                {
                    std::hint::spin_loop();
                }
            }
            None => {
                while entry.at.elapsed() < cost.cpu {
                    std::hint::spin_loop();
                }
            }
        }
    }
    let left = cost.wall.saturating_sub(entry.at.elapsed());
    if !left.is_zero() {
        std::thread::sleep(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_real_table_format() {
        let t = parse(
            r#"{"_about": "x", "functions": {
                "nvmlDeviceGetPcieThroughput": {"wall_us": 20951.1, "cpu_us": 876.1, "source": "s"},
                "nvmlDeviceGetClock": {"wall_us": 1014.1, "cpu_us": null},
                "nvmlDeviceGetName": {"wall_us": 4.7}}}"#,
        )
        .expect("valid");
        let pcie = t["nvmlDeviceGetPcieThroughput"];
        assert_eq!(pcie.wall, Duration::from_nanos(20_951_100));
        assert_eq!(pcie.cpu, Duration::from_nanos(876_100));
        let clock = t["nvmlDeviceGetClock"];
        assert_eq!(clock.cpu, clock.wall, "null CPU = all wall time on the CPU");
        assert_eq!(t["nvmlDeviceGetName"].cpu, Duration::from_nanos(4_700));
    }

    #[test]
    fn the_shipped_h100_table_loads() {
        let t = parse(include_str!("../costs/h100-driver-580.json")).expect("valid table");
        assert_eq!(
            t["nvmlDeviceGetPcieThroughput"].wall,
            Duration::from_nanos(20_951_100)
        );
        assert_eq!(
            t["nvmlInit_v2"].cpu,
            Duration::from_millis(14) + Duration::from_micros(400)
        );
    }

    #[test]
    fn rejects_what_is_not_a_cost_table() {
        let err = |text: &str| parse(text).expect_err(text);
        assert!(err("{").contains("EOF"));
        assert!(
            err(r#"{"functions": {"nvmlDeviceGetNme": {"wall_us": 1}}}"#)
                .contains("'nvmlDeviceGetNme' is not a function this library exports")
        );
        assert!(
            err(r#"{"functions": {"nvmlDeviceGetName": {"wall_us": -1}}}"#).contains("wall_us -1")
        );
        assert!(
            err(r#"{"functions": {"nvmlDeviceGetName": {"wall_us": 1, "cpu": 1}}}"#)
                .contains("unknown field `cpu`")
        );
        assert!(err(r#"{"function": {}}"#).contains("unknown field"));
    }

    #[test]
    fn spend_burns_cpu_then_sleeps() {
        let t0 = Instant::now();
        let c0 = thread_cpu().expect("thread CPU clock");
        spend(
            Cost {
                wall: Duration::from_millis(40),
                cpu: Duration::from_millis(10),
            },
            Entry {
                at: t0,
                cpu: Some(c0),
            },
        );
        let (wall, cpu) = (t0.elapsed(), thread_cpu().expect("clock") - c0);
        assert!(wall >= Duration::from_millis(40), "{wall:?}");
        assert!(cpu >= Duration::from_millis(10), "{cpu:?}");
        assert!(cpu < Duration::from_millis(35), "slept the rest: {cpu:?}");
    }

    /// Burns `d` of this thread's CPU, as a call body's simulated work would.
    fn burn(d: Duration) {
        let c0 = thread_cpu().expect("thread CPU clock");
        while thread_cpu().expect("clock") - c0 < d {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn the_work_in_the_call_is_part_of_its_price_not_added_to_it() {
        let price = Cost {
            wall: Duration::from_millis(30),
            cpu: Duration::from_millis(30),
        };
        let entry = Entry {
            at: Instant::now(),
            cpu: thread_cpu(),
        };
        let c0 = entry.cpu.expect("thread CPU clock");
        // The body's own work: 20 ms of the 30 ms price.
        burn(Duration::from_millis(20));
        spend(price, entry);
        let cpu = thread_cpu().expect("clock") - c0;
        assert!(cpu >= Duration::from_millis(30), "the whole price: {cpu:?}");
        // Price plus body would be 50 ms; the price alone is 30 (slack for the clock's reads).
        assert!(cpu < Duration::from_millis(42), "price + body: {cpu:?}");
    }

    #[test]
    fn work_beyond_the_price_costs_what_it_took_and_no_more() {
        let entry = Entry {
            at: Instant::now(),
            cpu: thread_cpu(),
        };
        let c0 = entry.cpu.expect("thread CPU clock");
        burn(Duration::from_millis(20));
        spend(
            Cost {
                wall: Duration::from_millis(10),
                cpu: Duration::from_millis(10),
            },
            entry,
        );
        // Spent after the work, the price would make it 30 ms.
        let cpu = thread_cpu().expect("clock") - c0;
        assert!(cpu < Duration::from_millis(26), "{cpu:?}");
    }
}
