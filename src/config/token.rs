//! The API token file (`[api] token_file`): read and checked, for the API's guard on every
//! mutating request (`http/api.rs`) and for `check-config`. Reading only; it must not import
//! `http/`.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// The longest token file read; a token is a line of text, not a document.
pub const MAX_TOKEN_FILE: u64 = 4096;

/// Reads and checks the token file: readable by the agent alone (no permission for other users;
/// group read only for the agent's own group), one non-empty line.
pub fn load_token(path: &Path) -> Result<Vec<u8>, String> {
    // Opened once, and every check made on what was opened: a FIFO or device is refused before
    // anything waits on it, and the file cannot be swapped between the checks and the read.
    let file = crate::bounded::open(path, crate::bounded::Limits::provided(MAX_TOKEN_FILE))
        .map_err(|e| match e.problem {
            crate::bounded::Problem::TooLarge { size, .. } => format!(
                "API token file {} is {size} bytes; a token is one line (at most \
                 {MAX_TOKEN_FILE} bytes)",
                path.display()
            ),
            _ => format!("API token file {e}"),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("API token file {}: {e}", path.display()))?;
    // Whoever owns the file can rewrite the token (and its mode): only root and the agent's
    // own user may.
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(format!(
            "API token file {} is owned by uid {}, neither root nor the agent's user (uid \
             {euid}): that user could change the token; the API stays off until it is fixed \
             (chown root {} or chown the agent's user)",
            path.display(),
            meta.uid(),
            path.display()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    // Group read is fine when the group is the agent's own (root:gpu-steward 0640, the packaged
    // layout); any other group or other-user permission lets someone else use the API.
    let own_group = meta.gid() == nix::unistd::getegid().as_raw();
    let group_ok = mode & 0o070 == 0 || (mode & 0o070 == 0o040 && own_group);
    if mode & 0o007 != 0 || !group_ok {
        return Err(format!(
            "API token file {} has mode {mode:03o}: other users may read it; the API stays off \
             until it is fixed (chmod 600 {}, or 640 with the agent's own group)",
            path.display(),
            path.display()
        ));
    }
    // A regular file (checked at open): the read does not block. One byte over the limit is
    // enough to see a file that grew after the open.
    let mut text = Vec::new();
    file.take(MAX_TOKEN_FILE + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("API token file {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_TOKEN_FILE {
        return Err(format!(
            "API token file {} is over {MAX_TOKEN_FILE} bytes; a token is one line",
            path.display()
        ));
    }
    let token = text.trim_ascii();
    if token.is_empty() {
        return Err(format!(
            "API token file {} is empty; write a random token into it, e.g. \
             `openssl rand -hex 32 > {}`",
            path.display(),
            path.display()
        ));
    }
    Ok(token.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_token_file_others_can_read_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        fs::write(&path, "s3cret\n").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = load_token(&path).expect_err("world readable");
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o660)).expect("chmod");
        assert!(load_token(&path)
            .expect_err("group writable")
            .contains("mode 660"));
        // Created by this process: its group is the agent's own, so group read is allowed.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).expect("chmod");
        assert_eq!(load_token(&path).expect("own group"), b"s3cret");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(load_token(&path).expect("ok"), b"s3cret");
        fs::write(&path, " \n").expect("write");
        assert!(load_token(&path).expect_err("empty").contains("empty"));
        let e = load_token(&dir.path().join("missing")).expect_err("missing");
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn a_fifo_or_a_link_to_dev_zero_as_token_file_is_refused_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let e = load_token(&fifo).expect_err("fifo");
        assert!(e.contains("is a FIFO, not a regular file"), "{e}");
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        let e = load_token(&zero).expect_err("device");
        assert!(
            e.contains("is a character device, not a regular file"),
            "{e}"
        );
        let big = dir.path().join("big");
        fs::write(&big, vec![b'x'; 4097]).expect("write");
        fs::set_permissions(&big, fs::Permissions::from_mode(0o600)).expect("chmod");
        let e = load_token(&big).expect_err("big");
        assert!(
            e.contains("4097 bytes") && e.contains("at most 4096"),
            "{e}"
        );
    }

    #[test]
    fn a_token_file_owned_by_another_user_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        fs::write(&path, "s3cret\n").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        let other = nix::unistd::Uid::from_raw(nix::unistd::geteuid().as_raw().max(1) + 4242);
        match nix::unistd::chown(&path, Some(other), None) {
            Ok(()) => {}
            // Only root can give a file away; as another user the case cannot be made here.
            Err(nix::errno::Errno::EPERM) => return,
            Err(e) => panic!("chown: {e}"),
        }
        let e = load_token(&path).expect_err("owned by another user");
        assert!(e.contains("owned by uid") && e.contains("chown"), "{e}");
    }
}
