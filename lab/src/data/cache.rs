//! The token cache: a split's ids in a binary file with a header, so the next run skips
//! tokenisation. A file whose header, source hash, length, checksum or ids do not match is
//! rebuilt, never used; every write goes through a temporary file renamed into place.
//!
//! Layout (little-endian): magic `CQKTOKS\n` · format version u32 · id width u32 (2 or 4) ·
//! tokenizer id (16 bytes, zero-padded) · FNV-1a 64 hash of the source text u64 · id count u64 ·
//! XXH64 (seed 0) of the ids' bytes u64 · the ids.

use super::{DataError, TokenIds};
use crate::atomic;
use std::path::PathBuf;
use twox_hash::XxHash64;

const MAGIC: &[u8; 8] = b"CQKTOKS\n";
/// The cache format's version; a file of another version is rebuilt.
pub const FORMAT_VERSION: u32 = 2;
const HEADER_LEN: usize = 8 + 4 + 4 + 16 + 8 + 8 + 8;

/// Token caches in one folder.
#[derive(Clone, Debug)]
pub struct TokenCache {
    dir: PathBuf,
}

/// Why a cache file was not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stale {
    /// No file yet.
    Missing,
    /// The file is shorter or longer than its header says, its header is unreadable, its body
    /// does not match its checksum, or it holds an id outside the vocabulary.
    Corrupt(String),
    /// Written by another tokenizer, format version or source text.
    Mismatch(String),
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stale::Missing => f.write_str("not written yet"),
            Stale::Corrupt(why) => write!(f, "damaged: {why}"),
            Stale::Mismatch(why) => write!(f, "out of date: {why}"),
        }
    }
}

impl TokenCache {
    /// Caches in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        TokenCache { dir: dir.into() }
    }

    /// The default folder: `$COUPLED_QK_CACHE`, else `$XDG_CACHE_HOME/coupled-qk`, else
    /// `~/.cache/coupled-qk`, else `.coupled-qk-cache`.
    pub fn default_dir() -> PathBuf {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        var("COUPLED_QK_CACHE")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("coupled-qk")))
            .or_else(|| var("HOME").map(|d| d.join(".cache").join("coupled-qk")))
            .unwrap_or_else(|| PathBuf::from(".coupled-qk-cache"))
    }

    /// The file of `key` (e.g. `sotu-train-gpt2`).
    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.tok"))
    }

    /// The cached ids of `key` if the file is whole (length and checksum), was written by
    /// `tokenizer` from a source with hash `source_hash`, and every id is below `vocab_size`.
    pub fn load(
        &self,
        key: &str,
        tokenizer: &str,
        source_hash: u64,
        vocab_size: usize,
    ) -> Result<TokenIds, Stale> {
        let path = self.path(key);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Stale::Missing),
            Err(e) => return Err(Stale::Corrupt(format!("unreadable: {e}"))),
        };
        decode(&bytes, tokenizer, source_hash, vocab_size)
    }

    /// Writes the ids of `key` atomically.
    pub fn store(
        &self,
        key: &str,
        tokenizer: &str,
        source_hash: u64,
        ids: &TokenIds,
    ) -> Result<PathBuf, DataError> {
        let path = self.path(key);
        atomic::write(&path, &encode(ids, tokenizer, source_hash))
            .map_err(|e| DataError::io("write", &path, e))?;
        Ok(path)
    }
}

fn encode(ids: &TokenIds, tokenizer: &str, source_hash: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + ids.len() * ids.width());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(ids.width() as u32).to_le_bytes());
    out.extend_from_slice(&tokenizer_field(tokenizer));
    out.extend_from_slice(&source_hash.to_le_bytes());
    out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    out.extend_from_slice(&[0; 8]); // the checksum, filled in below
    match ids {
        TokenIds::U16(v) => v
            .iter()
            .for_each(|id| out.extend_from_slice(&id.to_le_bytes())),
        TokenIds::U32(v) => v
            .iter()
            .for_each(|id| out.extend_from_slice(&id.to_le_bytes())),
    }
    let checksum = XxHash64::oneshot(0, &out[HEADER_LEN..]);
    out[48..56].copy_from_slice(&checksum.to_le_bytes());
    out
}

fn decode(
    bytes: &[u8],
    tokenizer: &str,
    source_hash: u64,
    vocab_size: usize,
) -> Result<TokenIds, Stale> {
    if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
        return Err(Stale::Corrupt("no token-cache header".into()));
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let version = u32_at(8);
    if version != FORMAT_VERSION {
        return Err(Stale::Mismatch(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        )));
    }
    let width = u32_at(12) as usize;
    if width != 2 && width != 4 {
        return Err(Stale::Corrupt(format!("id width {width}")));
    }
    if bytes[16..32] != tokenizer_field(tokenizer) {
        let found = String::from_utf8_lossy(&bytes[16..32])
            .trim_end_matches('\0')
            .to_string();
        return Err(Stale::Mismatch(format!(
            "tokenizer {found:?}, wanted {tokenizer:?}"
        )));
    }
    if u64_at(32) != source_hash {
        return Err(Stale::Mismatch("the source text changed".into()));
    }
    let body = &bytes[HEADER_LEN..];
    let expected = usize::try_from(u64_at(40))
        .ok()
        .and_then(|count| count.checked_mul(width));
    if expected != Some(body.len()) {
        return Err(Stale::Corrupt(format!(
            "{} bytes of ids, the header says {}",
            body.len(),
            u64_at(40).saturating_mul(width as u64)
        )));
    }
    if XxHash64::oneshot(0, body) != u64_at(48) {
        return Err(Stale::Corrupt("the ids do not match their checksum".into()));
    }
    let ids = match width {
        2 => TokenIds::U16(
            body.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        _ => TokenIds::U32(
            body.chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
    };
    if let Some(id) = (0..ids.len())
        .map(|i| ids.get(i))
        .find(|&id| id as usize >= vocab_size)
    {
        return Err(Stale::Corrupt(format!(
            "id {id} is outside the vocabulary of {vocab_size}"
        )));
    }
    Ok(ids)
}

fn tokenizer_field(tokenizer: &str) -> [u8; 16] {
    let mut field = [0u8; 16];
    let bytes = tokenizer.as_bytes();
    let n = bytes.len().min(16);
    field[..n].copy_from_slice(&bytes[..n]);
    field
}

/// FNV-1a, 64 bits: stable across Rust versions and platforms (std's hasher is not).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= b as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
