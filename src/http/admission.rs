//! Which connections may be open, and which one is closed to make room for a new one.
//!
//! A connection is *waiting* while none of its requests is being served: before its first byte,
//! while its head trickles in, and idle between keep-alive requests. A waiting connection has
//! asked for nothing yet, so closing it loses no answer; it is therefore not counted against
//! `max_connections` (which caps requests being served) but against the open budget, derived from
//! the descriptor limit. When the budget is spent, the oldest waiting connection of the peer (IP
//! address) that holds the most connections is closed to make room, much as nginx reuses its
//! idle connections: an address that floods the port only ever pushes out its own connections,
//! and a probe or a scrape from elsewhere always gets in. Only when every open connection is
//! serving a request is a newcomer refused.
//!
//! Memory is budgeted the same way: the bytes of unfinished request heads (up to 64 KiB each,
//! held in hyper's buffers) count against one budget for all connections, and past it the
//! waiting connection with the largest unfinished head is closed. Real clients send heads of a
//! few hundred bytes, so they are never the largest.
//!
//! Must not: know about HTTP, or hold its lock across anything but map updates.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

/// A connection's side of the registry, shared with its task.
#[derive(Debug, Default)]
pub struct Slot {
    /// Woken when the connection is evicted or the server shuts down.
    wake: Notify,
    /// Set under the registry's lock when the connection is closed to make room.
    evicted: AtomicBool,
    /// Set at its first request: a connection that never asked anything is closed at once at
    /// shutdown, one that did is let finish its answer.
    served: AtomicBool,
    /// Bytes read since its last request began: its unfinished head. Atomic because it is
    /// counted on every read, outside the lock.
    head: AtomicUsize,
}

/// Why a connection's task was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    Evicted,
    Closing,
}

impl Slot {
    pub fn has_served(&self) -> bool {
        self.served.load(Ordering::Acquire)
    }

    /// Resolves when the connection must give way (cancel-safe).
    pub async fn woken(&self, registry: &Registry) -> Wake {
        loop {
            self.wake.notified().await;
            if self.evicted.load(Ordering::Acquire) {
                return Wake::Evicted;
            }
            if registry.closing.load(Ordering::Acquire) {
                return Wake::Closing;
            }
        }
    }
}

#[derive(Debug)]
pub struct Registry {
    inner: Mutex<Inner>,
    closing: AtomicBool,
    /// Bytes of unfinished heads over all connections, and their budget.
    heads: AtomicUsize,
    head_budget: usize,
}

#[derive(Debug)]
struct Inner {
    budget: usize,
    /// Source of connection ids and of waiting sequence numbers (which order eviction).
    next: u64,
    conns: HashMap<u64, Conn>,
    peers: HashMap<IpAddr, Peer>,
    /// True from the first eviction until the open count falls back under half the budget, so
    /// that a flood is logged once, not once per connection.
    overloaded: bool,
    /// The same for the head budget.
    shedding: bool,
}

#[derive(Debug)]
struct Conn {
    peer: IpAddr,
    slot: Arc<Slot>,
    /// Requests of this connection being served (hyper serves one at a time; counted to be safe).
    serving: usize,
    /// Key in its peer's `waiting` map while no request is being served.
    waiting: Option<u64>,
}

#[derive(Debug, Default)]
struct Peer {
    open: usize,
    /// Waiting connections, oldest first: sequence number → connection id.
    waiting: BTreeMap<u64, u64>,
}

/// What `admit` decided.
#[derive(Debug)]
pub enum Admit {
    /// Open; `evicted` names the peer whose connection was closed to make room, the first time
    /// the budget is spent since it last recovered (to be logged once).
    Open {
        ticket: Ticket,
        evicted: Option<IpAddr>,
    },
    /// Every open connection is serving a request (or the server is closing): refuse.
    Full,
}

/// An open connection's place in the budget; dropping it (the task ending) frees it.
#[derive(Debug)]
pub struct Ticket {
    registry: Arc<Registry>,
    id: u64,
    slot: Arc<Slot>,
}

/// A request being served; dropping it (the response handed to the socket) makes its
/// connection waiting again.
#[derive(Debug)]
pub struct Serving {
    registry: Arc<Registry>,
    id: u64,
}

impl Registry {
    /// A registry for at most `budget` open connections and `head_budget` bytes of unfinished
    /// request heads.
    pub fn new(budget: usize, head_budget: usize) -> Arc<Registry> {
        Arc::new(Registry {
            inner: Mutex::new(Inner {
                budget: budget.max(1),
                next: 0,
                conns: HashMap::new(),
                peers: HashMap::new(),
                overloaded: false,
                shedding: false,
            }),
            closing: AtomicBool::new(false),
            heads: AtomicUsize::new(0),
            head_budget,
        })
    }

    /// The lock is only ever held for map updates that cannot panic, so a poisoned lock still
    /// guards consistent data.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Admit {
        if self.closing.load(Ordering::Acquire) {
            return Admit::Full;
        }
        let mut inner = self.lock();
        let mut evicted = None;
        if inner.conns.len() >= inner.budget {
            let Some((victim, slot)) = inner.evict() else {
                return Admit::Full;
            };
            self.evicted(&slot);
            if !inner.overloaded {
                inner.overloaded = true;
                evicted = Some(victim);
            }
        }
        let id = inner.seq();
        let slot = Arc::new(Slot::default());
        inner.conns.insert(
            id,
            Conn {
                peer,
                slot: slot.clone(),
                serving: 0,
                waiting: None,
            },
        );
        inner.peers.entry(peer).or_default().open += 1;
        inner.set_waiting(id);
        let ticket = Ticket {
            registry: self.clone(),
            id,
            slot,
        };
        Admit::Open { ticket, evicted }
    }

    /// Marks a request of connection `id` as being served until the guard is dropped.
    pub fn serving(self: &Arc<Self>, id: u64) -> Serving {
        let mut inner = self.lock();
        if let Some(conn) = inner.conns.get_mut(&id) {
            // Its head is parsed: from here on hyper's buffer holds a request, not a threat.
            self.heads
                .fetch_sub(conn.slot.head.swap(0, Ordering::AcqRel), Ordering::AcqRel);
            conn.serving += 1;
            conn.slot.served.store(true, Ordering::Release);
            if let Some(seq) = conn.waiting.take() {
                let peer = conn.peer;
                if let Some(p) = inner.peers.get_mut(&peer) {
                    p.waiting.remove(&seq);
                }
            }
        }
        Serving {
            registry: self.clone(),
            id,
        }
    }

    /// Counts `n` bytes read by `slot`'s connection. Past the head budget, closes the waiting
    /// connections with the largest unfinished heads until it is met; returns the peer of the
    /// first one closed the first time this happens since the budget last recovered.
    pub fn read(&self, slot: &Slot, n: usize) -> Option<IpAddr> {
        slot.head.fetch_add(n, Ordering::AcqRel);
        if self.heads.fetch_add(n, Ordering::AcqRel) + n <= self.head_budget {
            return None;
        }
        let mut inner = self.lock();
        let mut first = None;
        while self.heads.load(Ordering::Acquire) > self.head_budget {
            let Some(id) = inner.largest_head() else {
                break;
            };
            if let Some(conn) = inner.remove(id) {
                first = first.or(Some(conn.peer));
                self.evicted(&conn.slot);
            }
        }
        if inner.shedding || first.is_none() {
            return None;
        }
        inner.shedding = true;
        first
    }

    /// Marks `slot` evicted, frees its head bytes and wakes its task.
    fn evicted(&self, slot: &Slot) {
        self.heads
            .fetch_sub(slot.head.swap(0, Ordering::AcqRel), Ordering::AcqRel);
        slot.evicted.store(true, Ordering::Release);
        slot.wake.notify_one();
    }

    /// Bytes of unfinished heads over all connections.
    pub fn heads(&self) -> usize {
        self.heads.load(Ordering::Acquire)
    }

    /// Wakes every connection: those that never asked anything close, the others finish.
    pub fn shutdown(&self) {
        self.closing.store(true, Ordering::Release);
        for conn in self.lock().conns.values() {
            conn.slot.wake.notify_one();
        }
    }

    pub fn budget(&self) -> usize {
        self.lock().budget
    }

    /// Connections open and, of those, waiting.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        let waiting = inner.peers.values().map(|p| p.waiting.len()).sum();
        (inner.conns.len(), waiting)
    }
}

impl Inner {
    fn seq(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn set_waiting(&mut self, id: u64) {
        let seq = self.seq();
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.serving > 0 || conn.waiting.is_some() {
            return;
        }
        conn.waiting = Some(seq);
        let peer = conn.peer;
        self.peers.entry(peer).or_default().waiting.insert(seq, id);
    }

    /// Removes the oldest waiting connection of the peer with the most open connections (ties:
    /// the peer whose waiting connection is oldest); returns that peer and the connection.
    fn evict(&mut self) -> Option<(IpAddr, Arc<Slot>)> {
        let (&peer, _) = self
            .peers
            .iter()
            .filter_map(|(ip, p)| {
                Some((ip, (p.open, std::cmp::Reverse(*p.waiting.keys().next()?))))
            })
            .max_by_key(|(_, rank)| *rank)?;
        let (_, id) = self.peers.get_mut(&peer)?.waiting.pop_first()?;
        let conn = self.remove(id)?;
        Some((peer, conn.slot))
    }

    /// The waiting connection with the largest unfinished head, if any has one.
    fn largest_head(&self) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, c)| c.waiting.is_some())
            .map(|(id, c)| (c.slot.head.load(Ordering::Acquire), *id))
            .filter(|(bytes, _)| *bytes > 0)
            .max()
            .map(|(_, id)| id)
    }

    /// Forgets connection `id`; `None` if it was already gone (evicted).
    fn remove(&mut self, id: u64) -> Option<Conn> {
        let conn = self.conns.remove(&id)?;
        if let Some(p) = self.peers.get_mut(&conn.peer) {
            if let Some(seq) = conn.waiting {
                p.waiting.remove(&seq);
            }
            p.open -= 1;
            if p.open == 0 {
                self.peers.remove(&conn.peer);
            }
        }
        Some(conn)
    }
}

impl Ticket {
    pub fn id(&self) -> u64 {
        self.id
    }
    pub fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let registry = &self.registry;
        // Always, even if evicted: bytes read after the eviction were counted too.
        registry
            .heads
            .fetch_sub(self.slot.head.swap(0, Ordering::AcqRel), Ordering::AcqRel);
        let mut inner = registry.lock();
        inner.remove(self.id);
        if inner.overloaded && inner.conns.len() < inner.budget / 2 {
            inner.overloaded = false;
            tracing::info!(
                open = inner.conns.len(),
                "the open-connection budget has room again"
            );
        }
        if inner.shedding && registry.heads() < registry.head_budget / 2 {
            inner.shedding = false;
            tracing::info!(
                bytes = registry.heads(),
                "the budget for unfinished request heads has room again"
            );
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut inner = self.registry.lock();
        if let Some(conn) = inner.conns.get_mut(&self.id) {
            conn.serving = conn.serving.saturating_sub(1);
            inner.set_waiting(self.id);
        }
    }
}

#[cfg(test)]
mod tests;
