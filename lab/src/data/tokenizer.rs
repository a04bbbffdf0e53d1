//! Tokenizers behind one small trait: byte-level (256 ids) for CPU-scale runs, GPT-2 BPE (50257 ids,
//! the paper's) for faithful ones. Long texts are tokenised in parallel over chunks cut where the
//! result cannot change.

use super::DataError;
use rayon::prelude::*;
use std::str::FromStr;

/// Text to token ids and back.
pub trait Tokenizer: Send + Sync {
    /// A short stable name, stored in token caches and run configs.
    fn id(&self) -> &'static str;
    /// Ids are `0..vocab_size`.
    fn vocab_size(&self) -> usize;
    /// The ids of `text`.
    fn encode(&self, text: &str) -> Vec<u32>;
    /// The UTF-8 bytes that `ids` stand for (a token may hold part of a character).
    fn decode_bytes(&self, ids: &[u32]) -> Vec<u8>;
    /// Whether cutting a text at byte `at` and encoding the two parts gives the ids of the whole.
    fn can_cut_at(&self, text: &str, at: usize) -> bool;
    /// UTF-8 bytes each id stands for, indexed by id (for bits per byte).
    fn byte_lens(&self) -> Vec<u32> {
        (0..self.vocab_size() as u32)
            .map(|id| self.decode_bytes(&[id]).len() as u32)
            .collect()
    }
}

/// Byte-level: each UTF-8 byte is a token.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteTokenizer;

impl Tokenizer for ByteTokenizer {
    fn id(&self) -> &'static str {
        "bytes"
    }
    fn vocab_size(&self) -> usize {
        256
    }
    fn encode(&self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }
    fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter().map(|&id| id as u8).collect()
    }
    fn can_cut_at(&self, _text: &str, _at: usize) -> bool {
        true
    }
}

/// GPT-2's byte-pair encoding (`r50k_base`, 50257 ids), from `tiktoken-rs`, which embeds the ranks:
/// no download. Special tokens in the text are encoded as ordinary text.
pub struct Gpt2Tokenizer {
    bpe: &'static tiktoken_rs::CoreBPE,
}

impl Default for Gpt2Tokenizer {
    fn default() -> Self {
        Gpt2Tokenizer {
            bpe: tiktoken_rs::r50k_base_singleton(),
        }
    }
}

impl std::fmt::Debug for Gpt2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gpt2Tokenizer")
    }
}

impl Tokenizer for Gpt2Tokenizer {
    fn id(&self) -> &'static str {
        "gpt2"
    }
    fn vocab_size(&self) -> usize {
        50257
    }
    fn encode(&self, text: &str) -> Vec<u32> {
        self.bpe.encode_ordinary(text)
    }
    fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        self.bpe
            .decode_bytes(ids)
            .unwrap_or_else(|e| panic!("GPT-2 has no token {e:?}: ids must be below 50257"))
    }
    /// GPT-2's pre-tokenizer never puts a non-space character and the whitespace after it in one
    /// piece, and its patterns look neither behind nor (for pieces ending in non-space) ahead past
    /// the piece. So a cut between an ASCII non-space byte and an ASCII space or newline changes
    /// nothing.
    fn can_cut_at(&self, text: &str, at: usize) -> bool {
        let bytes = text.as_bytes();
        at > 0
            && at < bytes.len()
            && bytes[at - 1].is_ascii()
            && !bytes[at - 1].is_ascii_whitespace()
            && matches!(bytes[at], b' ' | b'\n')
    }
}

/// The tokenizers this crate provides, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// [`ByteTokenizer`].
    Bytes,
    /// [`Gpt2Tokenizer`].
    Gpt2,
}

impl TokenizerKind {
    /// The tokenizer.
    pub fn build(self) -> Box<dyn Tokenizer> {
        match self {
            TokenizerKind::Bytes => Box::new(ByteTokenizer),
            TokenizerKind::Gpt2 => Box::new(Gpt2Tokenizer::default()),
        }
    }
}

impl FromStr for TokenizerKind {
    type Err = DataError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bytes" | "byte" => Ok(TokenizerKind::Bytes),
            "gpt2" | "gpt-2" => Ok(TokenizerKind::Gpt2),
            other => Err(DataError::Invalid(format!(
                "unknown tokenizer {other:?}: use `bytes` (256 ids, CPU-scale runs) or `gpt2` (50257 ids, the paper's)"
            ))),
        }
    }
}

/// Target chunk size for parallel encoding.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Encodes `text` in parallel over chunks of about `chunk_bytes`, cut only where
/// [`Tokenizer::can_cut_at`] allows, so the ids equal `tokenizer.encode(text)`.
/// `progress` is called with the bytes of each finished chunk.
pub fn encode_parallel(
    tokenizer: &dyn Tokenizer,
    text: &str,
    chunk_bytes: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Vec<u32> {
    let cuts = chunk_cuts(tokenizer, text, chunk_bytes.max(1));
    let pieces: Vec<Vec<u32>> = cuts
        .par_windows(2)
        .map(|w| {
            let ids = tokenizer.encode(&text[w[0]..w[1]]);
            progress(w[1] - w[0]);
            ids
        })
        .collect();
    let mut ids = Vec::with_capacity(pieces.iter().map(Vec::len).sum());
    for piece in pieces {
        ids.extend(piece);
    }
    ids
}

/// Cut points `0 = c0 < c1 < … < cn = len`, each allowed by the tokenizer.
fn chunk_cuts(tokenizer: &dyn Tokenizer, text: &str, chunk_bytes: usize) -> Vec<usize> {
    let mut cuts = vec![0];
    let mut at = chunk_bytes;
    while at < text.len() {
        let mut cut = at;
        while cut < text.len() && !(text.is_char_boundary(cut) && tokenizer.can_cut_at(text, cut)) {
            cut += 1;
        }
        if cut >= text.len() {
            break;
        }
        cuts.push(cut);
        at = cut + chunk_bytes;
    }
    cuts.push(text.len());
    cuts
}
