//! Writes that never leave a half-written file behind.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to a temporary file beside `path`, syncs it, renames it into place and syncs
/// the folder: a kill or a power loss leaves the old file or the new one, never a truncated one.
/// On an error the temporary file is removed (a failed checkpoint write on a full disk must not
/// leave gigabytes behind). Temporary names are unique per write, so concurrent writers of one
/// path (threads or processes) never share one.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} has no file name", path.display())))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir)
}

/// Removes the temporary files that writes killed in mid-write left in `dir` (not its
/// subfolders). Only for a folder no live process writes to, e.g. one whose lock is held.
pub fn remove_stale_temps(dir: &Path) -> std::io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.contains(".tmp") && entry.file_type()?.is_file() {
            std::fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Creates the folder `dir` (and its parents) and syncs the folder holding it, so that a power
/// loss cannot drop the new folder while later changes beside it persist.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

/// Makes a rename, a creation or a removal in `dir` durable. Only Unix can open a folder to sync
/// it.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("coupled-qk-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp"))
            .collect()
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file_and_the_old_content() {
        let dir = temp_dir("fail");
        // A folder where the file should go: the final rename fails.
        let target = dir.join("results.json");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), b"old").unwrap();
        let err = write(&target, b"new").unwrap_err();
        assert_ne!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
        assert_eq!(leftovers(&dir), Vec::<String>::new());
        assert_eq!(std::fs::read(target.join("keep")).unwrap(), b"old");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn concurrent_writers_each_leave_a_whole_file() {
        let dir = temp_dir("race");
        let path = dir.join("state.json");
        std::thread::scope(|scope| {
            for t in 0..4u8 {
                let path = &path;
                scope.spawn(move || {
                    for _ in 0..25 {
                        write(path, &[t; 4096]).unwrap();
                    }
                });
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 4096);
        assert!(bytes.iter().all(|&b| b == bytes[0]), "a torn file");
        assert_eq!(leftovers(&dir), Vec::<String>::new());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
