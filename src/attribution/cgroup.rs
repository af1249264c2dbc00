//! Who a process belongs to, read from its `/proc/<pid>/cgroup` text: container id (containerd,
//! CRI-O, Docker), Kubernetes pod UID, systemd unit and Slurm job id.
//!
//! Pure string parsing with no I/O, so that every runtime's path layout is a unit test. Both
//! cgroup v2 (`0::/path`) and v1 (`N:controllers:/path`, one line per hierarchy) are read; the
//! first path that yields a value wins for each attribute.

pub use crate::snapshot::Attribution;

/// Reads every attribute that the cgroup paths in `text` reveal.
pub fn parse(text: &str) -> Attribution {
    let mut a = Attribution::default();
    for line in text.lines() {
        // `hierarchy-ID:controller-list:path`; the path may itself contain ':'.
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let found = parse_path(path);
        a.container_id = a.container_id.or(found.container_id);
        a.pod_uid = a.pod_uid.or(found.pod_uid);
        a.slurm_job = a.slurm_job.or(found.slurm_job);
        a.systemd_unit = a.systemd_unit.or(found.systemd_unit);
    }
    if a.container_id.is_some() {
        // The unit of a container is its runtime scope (`cri-containerd-<id>.scope`), which
        // says nothing the container id does not.
        a.systemd_unit = None;
    }
    a
}

fn parse_path(path: &str) -> Attribution {
    let mut a = Attribution::default();
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for c in &components {
        if a.pod_uid.is_none() {
            a.pod_uid = pod_uid(c);
        }
        if let Some(id) = container_id(c) {
            a.container_id = Some(id);
        }
        if let Some(job) = c.strip_prefix("job_") {
            if !job.is_empty() && job.chars().all(|ch| ch.is_ascii_digit()) {
                a.slurm_job = Some(job.to_string());
            }
        }
        if c.ends_with(".service") || c.ends_with(".scope") {
            a.systemd_unit = Some((*c).to_string());
        }
    }
    // cgroupfs driver: `/kubepods/burstable/pod<uid>/<64 hex>` (the runtime is not in the path)
    // and Docker's `/docker/<64 hex>`.
    if a.container_id.is_none() {
        if let [.., parent, last] = components.as_slice() {
            if is_container_hex(last) {
                a.container_id = Some(if *parent == "docker" {
                    format!("docker://{last}")
                } else {
                    (*last).to_string()
                });
            }
        }
    }
    a
}

/// `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid(component: &str) -> Option<String> {
    // `rfind`: "kubepods" itself contains "pod"; a UID (hex and separators) cannot.
    let start = component.rfind("pod")? + 3;
    let rest = &component[start..];
    let raw = rest.strip_suffix(".slice").unwrap_or(rest);
    let uid = raw.replace('_', "-");
    let valid = uid.len() == 36
        && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && uid.matches('-').count() == 4;
    valid.then_some(uid)
}

/// The runtimes' systemd scopes: `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `docker-<id>.scope` (CRI-O's `crio-conmon-<id>.scope` is the monitor, not the container).
fn container_id(component: &str) -> Option<String> {
    let scope = component.strip_suffix(".scope")?;
    let (runtime, id) = [
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("docker-", "docker"),
    ]
    .iter()
    .find_map(|(prefix, runtime)| Some((*runtime, scope.strip_prefix(prefix)?)))?;
    is_container_hex(id).then(|| format!("{runtime}://{id}"))
}

fn is_container_hex(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a6b1c9d8e7f60a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718";
    const UID: &str = "8c2d1e5f-1234-4a5b-9c8d-0e1f2a3b4c5d";

    #[test]
    fn containerd_under_the_systemd_driver_v2() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope\n",
            UID.replace('-', "_")
        );
        let a = parse(&text);
        assert_eq!(a.pod_uid.as_deref(), Some(UID));
        assert_eq!(a.container_id, Some(format!("containerd://{ID}")));
        assert_eq!(a.systemd_unit, None);
    }

    #[test]
    fn crio_v2_ignores_conmon() {
        let text = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/crio-{ID}.scope\n",
            UID.replace('-', "_")
        );
        let a = parse(&text);
        assert_eq!(a.container_id, Some(format!("cri-o://{ID}")));
        assert_eq!(a.pod_uid.as_deref(), Some(UID));
        let conmon = parse(&format!("0::/kubepods.slice/crio-conmon-{ID}.scope\n"));
        assert_eq!(conmon.container_id, None);
    }

    #[test]
    fn cgroupfs_driver_v1() {
        let text = format!(
            "12:memory:/kubepods/besteffort/pod{UID}/{ID}\n11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{ID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{ID}\n"
        );
        let a = parse(&text);
        assert_eq!(a.pod_uid.as_deref(), Some(UID));
        assert_eq!(a.container_id.as_deref(), Some(ID));
    }

    #[test]
    fn docker_both_drivers() {
        let a = parse(&format!("0::/system.slice/docker-{ID}.scope\n"));
        assert_eq!(a.container_id, Some(format!("docker://{ID}")));
        assert_eq!(a.systemd_unit, None);
        let a = parse(&format!("4:devices:/docker/{ID}\n"));
        assert_eq!(a.container_id, Some(format!("docker://{ID}")));
        assert_eq!(a.pod_uid, None);
    }

    #[test]
    fn systemd_units_and_sessions() {
        let a = parse("0::/system.slice/ollama.service\n");
        assert_eq!(a.systemd_unit.as_deref(), Some("ollama.service"));
        let a = parse("0::/user.slice/user-1000.slice/session-3.scope\n");
        assert_eq!(a.systemd_unit.as_deref(), Some("session-3.scope"));
        assert_eq!(a.container_id, None);
    }

    #[test]
    fn slurm_v1_and_v2() {
        let a = parse("7:devices:/slurm/uid_1000/job_4242/step_0/task_0\n");
        assert_eq!(a.slurm_job.as_deref(), Some("4242"));
        let a = parse("0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n");
        assert_eq!(a.slurm_job.as_deref(), Some("77"));
        assert_eq!(a.systemd_unit.as_deref(), Some("slurmstepd.scope"));
    }

    #[test]
    fn nothing_to_say() {
        assert_eq!(parse("0::/\n"), Attribution::default());
        assert_eq!(parse("garbage"), Attribution::default());
        assert_eq!(parse("0::/podcast.service\n").pod_uid, None);
    }
}
