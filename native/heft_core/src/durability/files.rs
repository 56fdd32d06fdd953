//! How Heft creates and opens the files it owns: never through a symbolic
//! link, temporary files under unpredictable names created exclusively
//! (`O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC`, mode 0600 unless asked
//! otherwise), written, fsynced and renamed into place, and directories
//! that only their owner can enter (docs/persistence-format.md, "Files").

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of every file Heft writes unless the caller asks for another.
pub const FILE_MODE: u32 = 0o600;

/// `n` random bytes from the kernel (getrandom(2)).
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: the pointer and length describe the unfilled rest of
        // `buf`, which lives across the call; getrandom writes at most that.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), N - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(buf)
}

/// Opens an existing file for reading, refusing a symbolic link (ELOOP).
pub fn open_read(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Opens an existing file for reading and writing, refusing a symbolic
/// link.
pub fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Reads a whole file, refusing a symbolic link.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    io::Read::read_to_end(&mut open_read(path)?, &mut out)?;
    Ok(out)
}

/// Creates `path`, which must not exist (a link planted there is not
/// followed: `EEXIST`), with `mode`.
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(mode)
        .open(path)
}

/// A temporary file next to `dest`: `<dest>.tmp-<16 random hex digits>`,
/// created exclusively with `mode` (the umask may clear bits of it; the
/// mode is then set exactly with fchmod). Removed when dropped unless
/// [`Temp::commit`]ted.
pub struct Temp {
    file: Option<File>,
    path: PathBuf,
    dest: PathBuf,
}

/// The prefix of the temporary files made for `name`.
pub fn temp_prefix(name: &str) -> String {
    format!("{name}.tmp-")
}

impl Temp {
    /// Creates the temporary file for `dest`.
    pub fn new(dest: &Path, mode: u32) -> io::Result<Temp> {
        let name = dest
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or(io::ErrorKind::InvalidInput)?;
        let dir = dest.parent().unwrap_or(Path::new("."));
        loop {
            let r: [u8; 8] = random_bytes()?;
            let path = dir.join(format!(
                "{}{:016x}",
                temp_prefix(name),
                u64::from_le_bytes(r)
            ));
            match create_new(&path, mode) {
                Ok(file) => {
                    let temp = Temp {
                        file: Some(file),
                        path,
                        dest: dest.to_path_buf(),
                    };
                    temp.file()
                        .set_permissions(fs::Permissions::from_mode(mode))?;
                    return Ok(temp);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The open file.
    pub fn file(&self) -> &File {
        self.file
            .as_ref()
            .expect("a temporary file is open until committed")
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// fsyncs the file (if `sync`), renames it to its destination (which
    /// replaces a link there, not its target) and, if `sync`, fsyncs the
    /// directory.
    pub fn commit(mut self, sync: bool) -> io::Result<()> {
        let file = self.file.take().expect("committed once");
        if sync {
            file.sync_all()?;
        }
        drop(file);
        fs::rename(&self.path, &self.dest)?;
        self.path = PathBuf::new();
        if sync {
            sync_dir(self.dest.parent().unwrap_or(Path::new(".")))?;
        }
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Writes `bytes` to `dest` atomically: a [`Temp`] file, fsync, rename,
/// fsync of the directory (all skipped syncs if not `sync`).
pub fn write_atomic(dest: &Path, bytes: &[u8], sync: bool) -> io::Result<()> {
    let t = Temp::new(dest, FILE_MODE)?;
    t.file().write_all(bytes)?;
    t.commit(sync)
}

/// fsyncs a directory, so entries created or renamed in it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?
        .sync_all()
}

/// Makes sure `dir` (an existing directory) is this user's own and closed
/// to everyone else: a directory with group or other permission bits is
/// tightened to 0700; one owned by another user (or not a directory: a
/// link to one is followed, as for any path the caller names) is refused
/// with `EPERM`.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    let d = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?;
    let meta = d.metadata()?;
    // SAFETY: geteuid has no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    if meta.mode() & 0o077 != 0 {
        // SAFETY: fchmod acts on the descriptor `d` keeps open.
        if unsafe { libc::fchmod(d.as_raw_fd(), 0o700) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("heft-files-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn temp_names_are_unpredictable_and_files_private() {
        let d = dir("temp");
        let a = Temp::new(&d.join("x"), FILE_MODE).unwrap();
        let b = Temp::new(&d.join("x"), FILE_MODE).unwrap();
        assert_ne!(a.path(), b.path());
        let mode = fs::metadata(a.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let p = a.path().to_path_buf();
        drop(a);
        assert!(!p.exists(), "an uncommitted temporary file is removed");
        b.commit(true).unwrap();
        assert!(d.join("x").exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_link_at_the_destination_is_replaced_not_followed() {
        let d = dir("link");
        let victim = d.join("victim");
        fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("dest")).unwrap();
        write_atomic(&d.join("dest"), b"new", true).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert_eq!(fs::read(d.join("dest")).unwrap(), b"new");
        assert!(!fs::symlink_metadata(d.join("dest")).unwrap().is_symlink());
        assert!(open_read(&{
            std::os::unix::fs::symlink(&victim, d.join("l2")).unwrap();
            d.join("l2")
        })
        .is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_open_to_others_is_tightened() {
        let d = dir("mode");
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        private_dir(&d).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        fs::remove_dir_all(&d).unwrap();
    }
}
