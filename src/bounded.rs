//! Reading a file that someone else may have written: bounded in size and time, never a
//! symlink where the agent also writes the file, never anything but a regular file.
//!
//! Every file the agent reads that another user or process can put in place (CDI specs, the
//! MIG intent record, the audit log and journal read back, the accounting state, rule files, the
//! web config, the API token) goes through [`read`] or [`open`]. A symlink to `/dev/zero`, a FIFO,
//! a directory or a gigabyte file gets an [`Error`] that names the path, the limit and what to
//! do, instead of an out-of-memory kill or a start that hangs.
//!
//! This module must not interpret what it reads: callers parse, with their own limits.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How a file may be read.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most bytes read; a larger file is refused (it is not cut short).
    pub max_bytes: u64,
    /// Reading stops with [`Problem::TooSlow`] once this has passed (checked between reads of
    /// 64 KiB: a single read the kernel never returns from cannot be interrupted).
    pub deadline: Duration,
    /// Follow a symlink at the path. `false` wherever the agent also writes the file, so that a
    /// link planted there can neither be read as ours nor make us write through it.
    pub follow_symlinks: bool,
}

impl Limits {
    /// A file the agent also writes: no symlink followed.
    pub const fn own(max_bytes: u64) -> Limits {
        Limits {
            max_bytes,
            deadline: Duration::from_secs(5),
            follow_symlinks: false,
        }
    }

    /// A file an operator or another program provides (a config, a CDI spec): symlinks are
    /// followed, as configuration management and `nvidia-ctk` make them, but the target must
    /// still be a regular file within the limits.
    pub const fn provided(max_bytes: u64) -> Limits {
        Limits {
            max_bytes,
            deadline: Duration::from_secs(5),
            follow_symlinks: true,
        }
    }
}

/// Why a file was not read.
#[derive(Debug)]
pub enum Problem {
    /// Opening or reading failed (missing file, permissions, I/O error).
    Io(io::Error),
    /// A symlink where none is followed.
    Symlink,
    /// Not a regular file: FIFO, socket, device or directory (its kind).
    NotRegular(&'static str),
    /// Larger than the limit (the size seen, the limit).
    TooLarge { size: u64, limit: u64 },
    /// Reading took longer than the deadline.
    TooSlow(Duration),
}

/// A refused read: the path and why.
#[derive(Debug)]
pub struct Error {
    pub path: PathBuf,
    pub problem: Problem,
}

impl Error {
    /// True when the file does not exist (callers often treat that as "nothing yet").
    pub fn is_not_found(&self) -> bool {
        matches!(&self.problem, Problem::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Io(e) => write!(f, "{e}"),
            Problem::Symlink => write!(
                f,
                "is a symlink, which is not followed here; replace it with a regular file"
            ),
            Problem::NotRegular(kind) => {
                write!(
                    f,
                    "is a {kind}, not a regular file; replace it with a regular file"
                )
            }
            Problem::TooLarge { size, limit } => write!(
                f,
                "is {size} bytes, over the limit of {limit} bytes; remove or shorten it"
            ),
            Problem::TooSlow(d) => write!(
                f,
                "reading took over {} ms; check the file system it is on",
                d.as_millis()
            ),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.problem)
    }
}

impl Error {
    /// The problem as an `io::Error` without the path, for errors that name the path
    /// themselves.
    pub fn into_io(self) -> io::Error {
        match self.problem {
            Problem::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e.problem {
            Problem::Io(inner) => inner.kind(),
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e.to_string())
    }
}

/// Open `path` for reading under `limits`: no symlink unless followed, a regular file only, no
/// larger than the limit. The open never blocks (a FIFO is refused, not waited on).
pub fn open(path: &Path, limits: Limits) -> Result<File, Error> {
    let err = |problem| Error {
        path: path.to_path_buf(),
        problem,
    };
    let mut flags = nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC;
    if !limits.follow_symlinks {
        flags |= nix::libc::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| {
            // O_NOFOLLOW on a symlink fails with ELOOP.
            if e.raw_os_error() == Some(nix::libc::ELOOP) && !limits.follow_symlinks {
                err(Problem::Symlink)
            } else {
                err(Problem::Io(e))
            }
        })?;
    check(&file, path, limits)?;
    Ok(file)
}

/// Open `path` for append, creating it with `mode` when missing, as [`open`] opens for reading:
/// never through a symlink, never blocking (a FIFO fails or is refused, it is not waited on), a
/// regular file only, no larger than `limits.max_bytes`. For the files the agent appends to in
/// a directory others may have put things in (the health journal).
pub fn open_append(path: &Path, mode: u32, limits: Limits) -> Result<File, Error> {
    let flags = nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC | nix::libc::O_NOFOLLOW;
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(mode)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| Error {
            path: path.to_path_buf(),
            problem: match e.raw_os_error() {
                Some(nix::libc::ELOOP) => Problem::Symlink,
                // O_WRONLY|O_NONBLOCK on a FIFO no one reads, or on a socket.
                Some(nix::libc::ENXIO) => Problem::NotRegular("FIFO or socket"),
                _ => Problem::Io(e),
            },
        })?;
    check(&file, path, limits)?;
    Ok(file)
}

/// An opened `file` is a regular file (or `/dev/null`) within the size limit.
fn check(file: &File, path: &Path, limits: Limits) -> Result<(), Error> {
    let err = |problem| Error {
        path: path.to_path_buf(),
        problem,
    };
    let meta = file.metadata().map_err(|e| err(Problem::Io(e)))?;
    let ft = meta.file_type();
    // `/dev/null` reads as empty at once and holds nothing: `--config /dev/null` ("no file,
    // built-in defaults") was valid before files were bounded and stays valid.
    let dev_null = ft.is_char_device() && meta.rdev() == nix::libc::makedev(1, 3);
    if !ft.is_file() && !dev_null {
        let kind = if ft.is_fifo() {
            "FIFO"
        } else if ft.is_socket() {
            "socket"
        } else if ft.is_char_device() {
            "character device"
        } else if ft.is_block_device() {
            "block device"
        } else if ft.is_dir() {
            "directory"
        } else {
            "special file"
        };
        return Err(err(Problem::NotRegular(kind)));
    }
    if meta.size() > limits.max_bytes {
        return Err(err(Problem::TooLarge {
            size: meta.size(),
            limit: limits.max_bytes,
        }));
    }
    Ok(())
}

/// Read the whole of `path` under `limits`.
pub fn read(path: &Path, limits: Limits) -> Result<Vec<u8>, Error> {
    let file = open(path, limits)?;
    read_from(file, path, limits)
}

/// Read the whole of `path` as UTF-8 under `limits`.
pub fn read_to_string(path: &Path, limits: Limits) -> Result<String, Error> {
    let bytes = read(path, limits)?;
    String::from_utf8(bytes).map_err(|_| Error {
        path: path.to_path_buf(),
        problem: Problem::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            "is not valid UTF-8",
        )),
    })
}

/// Read an opened file to its end, refusing more than `limits.max_bytes` (the file may grow
/// after [`open`] looked at its size) and stopping at the deadline.
fn read_from(mut file: File, path: &Path, limits: Limits) -> Result<Vec<u8>, Error> {
    let err = |problem| Error {
        path: path.to_path_buf(),
        problem,
    };
    let started = Instant::now();
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if started.elapsed() > limits.deadline {
            return Err(err(Problem::TooSlow(limits.deadline)));
        }
        let n = match file.read(&mut chunk) {
            Ok(0) => return Ok(out),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(err(Problem::Io(e))),
        };
        if out.len() as u64 + n as u64 > limits.max_bytes {
            return Err(err(Problem::TooLarge {
                size: out.len() as u64 + n as u64,
                limit: limits.max_bytes,
            }));
        }
        out.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_within_the_limit_is_read_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello").expect("write");
        assert_eq!(read(&p, Limits::own(5)).expect("read"), b"hello");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_with_both_sizes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello!").expect("write");
        let e = read(&p, Limits::own(5)).expect_err("too large");
        assert!(matches!(e.problem, Problem::TooLarge { size: 6, limit: 5 }));
        assert!(e.to_string().contains("over the limit of 5 bytes"), "{e}");
    }

    #[test]
    fn a_symlink_is_refused_where_not_followed_and_its_target_checked_where_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = dir.path().join("l");
        std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
        let e = read(&link, Limits::own(1 << 20)).expect_err("symlink");
        assert!(matches!(e.problem, Problem::Symlink), "{e}");
        let e = read(&link, Limits::provided(1 << 20)).expect_err("device");
        assert!(
            matches!(e.problem, Problem::NotRegular("character device")),
            "{e}"
        );
    }

    #[test]
    fn dev_null_reads_as_empty_and_other_devices_are_refused() {
        assert_eq!(
            read(Path::new("/dev/null"), Limits::provided(10)).expect("null"),
            b""
        );
        let e = read(Path::new("/dev/zero"), Limits::provided(10)).expect_err("zero");
        assert!(
            matches!(e.problem, Problem::NotRegular("character device")),
            "{e}"
        );
    }

    #[test]
    fn a_fifo_is_refused_at_once_instead_of_waited_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
        let e = read(&p, Limits::provided(1 << 20)).expect_err("fifo");
        assert!(matches!(e.problem, Problem::NotRegular("FIFO")), "{e}");
    }

    #[test]
    fn a_missing_file_is_reported_as_not_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = read(&dir.path().join("none"), Limits::own(10)).expect_err("missing");
        assert!(e.is_not_found());
    }
}
