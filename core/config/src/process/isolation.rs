//! Process hygiene that keeps plugins out of their runner's and node's secrets: no `/proc`
//! reading or ptrace by same-user processes (non-dumpable), no descriptor kept across exec.

use std::io;
use std::os::fd::RawFd;

use nix::libc;

/// The lowest descriptor that is not stdin, stdout or stderr.
const FIRST_ABOVE_STDERR: u32 = 3;

/// Descriptor ranges `[first, last]` to mark close-on-exec, worked out before a fork so the
/// child only has to make system calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloexecRanges([Option<(u32, u32)>; 2]);

impl CloexecRanges {
    /// Every descriptor above stderr except `keep` (a descriptor the child is meant to have).
    pub fn above_stderr_except(keep: Option<RawFd>) -> CloexecRanges {
        let keep = keep
            .and_then(|k| u32::try_from(k).ok())
            .filter(|k| *k >= FIRST_ABOVE_STDERR);
        match keep {
            None => CloexecRanges([Some((FIRST_ABOVE_STDERR, u32::MAX)), None]),
            Some(k) => CloexecRanges([
                (k > FIRST_ABOVE_STDERR).then(|| (FIRST_ABOVE_STDERR, k - 1)),
                (k < u32::MAX).then(|| (k + 1, u32::MAX)),
            ]),
        }
    }

    /// The ranges, in order.
    pub fn ranges(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.0.iter().flatten().copied()
    }

    /// Marks the ranges close-on-exec with `close_range(2)`. Async-signal-safe (no allocation,
    /// system calls only), so it may run in `pre_exec`. Returns Ok(false) on a kernel without
    /// `close_range` or its CLOEXEC flag (before 5.11): `harden_process` has then already
    /// marked every descriptor inherited at start, and ours are opened close-on-exec.
    pub fn apply(&self) -> io::Result<bool> {
        for (first, last) in self.ranges() {
            // SAFETY: close_range takes three integers and only changes descriptor flags.
            let done = unsafe {
                libc::syscall(
                    libc::SYS_close_range,
                    first as libc::c_uint,
                    last as libc::c_uint,
                    libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
                )
            };
            if done < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::ENOSYS | libc::EINVAL) => Ok(false),
                    _ => Err(e),
                };
            }
        }
        Ok(true)
    }
}

/// To run first in `main`, before any thread starts. A non-dumpable process's `/proc/<pid>`
/// files (environ, fd/, mem, maps) belong to root and ptrace is refused, so a plugin of the
/// same user cannot read its environment, descriptors or memory; `cmdline` stays readable
/// whatever this says (Linux's rule), so nothing secret may go on a command line. Every
/// descriptor inherited above stderr (a shell's stray files, a parent's pipes) is marked
/// close-on-exec so no child of ours gets it.
pub fn harden_process() -> Result<(), String> {
    nix::sys::prctl::set_dumpable(false)
        .map_err(|e| format!("could not make this process non-dumpable: {e}"))?;
    mark_inherited_cloexec()
        .map_err(|e| format!("could not mark inherited descriptors close-on-exec: {e}"))
}

/// Marks every open descriptor above stderr close-on-exec, descriptor by descriptor through
/// `/proc/self/fd` where the kernel has no `close_range`.
fn mark_inherited_cloexec() -> io::Result<()> {
    if CloexecRanges::above_stderr_except(None).apply()? {
        return Ok(());
    }
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open
        .into_iter()
        .filter(|fd| *fd >= FIRST_ABOVE_STDERR as RawFd)
    {
        // EBADF: the listing's own descriptor, closed since.
        // SAFETY: F_SETFD changes one descriptor's flags and touches no memory.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_everything_above_stderr_but_the_kept_descriptor() {
        let all = |keep| {
            CloexecRanges::above_stderr_except(keep)
                .ranges()
                .collect::<Vec<_>>()
        };
        assert_eq!(all(None), [(3, u32::MAX)]);
        // The answer pipe is fd 3: nothing below it to mark.
        assert_eq!(all(Some(3)), [(4, u32::MAX)]);
        assert_eq!(all(Some(7)), [(3, 6), (8, u32::MAX)]);
        // stdio and nonsense are not "kept": they are outside the ranges anyway.
        assert_eq!(all(Some(1)), [(3, u32::MAX)]);
        assert_eq!(all(Some(-1)), [(3, u32::MAX)]);
    }

    #[test]
    fn applying_marks_an_inherited_descriptor_close_on_exec() {
        let file = std::fs::File::open("/proc/self/status").expect("open");
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let flags = |fd| unsafe { libc::fcntl(fd, libc::F_GETFD) };
        // As a shell's stray descriptor would be.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
        assert_eq!(flags(fd) & libc::FD_CLOEXEC, 0);
        mark_inherited_cloexec().expect("mark");
        assert_eq!(flags(fd) & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }
}
