//! The registry's decisions, without sockets.

use super::*;

fn ip(last: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, last])
}

fn open(r: &Arc<Registry>, peer: IpAddr) -> Ticket {
    match r.admit(peer) {
        Admit::Open { ticket, .. } => ticket,
        Admit::Full => panic!("refused"),
    }
}

#[test]
fn a_spent_budget_closes_the_oldest_waiting_connection_of_the_busiest_peer() {
    let r = Registry::new(4, usize::MAX);
    let prober = open(&r, ip(1));
    let flood: Vec<Ticket> = (0..3).map(|_| open(&r, ip(2))).collect();
    let Admit::Open {
        ticket: newcomer,
        evicted,
    } = r.admit(ip(3))
    else {
        panic!("refused");
    };
    assert_eq!(evicted, Some(ip(2)), "the first eviction is reported");
    assert!(flood[0].slot().evicted.load(Ordering::Acquire));
    assert!(!flood[1].slot().evicted.load(Ordering::Acquire));
    assert!(!prober.slot().evicted.load(Ordering::Acquire));
    assert_eq!(r.counts(), (4, 4));
    // Still the flooder, not the prober, and reported only once.
    let Admit::Open { evicted, .. } = r.admit(ip(2)) else {
        panic!("refused");
    };
    assert_eq!(evicted, None);
    assert!(flood[1].slot().evicted.load(Ordering::Acquire));
    assert!(!prober.slot().evicted.load(Ordering::Acquire));
    drop(newcomer);
    drop(flood);
    assert_eq!(r.counts(), (1, 1), "the prober alone is left");
}

#[test]
fn serving_connections_are_never_evicted_and_a_full_house_refuses() {
    let r = Registry::new(2, usize::MAX);
    let a = open(&r, ip(1));
    let b = open(&r, ip(1));
    let sa = r.serving(a.id());
    let sb = r.serving(b.id());
    assert_eq!(r.counts(), (2, 0));
    assert!(matches!(r.admit(ip(2)), Admit::Full));
    drop(sa);
    // `a` is waiting again, and now the only one that can give way.
    assert!(matches!(r.admit(ip(2)), Admit::Open { .. }));
    assert!(a.slot().evicted.load(Ordering::Acquire));
    assert!(!b.slot().evicted.load(Ordering::Acquire));
    assert!(a.slot().has_served());
    drop(sb);
}

#[test]
fn a_connection_idle_after_a_request_queues_behind_those_that_never_asked() {
    let r = Registry::new(2, usize::MAX);
    let first = open(&r, ip(1));
    let second = open(&r, ip(1));
    drop(r.serving(first.id()));
    open(&r, ip(1));
    assert!(second.slot().evicted.load(Ordering::Acquire));
    assert!(!first.slot().evicted.load(Ordering::Acquire));
}

#[test]
fn dropping_tickets_frees_the_budget_and_the_peers() {
    let r = Registry::new(8, usize::MAX);
    let t: Vec<Ticket> = (0..8).map(|i| open(&r, ip(i))).collect();
    let serving = r.serving(t[3].id());
    drop(t);
    drop(serving);
    assert_eq!(r.counts(), (0, 0));
    assert!(r.lock().peers.is_empty());
}

#[tokio::test]
async fn shutdown_wakes_every_connection_and_refuses_newcomers() {
    let r = Registry::new(4, usize::MAX);
    let t = open(&r, ip(1));
    r.shutdown();
    assert_eq!(t.slot().woken(&r).await, Wake::Closing);
    assert!(matches!(r.admit(ip(1)), Admit::Full));
}

#[test]
fn past_the_head_budget_the_largest_unfinished_head_gives_way() {
    let r = Registry::new(16, 1000);
    let scraper = open(&r, ip(1));
    let fat: Vec<Ticket> = (0..3).map(|_| open(&r, ip(2))).collect();
    assert_eq!(r.read(scraper.slot(), 200), None);
    assert_eq!(r.read(fat[0].slot(), 300), None);
    assert_eq!(r.read(fat[1].slot(), 400), None);
    assert_eq!(r.heads(), 900);
    // 900 + 250 > 1000: the 400-byte head goes, and that is reported once.
    assert_eq!(r.read(fat[2].slot(), 250), Some(ip(2)));
    assert!(fat[1].slot().evicted.load(Ordering::Acquire));
    assert_eq!(r.heads(), 750);
    assert_eq!(r.counts().0, 3);
    assert_eq!(r.read(fat[2].slot(), 300), None, "logged once");
    assert!(fat[2].slot().evicted.load(Ordering::Acquire));
    assert!(!scraper.slot().evicted.load(Ordering::Acquire));
    assert!(!fat[0].slot().evicted.load(Ordering::Acquire));
}

#[test]
fn a_parsed_head_and_a_closed_connection_give_their_bytes_back() {
    let r = Registry::new(16, 1000);
    let a = open(&r, ip(1));
    let b = open(&r, ip(1));
    r.read(a.slot(), 600);
    r.read(b.slot(), 300);
    let serving = r.serving(a.id());
    assert_eq!(r.heads(), 300);
    // Serving connections are not shed, whatever they read meanwhile.
    r.read(a.slot(), 900);
    assert!(!a.slot().evicted.load(Ordering::Acquire));
    assert!(b.slot().evicted.load(Ordering::Acquire));
    drop(serving);
    drop(b);
    drop(a);
    assert_eq!(r.heads(), 0);
}
