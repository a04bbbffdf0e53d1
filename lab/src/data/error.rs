//! What can go wrong between a corpus and its batches, each naming the file or URL and what to do.

use std::path::PathBuf;

/// An error of the data pipeline.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file or folder that is not there.
    #[error("{} does not exist: {hint}", path.display())]
    NotFound {
        /// The missing path.
        path: PathBuf,
        /// What to do about it.
        hint: String,
    },
    /// Reading or writing a file failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done (read, write, …).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A text file that is not UTF-8.
    #[error("{} is not valid UTF-8 (first bad byte at offset {offset}); convert it to UTF-8 first", path.display())]
    InvalidUtf8 {
        /// The file.
        path: PathBuf,
        /// Byte offset of the first invalid sequence.
        offset: usize,
    },
    /// A JSONL line that is not a JSON object with a string `text` field.
    #[error("{}:{line}: {message}; each line must be a JSON object with a string \"text\" field", path.display())]
    Jsonl {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        message: String,
    },
    /// A parquet file that cannot be read or has no `text` column.
    #[error("{}: {message}", path.display())]
    Parquet {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A corpus (or split) with no text.
    #[error("{what} is empty: it holds no text to train or evaluate on")]
    Empty {
        /// What is empty.
        what: String,
    },
    /// Too few documents to split by document.
    #[error(
        "{what} has {documents} document(s); splitting into training and validation needs at least 2"
    )]
    TooFewDocuments {
        /// The corpus.
        what: String,
        /// Its document count.
        documents: usize,
    },
    /// A split shorter than one window.
    #[error(
        "{what} has {tokens} tokens, fewer than one window of {needed} (seq_len + 1); use a larger corpus or a shorter context"
    )]
    TooShort {
        /// Which split (and, where known, of which corpus and tokenizer).
        what: String,
        /// Its token count.
        tokens: usize,
        /// Tokens one window needs.
        needed: usize,
    },
    /// A download that failed or came back incomplete.
    #[error("cannot download {url}: {message}. {hint}")]
    Download {
        /// The URL.
        url: String,
        /// The cause.
        message: String,
        /// What to do (where to put the files to run offline).
        hint: String,
    },
    /// A corpus named by the results (`sotu`, `brown`) that is not in the data folder.
    #[error(
        "the corpus `{}` ({}) is not shipped with the harness and {} does not exist; fetch it \
         into the data folder ($COUPLED_QK_DATA, default ~/.cache/coupled-qk/data) as docs/data.md \
         says, or pass the path of a copy",
        corpus.name, corpus.what, path.display()
    )]
    NotFetched {
        /// The corpus.
        corpus: super::FetchedCorpus,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// An argument or setting that cannot work.
    #[error("{0}")]
    Invalid(String),
}

impl DataError {
    /// Whether the error is a failed download: the program may be offline.
    pub fn is_download(&self) -> bool {
        matches!(self, DataError::Download { .. })
    }

    /// An I/O error on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            return DataError::NotFound {
                path,
                hint: format!("check the path ({action} failed)"),
            };
        }
        DataError::Io {
            action,
            path,
            source,
        }
    }
}
