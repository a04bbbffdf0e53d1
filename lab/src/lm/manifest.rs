//! A checkpoint's manifest, `manifest.json`: the size and XXH64 digest of every file the
//! checkpoint holds, written last so that it also marks the checkpoint complete.
//!
//! A flipped bit in a record decodes as a different weight without any error, so a checkpoint is
//! read only through [`CheckedFolder`], which compares each file's bytes with the manifest
//! before they are decoded. The manifest carries a digest of its own entries, and must be
//! byte-for-byte the text this module writes, so that damage to it is named as such rather than
//! blamed on the file whose entry it hit.

use super::TrainError;
use crate::atomic;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use twox_hash::XxHash64;

/// The manifest's file name.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Version of the manifest's layout.
const FORMAT: u32 = 1;
/// The files a checkpoint has, and so the only names a manifest may list: a name from anywhere
/// else (`/dev/zero`, `../config.json`) would make a check read files outside the checkpoint.
pub const CHECKPOINT_FILES: [&str; 3] = ["model.mpk", "optimizer.mpk", "state.json"];

/// What is wrong with a checkpoint file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    /// The manifest lists it, but it is not there.
    #[error("missing")]
    Missing,
    /// Its length is not the one recorded.
    #[error("truncated or corrupt: it has {found} bytes where its manifest records {recorded}")]
    Size {
        /// The size the manifest records.
        recorded: u64,
        /// The size on disk.
        found: u64,
    },
    /// Its bytes are not the ones recorded.
    #[error("corrupt: its XXH64 digest is {found} where its manifest records {recorded}")]
    Digest {
        /// The digest the manifest records (hex).
        recorded: String,
        /// The digest of the bytes on disk (hex).
        found: String,
    },
    /// The manifest itself does not parse, does not match its own digest, or lacks an entry.
    #[error("corrupt: {0}")]
    Manifest(String),
    /// It cannot be read (the operating system's error: permissions, an I/O error, a folder
    /// where the file should be).
    #[error("unreadable ({0})")]
    Unreadable(String),
    /// It does not decode (a checkpoint written before manifests, whose damage only shows here).
    #[error("truncated or corrupt: it does not decode as a checkpoint {0}")]
    Undecodable(&'static str),
}

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Entry {
    name: String,
    size: u64,
    xxh64: String,
}

/// What the digest of the manifest covers.
#[derive(Serialize)]
struct Body<'a> {
    format: u32,
    files: &'a [Entry],
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    files: Vec<Entry>,
    /// XXH64 of the compact JSON of `format` and `files`.
    checksum: String,
}

fn digest(bytes: &[u8]) -> String {
    format!("{:016x}", XxHash64::oneshot(0, bytes))
}

impl Manifest {
    fn new(files: Vec<Entry>) -> Self {
        let checksum = Self::checksum_of(FORMAT, &files);
        Manifest {
            format: FORMAT,
            files,
            checksum,
        }
    }

    fn checksum_of(format: u32, files: &[Entry]) -> String {
        digest(&serde_json::to_vec(&Body { format, files }).expect("a manifest serialises"))
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a manifest serialises");
        bytes.push(b'\n');
        bytes
    }

    /// Parses and checks a manifest's bytes.
    fn parse(bytes: &[u8]) -> Result<Self, String> {
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| format!("it does not parse ({e})"))?;
        if manifest.format != FORMAT {
            return Err(format!(
                "manifest format {} (this build reads {FORMAT})",
                manifest.format
            ));
        }
        if Self::checksum_of(manifest.format, &manifest.files) != manifest.checksum {
            return Err("its entries do not match its own checksum".into());
        }
        for (i, entry) in manifest.files.iter().enumerate() {
            if !CHECKPOINT_FILES.contains(&entry.name.as_str()) {
                return Err(format!(
                    "it lists `{}`, which is no file of a checkpoint (only {})",
                    entry.name,
                    CHECKPOINT_FILES.join(", ")
                ));
            }
            if manifest.files[..i].iter().any(|e| e.name == entry.name) {
                return Err(format!("it lists `{}` twice", entry.name));
            }
        }
        // Catches what parsing forgives (a space turned into a tab or a newline).
        if manifest.to_bytes() != bytes {
            return Err("it is not the text that was written".into());
        }
        Ok(manifest)
    }
}

/// Writes the manifest of `files` (name and content, as written into `dir`), atomically.
pub(super) fn write_manifest(dir: &Path, files: &[(&str, &[u8])]) -> Result<(), TrainError> {
    let entries = files
        .iter()
        .map(|(name, bytes)| Entry {
            name: (*name).to_string(),
            size: bytes.len() as u64,
            xxh64: digest(bytes),
        })
        .collect();
    let path = dir.join(MANIFEST_FILE);
    atomic::write(&path, &Manifest::new(entries).to_bytes())
        .map_err(|e| TrainError::io("write", path, e))
}

/// Whether a checkpoint's files could be checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Every file matches its manifest.
    Verified,
    /// The checkpoint has no manifest (it was written before checkpoints had one): its files
    /// cannot be checked, only decoded.
    NoManifest,
}

/// A checkpoint folder opened for reading: each file read through it has been compared with the
/// manifest (where there is one).
pub(super) struct CheckedFolder {
    dir: PathBuf,
    manifest: Option<Manifest>,
    /// The files read (and so checked) so far.
    checked: Vec<String>,
}

impl CheckedFolder {
    /// Reads and checks the manifest of `dir`; a folder without one opens unverified.
    pub(super) fn open(dir: &Path) -> Result<Self, TrainError> {
        let path = dir.join(MANIFEST_FILE);
        let manifest =
            match std::fs::read(&path) {
                Ok(bytes) => Some(Manifest::parse(&bytes).map_err(|message| {
                    TrainError::CheckpointCorrupt {
                        path: path.clone(),
                        damage: Damage::Manifest(message),
                    }
                })?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(unreadable(path, &e)),
            };
        Ok(CheckedFolder {
            dir: dir.to_path_buf(),
            manifest,
            checked: Vec::new(),
        })
    }

    /// Whether the folder has a manifest to check against.
    pub(super) fn verification(&self) -> Verification {
        match self.manifest {
            Some(_) => Verification::Verified,
            None => Verification::NoManifest,
        }
    }

    /// The bytes of the file `name`, once they match the manifest.
    pub(super) fn read(&mut self, name: &str) -> Result<Vec<u8>, TrainError> {
        let path = self.dir.join(name);
        let corrupt = |path: PathBuf, damage| TrainError::CheckpointCorrupt { path, damage };
        let entry = match &self.manifest {
            None => None,
            Some(manifest) => Some(
                manifest
                    .files
                    .iter()
                    .find(|e| e.name == name)
                    .cloned()
                    .ok_or_else(|| {
                        corrupt(
                            self.dir.join(MANIFEST_FILE),
                            Damage::Manifest(format!("it does not list {name}")),
                        )
                    })?,
            ),
        };
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt(path, Damage::Missing));
            }
            Err(e) => return Err(unreadable(path, &e)),
        };
        if let Some(entry) = entry {
            if bytes.len() as u64 != entry.size {
                return Err(corrupt(
                    path,
                    Damage::Size {
                        recorded: entry.size,
                        found: bytes.len() as u64,
                    },
                ));
            }
            let found = digest(&bytes);
            if found != entry.xxh64 {
                return Err(corrupt(
                    path,
                    Damage::Digest {
                        recorded: entry.xxh64,
                        found,
                    },
                ));
            }
        }
        self.checked.push(name.to_string());
        Ok(bytes)
    }

    /// Checks every file of the manifest not read yet.
    pub(super) fn check_rest(&mut self) -> Result<Verification, TrainError> {
        let rest: Vec<String> = self
            .manifest
            .iter()
            .flat_map(|m| &m.files)
            .map(|e| e.name.clone())
            .filter(|name| !self.checked.contains(name))
            .collect();
        for name in rest {
            self.read(&name)?;
        }
        Ok(self.verification())
    }
}

/// A checkpoint file the system cannot read: damage like any other, so that a resume falls back.
fn unreadable(path: PathBuf, e: &std::io::Error) -> TrainError {
    TrainError::CheckpointCorrupt {
        path,
        damage: Damage::Unreadable(e.to_string()),
    }
}

/// Checks every file of the checkpoint in `dir` against its manifest.
///
/// # Errors
/// [`TrainError::CheckpointCorrupt`] naming the first file that does not match (or the manifest),
/// and I/O errors.
pub fn verify_checkpoint(dir: &Path) -> Result<Verification, TrainError> {
    CheckedFolder::open(dir)?.check_rest()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("coupled-qk-manifest-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write_files(dir: &Path) {
        let files: [(&str, &[u8]); 2] =
            [("model.mpk", b"0123456789"), ("state.json", b"{\"x\": 1}")];
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        write_manifest(dir, &files).unwrap();
    }

    fn damage(dir: &Path) -> (PathBuf, Damage) {
        match verify_checkpoint(dir) {
            Err(TrainError::CheckpointCorrupt { path, damage }) => (path, damage),
            other => panic!("expected CheckpointCorrupt, got {other:?}"),
        }
    }

    #[test]
    fn intact_files_verify_and_a_folder_without_manifest_is_unverified() {
        let dir = folder("intact");
        write_files(&dir);
        assert_eq!(verify_checkpoint(&dir).unwrap(), Verification::Verified);
        std::fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
        assert_eq!(verify_checkpoint(&dir).unwrap(), Verification::NoManifest);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn each_kind_of_damage_names_its_file() {
        let dir = folder("damage");
        write_files(&dir);
        std::fs::write(dir.join("model.mpk"), b"0123456780").unwrap();
        let (path, found) = damage(&dir);
        assert_eq!(path, dir.join("model.mpk"));
        assert!(matches!(found, Damage::Digest { .. }), "{found:?}");

        write_files(&dir);
        std::fs::write(dir.join("state.json"), b"{\"x\"").unwrap();
        assert_eq!(
            damage(&dir),
            (
                dir.join("state.json"),
                Damage::Size {
                    recorded: 8,
                    found: 4
                }
            )
        );

        write_files(&dir);
        std::fs::remove_file(dir.join("model.mpk")).unwrap();
        assert_eq!(damage(&dir), (dir.join("model.mpk"), Damage::Missing));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn any_change_to_the_manifest_is_its_own_damage() {
        let dir = folder("manifest");
        write_files(&dir);
        let path = dir.join(MANIFEST_FILE);
        let good = std::fs::read(&path).unwrap();
        // Every byte changed in turn: a digit of a size or digest, a quote, a space turned into
        // a tab (JSON that parses to the same value).
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] = if bad[at] == b' ' {
                b'\t'
            } else {
                bad[at] ^ 0x01
            };
            std::fs::write(&path, &bad).unwrap();
            let (named, found) = damage(&dir);
            assert_eq!(named, path, "byte {at}");
            assert!(matches!(found, Damage::Manifest(_)), "byte {at}: {found:?}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A manifest rewritten with a consistent checksum but other entries: what its writer could
    /// not have written.
    fn forge(dir: &Path, files: Vec<Entry>) {
        std::fs::write(dir.join(MANIFEST_FILE), Manifest::new(files).to_bytes()).unwrap();
    }

    #[test]
    fn a_manifest_names_only_the_files_of_a_checkpoint() {
        let dir = folder("forged");
        write_files(&dir);
        let entry = |name: &str| Entry {
            name: name.to_string(),
            size: 0,
            xxh64: digest(b""),
        };
        let outside = ["/dev/zero", "../config.json", "sub/model.mpk", ".lock", ""];
        for name in outside {
            forge(&dir, vec![entry(name)]);
            let (path, found) = damage(&dir);
            assert_eq!(path, dir.join(MANIFEST_FILE), "{name}");
            assert!(
                matches!(&found, Damage::Manifest(m) if m.contains("no file of a checkpoint")),
                "{name}: {found:?}"
            );
        }
        forge(&dir, vec![entry("state.json"), entry("state.json")]);
        assert!(matches!(damage(&dir).1, Damage::Manifest(m) if m.contains("twice")));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_unreadable_file_is_damage_naming_the_system_error() {
        let dir = folder("unreadable");
        write_files(&dir);
        // A folder where the file should be: unreadable even to root, which ignores modes.
        std::fs::remove_file(dir.join("model.mpk")).unwrap();
        std::fs::create_dir(dir.join("model.mpk")).unwrap();
        let (path, found) = damage(&dir);
        assert_eq!(path, dir.join("model.mpk"));
        assert!(matches!(found, Damage::Unreadable(_)), "{found:?}");
        assert!(found.to_string().starts_with("unreadable ("), "{found}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
