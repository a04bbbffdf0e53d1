//! Token ids held compactly in memory, and a corpus as tokenised train and validation streams.

use super::DataError;

/// Token ids, stored in 16 bits when the vocabulary fits (GPT-2's 50257 and bytes do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenIds {
    /// Ids of a vocabulary of at most 65536 entries.
    U16(Vec<u16>),
    /// Ids of a larger vocabulary.
    U32(Vec<u32>),
}

impl TokenIds {
    /// Stores `ids` in the narrowest width that holds every id below `vocab_size`.
    pub fn from_u32(ids: Vec<u32>, vocab_size: usize) -> Self {
        if vocab_size <= 1 << 16 {
            TokenIds::U16(ids.into_iter().map(|id| id as u16).collect())
        } else {
            TokenIds::U32(ids)
        }
    }

    /// The number of ids.
    pub fn len(&self) -> usize {
        match self {
            TokenIds::U16(ids) => ids.len(),
            TokenIds::U32(ids) => ids.len(),
        }
    }

    /// Whether there are no ids.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The id at `index`.
    ///
    /// # Panics
    /// If `index >= len()`.
    pub fn get(&self, index: usize) -> u32 {
        match self {
            TokenIds::U16(ids) => ids[index] as u32,
            TokenIds::U32(ids) => ids[index],
        }
    }

    /// Appends `ids[start..start + len]` to `out` as `i64` (Burn's integer element).
    ///
    /// # Panics
    /// If the range runs past the end.
    pub fn extend_i64(&self, start: usize, len: usize, out: &mut Vec<i64>) {
        match self {
            TokenIds::U16(ids) => out.extend(ids[start..start + len].iter().map(|&id| id as i64)),
            TokenIds::U32(ids) => out.extend(ids[start..start + len].iter().map(|&id| id as i64)),
        }
    }

    /// Bytes per id in this storage (2 or 4).
    pub fn width(&self) -> usize {
        match self {
            TokenIds::U16(_) => 2,
            TokenIds::U32(_) => 4,
        }
    }

    /// All ids, widened.
    pub fn to_u32(&self) -> Vec<u32> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }
}

/// One split of a corpus as a stream of token ids, with what is needed to report bits per byte.
#[derive(Clone, Debug)]
pub struct TokenStream {
    /// The ids, documents joined in order.
    pub ids: TokenIds,
    /// UTF-8 bytes of the text each id decodes to, indexed by id (from the tokenizer).
    pub byte_lens: std::sync::Arc<Vec<u32>>,
}

impl TokenStream {
    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the stream is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// UTF-8 bytes of the text that `ids[start..start + len]` encode.
    pub fn bytes_of(&self, start: usize, len: usize) -> u64 {
        (start..start + len)
            .map(|i| self.byte_lens[self.ids.get(i) as usize] as u64)
            .sum()
    }

    /// UTF-8 bytes of the whole stream's text.
    pub fn total_bytes(&self) -> u64 {
        self.bytes_of(0, self.len())
    }
}

/// A corpus tokenised into its training and validation streams.
#[derive(Clone, Debug)]
pub struct TokenizedCorpus {
    /// The corpus's name (for run folders and reports).
    pub name: String,
    /// The tokenizer's id (`bytes` or `gpt2`).
    pub tokenizer: String,
    /// The tokenizer's vocabulary size: the model's `vocab_size`.
    pub vocab_size: usize,
    /// The training stream.
    pub train: TokenStream,
    /// The validation stream.
    pub valid: TokenStream,
}

impl TokenizedCorpus {
    /// Checks that both splits hold one window of `seq_len` inputs and targets; the error names
    /// the corpus, the tokenizer and the split.
    pub fn check_context(&self, seq_len: usize) -> Result<(), DataError> {
        for (split, stream) in [("training", &self.train), ("validation", &self.valid)] {
            let what = format!(
                "the {split} split of corpus `{}` (tokenizer {})",
                self.name, self.tokenizer
            );
            super::batch::check_window(&what, stream, seq_len)?;
        }
        Ok(())
    }
}

/// Bits per byte from a total loss in nats over text of `bytes` UTF-8 bytes.
pub fn bits_per_byte(total_nats: f64, bytes: u64) -> f64 {
    total_nats / std::f64::consts::LN_2 / bytes as f64
}
