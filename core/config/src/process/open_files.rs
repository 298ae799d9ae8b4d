//! The process's open-file limit: the DEN's runners and the DCI's connections each need a
//! descriptor, and the usual 1024 soft limit is far below what the hard limit allows.

/// Raises the soft open-file limit to the hard one: each running task holds two pipe ends to
/// its runner, and each HTTP connection one socket; a 1024 soft limit (systemd's default)
/// would cap a node near 500 tasks. Returns the limit now in force.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(std::io::Error::from)?;
    }
    Ok(hard.max(soft))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_file_limit_rises_to_the_hard_limit() {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let read = || getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| e.to_string());
        let (_, hard) = read().unwrap();
        // Lowering the soft limit is always allowed; half the hard limit is plenty for the
        // other tests in this process meanwhile.
        setrlimit(Resource::RLIMIT_NOFILE, hard / 2, hard).unwrap();
        assert_eq!(read().unwrap().0, hard / 2);
        let limit = raise_open_file_limit().map_err(|e| e.to_string());
        assert_eq!(limit, Ok(hard));
        assert_eq!(read().unwrap(), (hard, hard));
    }
}
