//! The data directory's exclusive lock: one `dpledger serve` per data directory.
//!
//! Two servers on one embedded store would each keep their own ledgers in
//! memory and answer from them; the log stays correct (the database refuses a
//! step stored twice) but each process's answers could lag the other's writes.
//! So `serve` takes an exclusive `flock` on `<data-dir>/dpledger.lock`, writes its
//! pid there, and a second `serve` on the same directory refuses to start,
//! naming the first one's pid. The kernel releases the lock when the process
//! exits, however it exits, so a crash never leaves a stale lock behind.

use anyhow::Context;
use std::io::{Read, Seek, Write};
use std::path::Path;

/// Name of the lock file in the data directory.
pub const LOCK_FILE: &str = "dpledger.lock";

/// The held lock: released when dropped (or when the process exits).
#[derive(Debug)]
pub struct DataDirLock {
    _file: std::fs::File,
}

/// Take the data directory's lock, creating the directory and the file (0600)
/// when missing; refuse with the holder's pid when another process has it.
pub fn lock_data_dir(data_dir: &Path) -> anyhow::Result<DataDirLock> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let path = data_dir.join(LOCK_FILE);
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(&path)
        .with_context(|| format!("opening the lock file {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a file descriptor this function owns.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() {
                    "another process".to_string()
                } else {
                    format!("another dpledger process (pid {holder})")
                };
                anyhow::bail!(
                    "the data directory {} is in use by {who}: one server per data directory \
                     (lock file {}); stop it first, or give this server another --data-dir",
                    data_dir.display(),
                    path.display()
                );
            }
            return Err(error).with_context(|| format!("locking {}", path.display()));
        }
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    file.flush()?;
    Ok(DataDirLock { _file: file })
}
