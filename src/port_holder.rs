//! Who holds a TCP port the agent could not listen on, so that the error names it instead of
//! guessing: the listening socket's owner (uid) from `/proc/net/tcp{,6}`, and where this user
//! may look (`/proc/PID/fd`), the process, its pid and its systemd unit.
//!
//! Must not: change anything, or fail: what cannot be read is left out of the answer.

use std::path::Path;

/// The state of a listening socket in `/proc/net/tcp`.
const LISTEN: &str = "0A";

/// The user of the packaged service (`gpu-steward.service`).
const SERVICE_USER: &str = "gpu-steward";

/// A listening socket on the port: its owner and inode.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listener {
    uid: u32,
    inode: u64,
}

/// The listening sockets on `port` in one `/proc/net/tcp`-format text.
fn listeners(text: &str, port: u16) -> Vec<Listener> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local = f.get(1)?;
            let p = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            (p == port && *f.get(3)? == LISTEN).then_some(())?;
            Some(Listener {
                uid: f.get(7)?.parse().ok()?,
                inode: f.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// The process (pid, name) with the socket `inode` open, among those this user may look at.
fn process_of(proc: &Path, inode: u64) -> Option<(u32, String)> {
    let want = format!("socket:[{inode}]");
    for entry in std::fs::read_dir(proc).ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let found = fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()));
        if found {
            let name = std::fs::read_to_string(entry.path().join("comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_else(|_| "?".into());
            return Some((pid, name));
        }
    }
    None
}

/// What holds `port`, in words for the error (`gpu-steward (pid 812, gpu-steward.service)`), or
/// `None` when nothing this user can see does.
pub fn describe(port: u16) -> Option<String> {
    describe_in(Path::new("/proc"), port)
}

fn describe_in(proc: &Path, port: u16) -> Option<String> {
    let found: Vec<Listener> = ["net/tcp", "net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(proc.join(f)).ok())
        .flat_map(|t| listeners(&t, port))
        .collect();
    let first = found.first()?;
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(first.uid))
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {}", first.uid), |u| u.name);
    let Some((pid, name)) = found.iter().find_map(|l| process_of(proc, l.inode)) else {
        return Some(if user == SERVICE_USER {
            format!(
                "a process of user {user}: the installed agent (gpu-steward.service; \
                 `systemctl status gpu-steward`)"
            )
        } else {
            format!("a process of user {user} (`sudo ss -ltnp 'sport = :{port}'` names it)")
        });
    };
    let unit = std::fs::read_to_string(proc.join(pid.to_string()).join("cgroup"))
        .ok()
        .and_then(|t| crate::attribution::cgroup::parse(&t).systemd_unit)
        .map_or_else(String::new, |u| format!(", {u}"));
    Some(crate::terminal::escape(&format!("{name} (pid {pid}, user {user}{unit})")).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:24B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 4242 1 0 100 0 0 10 0\n\
   1: 0100007F:24B8 0100007F:B1C2 01 00000000:00000000 03:0000018A 00000000     0        0 0 3 0\n\
   2: 0100007F:24B9 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 77 1 0 100 0 0 10 0\n";

    #[test]
    fn only_the_listening_socket_on_the_port_is_its_holder() {
        // 0x24B8 = 9400; the connection on 9400 (state 01) and the listener on 9401 are not.
        assert_eq!(
            listeners(TCP, 9400),
            vec![Listener {
                uid: 998,
                inode: 4242
            }]
        );
        assert_eq!(listeners(TCP, 9402), vec![]);
    }

    #[test]
    fn a_port_nobody_listens_on_has_no_holder() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("net")).expect("mkdir");
        std::fs::write(dir.path().join("net/tcp"), TCP).expect("write");
        assert_eq!(describe_in(dir.path(), 9402), None);
        // A holder this user cannot look into: named by its user.
        let d = describe_in(dir.path(), 9400).expect("a holder");
        assert!(d.starts_with("a process of user "), "{d}");
    }
}
