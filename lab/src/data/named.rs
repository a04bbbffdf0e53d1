//! Corpora by name: tiny-shakespeare, shipped inside the harness so that every program and test
//! runs from a fresh clone with no network, and the larger corpora of the results, which are not
//! shipped and are read from the data folder (`scripts/fetch_corpora.sh` writes them there; see
//! docs/data.md).

use std::path::PathBuf;

/// tiny-shakespeare (char-rnn's `input.txt`, 1,115,394 bytes of public-domain text; source and
/// licence in `lab/data/README.md`).
const TINY_SHAKESPEARE: &str = include_str!("../../data/tinyshakespeare.txt");

/// A corpus shipped inside the harness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbeddedCorpus {
    /// tiny-shakespeare: 40,000 lines of Shakespeare's plays, the standard first corpus of
    /// character-level language models (char-rnn, nanoGPT). Named `shakespeare` or
    /// `tinyshakespeare`.
    TinyShakespeare,
}

impl EmbeddedCorpus {
    /// Every shipped corpus.
    pub const ALL: [EmbeddedCorpus; 1] = [EmbeddedCorpus::TinyShakespeare];

    /// The corpus a name (`--corpus NAME`) stands for.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "shakespeare" | "tinyshakespeare" | "tiny-shakespeare" => {
                Some(EmbeddedCorpus::TinyShakespeare)
            }
            _ => None,
        }
    }

    /// Its name in caches, run folders and reports.
    pub fn name(self) -> &'static str {
        match self {
            EmbeddedCorpus::TinyShakespeare => "tinyshakespeare",
        }
    }

    /// Its text.
    pub fn text(self) -> &'static str {
        match self {
            EmbeddedCorpus::TinyShakespeare => TINY_SHAKESPEARE,
        }
    }
}

/// A corpus of the results that is not shipped: a name, its file in the data folder, and what it
/// is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchedCorpus {
    /// Its name (`--corpus sotu`).
    pub name: &'static str,
    /// Its file in the data folder.
    pub file: &'static str,
    /// What it is, for messages.
    pub what: &'static str,
}

impl FetchedCorpus {
    /// The corpora of the results that a user fetches into the data folder.
    pub const ALL: [FetchedCorpus; 2] = [
        FetchedCorpus {
            name: "sotu",
            file: "sotu.jsonl",
            what: "the US State of the Union addresses 1790–2021",
        },
        FetchedCorpus {
            name: "brown",
            file: "brown.jsonl",
            what: "the Brown corpus",
        },
    ];

    /// The corpus a name stands for.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name == name)
    }

    /// Where it is read from: [`data_dir`]`/file`.
    pub fn path(self) -> PathBuf {
        data_dir().join(self.file)
    }
}

/// The data folder of the corpora that are not shipped: `$COUPLED_QK_DATA`, else
/// `$XDG_CACHE_HOME/coupled-qk/data`, else `~/.cache/coupled-qk/data` (where
/// `scripts/fetch_corpora.sh` writes by default).
pub fn data_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("COUPLED_QK_DATA")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("coupled-qk").join("data")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("coupled-qk").join("data")))
        .unwrap_or_else(|| PathBuf::from("data"))
}
