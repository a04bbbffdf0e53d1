//! Corpora as text: WikiText (from the Hub or a local folder in the original layout), the corpus
//! shipped with the harness, JSONL with a `text` field, and plain text. Each yields a training and
//! a validation text.

use super::DataError;
use super::hub::{Hub, WikiText, wikitext_hint};
use super::named::{EmbeddedCorpus, FetchedCorpus};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where a corpus comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum CorpusSource {
    /// WikiText from the Hugging Face Hub (`Salesforce/wikitext`), or from `dir` when given
    /// (`wiki.{train,valid}.{raw,tokens}`).
    WikiText {
        /// Which WikiText.
        variant: WikiText,
        /// A local folder in the original layout, used instead of the Hub.
        dir: Option<PathBuf>,
    },
    /// A corpus shipped inside the harness (`shakespeare`), split like a text file.
    Embedded(EmbeddedCorpus),
    /// A JSONL file: one JSON object a line with a string `text`; other fields are metadata.
    Jsonl(PathBuf),
    /// A plain text file; its documents are the blocks between blank lines.
    Text(PathBuf),
}

impl FromStr for CorpusSource {
    type Err = DataError;
    /// `wikitext-103`, `wikitext-2`, `shakespeare` (shipped with the harness), `sotu` or `brown`
    /// (from the data folder, [`super::data_dir`]), a folder (local WikiText), a `.jsonl` file or
    /// any other file (plain text).
    ///
    /// # Errors
    /// A path that does not exist, or a named corpus that is not in the data folder.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(variant) = s.parse::<WikiText>() {
            return Ok(CorpusSource::WikiText { variant, dir: None });
        }
        if let Some(corpus) = EmbeddedCorpus::from_name(s) {
            return Ok(CorpusSource::Embedded(corpus));
        }
        if let Some(corpus) = FetchedCorpus::from_name(s) {
            let path = corpus.path();
            return if path.is_file() {
                Ok(CorpusSource::Jsonl(path))
            } else {
                Err(DataError::NotFetched { corpus, path })
            };
        }
        let path = PathBuf::from(s);
        if path.is_dir() {
            Ok(CorpusSource::WikiText {
                variant: WikiText::Local,
                dir: Some(path),
            })
        } else if path.extension().is_some_and(|e| e == "jsonl") {
            Ok(CorpusSource::Jsonl(path))
        } else if path.exists() {
            Ok(CorpusSource::Text(path))
        } else {
            Err(DataError::NotFound {
                path,
                hint: "a corpus is `wikitext-103`, `wikitext-2`, `shakespeare`, `sotu`, `brown`, a folder \
                       with wiki.{train,valid}.raw, a .jsonl file or a text file"
                    .into(),
            })
        }
    }
}

impl CorpusSource {
    /// The source with the program's `--data-dir`: a local folder in WikiText's layout, read
    /// instead of the Hub.
    ///
    /// # Errors
    /// A `dir` for a corpus that is not WikiText (pass other corpora as a path instead).
    pub fn with_data_dir(self, dir: Option<PathBuf>) -> Result<Self, DataError> {
        match (self, dir) {
            (source, None) => Ok(source),
            (CorpusSource::WikiText { .. }, Some(dir)) if dir.is_file() => {
                Err(DataError::Invalid(format!(
                    "the WikiText folder {} is a file: give the folder that holds \
                     wiki.{{train,valid}}.{{raw,tokens}}",
                    dir.display()
                )))
            }
            (CorpusSource::WikiText { variant, .. }, Some(dir)) => Ok(CorpusSource::WikiText {
                variant,
                dir: Some(dir),
            }),
            (source, Some(dir)) => Err(DataError::Invalid(format!(
                "a data folder ({}) is for WikiText (wikitext-103 or wikitext-2) only, not for \
                 {}; give other corpora by their path",
                dir.display(),
                source.describe()
            ))),
        }
    }

    /// Where the corpus is: its path, or the Hub dataset.
    pub fn describe(&self) -> String {
        match self {
            CorpusSource::WikiText { dir: Some(dir), .. } => dir.display().to_string(),
            CorpusSource::WikiText { variant, dir: None } => {
                format!("{} (Hugging Face Hub)", variant.name())
            }
            CorpusSource::Embedded(corpus) => {
                format!("{} (shipped with the harness)", corpus.name())
            }
            CorpusSource::Jsonl(p) | CorpusSource::Text(p) => p.display().to_string(),
        }
    }

    /// A short name for caches and reports.
    pub fn name(&self) -> String {
        // `tinyshakespeare/input.txt` is better named by its folder than by `input`.
        let stem = |p: &Path| {
            let name = |p: &Path| p.file_stem().map(|s| s.to_string_lossy().into_owned());
            match name(p) {
                Some(s) if !["input", "train", "data", "text", "corpus"].contains(&s.as_str()) => s,
                Some(s) => p
                    .parent()
                    .and_then(name)
                    .map_or(s.clone(), |parent| format!("{parent}-{s}")),
                None => "corpus".into(),
            }
        };
        match self {
            CorpusSource::WikiText {
                variant: WikiText::Local,
                dir: Some(dir),
            } => stem(dir),
            CorpusSource::WikiText { variant, .. } => variant.name().into(),
            CorpusSource::Embedded(corpus) => corpus.name().into(),
            CorpusSource::Jsonl(p) | CorpusSource::Text(p) => stem(p),
        }
    }
}

/// How JSONL and text corpora are split into training and validation (WikiText has its own).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SplitOptions {
    /// Fraction of documents held out for validation (at least one document).
    pub valid_fraction: f64,
    /// Seed of the document shuffle.
    pub seed: u64,
}

impl Default for SplitOptions {
    fn default() -> Self {
        SplitOptions {
            valid_fraction: 0.1,
            seed: 0,
        }
    }
}

/// A document: its text and, for JSONL, its other fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// The text.
    pub text: String,
    /// The other fields of its JSONL line (empty for other sources).
    pub meta: serde_json::Map<String, serde_json::Value>,
}

/// A corpus's training and validation text.
#[derive(Clone, Debug, PartialEq)]
pub struct CorpusText {
    /// The training text.
    pub train: String,
    /// The validation text.
    pub valid: String,
}

/// What separates documents in a split's text.
pub const DOCUMENT_SEPARATOR: &str = "\n\n";

/// Reads `source` into its training and validation text.
pub fn read_corpus(
    source: &CorpusSource,
    split: SplitOptions,
    hub: &Hub,
) -> Result<CorpusText, DataError> {
    let (train, valid) = match source {
        CorpusSource::WikiText { dir: Some(dir), .. } => (
            read_wikitext_split(dir, "train")?,
            read_wikitext_split(dir, "valid")?,
        ),
        CorpusSource::WikiText { variant, dir: None } => (
            hub.wikitext_split(*variant, "train")?,
            hub.wikitext_split(*variant, "validation")?,
        ),
        CorpusSource::Embedded(corpus) => {
            split_documents(&source.describe(), text_documents(corpus.text()), split)?
        }
        CorpusSource::Jsonl(path) => split_documents(&source.describe(), read_jsonl(path)?, split)?,
        CorpusSource::Text(path) => {
            split_documents(&source.describe(), read_text_documents(path)?, split)?
        }
    };
    for (name, text) in [("training", &train), ("validation", &valid)] {
        if text.trim().is_empty() {
            return Err(DataError::Empty {
                what: format!("the {name} split of {}", source.describe()),
            });
        }
    }
    Ok(CorpusText { train, valid })
}

/// Reads `dir/wiki.{split}.raw`, else `dir/wiki.{split}.tokens`.
pub fn read_wikitext_split(dir: &Path, split: &str) -> Result<String, DataError> {
    if !dir.is_dir() {
        return Err(DataError::NotFound {
            path: dir.into(),
            hint: wikitext_hint(),
        });
    }
    for ext in ["raw", "tokens"] {
        let path = dir.join(format!("wiki.{split}.{ext}"));
        if path.exists() {
            return read_utf8(&path);
        }
    }
    Err(DataError::NotFound {
        path: dir.join(format!("wiki.{split}.raw")),
        hint: wikitext_hint(),
    })
}

/// UTF-8's byte-order mark.
const UTF8_BOM: &[u8] = &[0xEF, 0xBB, 0xBF];

/// Reads a whole file as UTF-8, without a leading byte-order mark.
pub fn read_utf8(path: &Path) -> Result<String, DataError> {
    let mut bytes = std::fs::read(path).map_err(|e| DataError::io("read", path, e))?;
    // A leading byte-order mark is an editor's marker, not text: it would be trained on as three
    // byte tokens, and a JSONL file's first line would not parse.
    if bytes.starts_with(UTF8_BOM) {
        bytes.drain(..UTF8_BOM.len());
    }
    String::from_utf8(bytes).map_err(|e| DataError::InvalidUtf8 {
        path: path.into(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Reads a JSONL corpus. Blank lines are skipped.
pub fn read_jsonl(path: &Path) -> Result<Vec<Document>, DataError> {
    let text = read_utf8(path)?;
    let mut documents = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| DataError::Jsonl {
            path: path.into(),
            line: index + 1,
            message,
        };
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(format!("not JSON ({e})")))?;
        let serde_json::Value::Object(mut meta) = value else {
            return Err(bad("not a JSON object".into()));
        };
        let text = match meta.remove("text") {
            Some(serde_json::Value::String(text)) => text,
            Some(other) => return Err(bad(format!("\"text\" is not a string but {other}"))),
            None => return Err(bad("no \"text\" field".into())),
        };
        documents.push(Document { text, meta });
    }
    Ok(documents)
}

/// Reads a text file; its documents are the blocks between blank lines (lines of nothing but
/// whitespace, as WikiText's `" \n"`).
pub fn read_text_documents(path: &Path) -> Result<Vec<Document>, DataError> {
    Ok(text_documents(&read_utf8(path)?))
}

/// The documents of a text: its blocks between blank lines.
pub fn text_documents(text: &str) -> Vec<Document> {
    let mut documents = Vec::new();
    let mut block: Vec<&str> = Vec::new();
    for line in text.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if !block.is_empty() {
                documents.push(Document {
                    text: block.join("\n"),
                    meta: Default::default(),
                });
                block.clear();
            }
        } else {
            block.push(line);
        }
    }
    documents
}

/// Splits documents into training and validation text, never inside a document: a seeded
/// shuffle picks `ceil(fraction·n)` validation documents (at least one, leaving at least one);
/// each split keeps the corpus order and joins its documents with [`DOCUMENT_SEPARATOR`].
pub fn split_documents(
    what: &str,
    documents: Vec<Document>,
    options: SplitOptions,
) -> Result<(String, String), DataError> {
    let n = documents.len();
    if n == 0 {
        return Err(DataError::Empty { what: what.into() });
    }
    if n < 2 {
        return Err(DataError::TooFewDocuments {
            what: what.into(),
            documents: n,
        });
    }
    if !(options.valid_fraction > 0.0 && options.valid_fraction < 1.0) {
        return Err(DataError::Invalid(format!(
            "the validation fraction must lie in (0, 1), got {}",
            options.valid_fraction
        )));
    }
    let n_valid = ((options.valid_fraction * n as f64).ceil() as usize).clamp(1, n - 1);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut StdRng::seed_from_u64(options.seed));
    let mut is_valid = vec![false; n];
    for &i in &order[..n_valid] {
        is_valid[i] = true;
    }
    let (mut train, mut valid) = (Vec::new(), Vec::new());
    for (doc, valid_doc) in documents.into_iter().zip(is_valid) {
        if valid_doc {
            valid.push(doc.text)
        } else {
            train.push(doc.text)
        }
    }
    Ok((
        train.join(DOCUMENT_SEPARATOR),
        valid.join(DOCUMENT_SEPARATOR),
    ))
}
