//! WikiText from the Hugging Face Hub (`Salesforce/wikitext`, parquet with one `text` column and one
//! row per source line), downloaded once into hf-hub's cache. `HF_HOME` and `HF_ENDPOINT` are
//! honoured (hf-hub 0.4 reads them only through `ApiBuilder::from_env`).

use super::DataError;
use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Repo, RepoType};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::Type;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

/// The Hub dataset holding WikiText.
pub const WIKITEXT_REPO: &str = "Salesforce/wikitext";

/// Which WikiText.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WikiText {
    /// WikiText-103 (raw): the paper's corpus, 540 MB of training text.
    #[serde(rename = "wikitext-103")]
    Wiki103,
    /// WikiText-2 (raw): the same validation and test articles, a 2M-token training split.
    #[serde(rename = "wikitext-2")]
    Wiki2,
    /// A local folder in the original layout.
    #[serde(rename = "local")]
    Local,
}

impl WikiText {
    /// `wikitext-103`, `wikitext-2` or `wikitext`.
    pub fn name(self) -> &'static str {
        match self {
            WikiText::Wiki103 => "wikitext-103",
            WikiText::Wiki2 => "wikitext-2",
            WikiText::Local => "wikitext",
        }
    }

    /// The parquet files of a split (`train`, `validation`, `test`) in the Hub repository.
    pub fn files(self, split: &str) -> Vec<String> {
        let (config, train_shards) = match self {
            WikiText::Wiki103 => ("wikitext-103-raw-v1", 2),
            WikiText::Wiki2 | WikiText::Local => ("wikitext-2-raw-v1", 1),
        };
        let shards = if split == "train" { train_shards } else { 1 };
        (0..shards)
            .map(|i| format!("{config}/{split}-{i:05}-of-{shards:05}.parquet"))
            .collect()
    }
}

impl FromStr for WikiText {
    type Err = DataError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "wikitext-103" | "wikitext103" => Ok(WikiText::Wiki103),
            "wikitext-2" | "wikitext2" => Ok(WikiText::Wiki2),
            other => Err(DataError::Invalid(format!(
                "{other:?} is not wikitext-103 or wikitext-2"
            ))),
        }
    }
}

/// How long a download waits for another process's download of the same file.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Access to the Hub: hf-hub's settings from the environment, optionally overridden.
#[derive(Clone, Debug, Default)]
pub struct Hub {
    /// Overrides `HF_ENDPOINT`.
    pub endpoint: Option<String>,
    /// Overrides the cache folder (`$HF_HOME/hub`).
    pub cache_dir: Option<PathBuf>,
    /// Show a progress bar while downloading.
    pub progress: bool,
}

impl Hub {
    /// The local path of `filename` in `repo` (a dataset), downloading it if it is not cached.
    /// A file that does not read as parquet is reported, never used; it is removed from the cache
    /// only when it is proven truncated (no parquet footer), so that a codec this build lacks or
    /// a passing I/O error never costs the user their download.
    pub fn dataset_file(&self, repo: &str, filename: &str) -> Result<PathBuf, DataError> {
        let (url, path) = self.get(
            Repo::new(repo.into(), RepoType::Dataset),
            filename,
            wikitext_hint,
        )?;
        if let Err(problem) = check_parquet(&path) {
            return Err(unreadable(url, &path, &problem));
        }
        Ok(path)
    }

    /// The local path of `filename` in the model repository `repo` (e.g.
    /// `openai-community/gpt2`, `model.safetensors`), downloading it if it is not cached. hf-hub
    /// downloads to a temporary file and renames it when complete: an interrupted download is
    /// never taken for the file.
    pub fn model_file(&self, repo: &str, filename: &str) -> Result<PathBuf, DataError> {
        let hint = || {
            "download the model's config.json and model.safetensors into one folder and pass \
             that folder, or run with network access to the Hugging Face Hub (HF_ENDPOINT \
             selects a mirror)"
                .to_string()
        };
        self.get(Repo::new(repo.into(), RepoType::Model), filename, hint)
            .map(|(_, path)| path)
    }

    /// Downloads (or finds in the cache) one file of a repository: its URL and local path.
    fn get(
        &self,
        repo: Repo,
        filename: &str,
        hint: fn() -> String,
    ) -> Result<(String, PathBuf), DataError> {
        let mut builder = ApiBuilder::from_env().with_progress(self.progress);
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        if let Some(dir) = &self.cache_dir {
            builder = builder.with_cache_dir(dir.clone());
        }
        let api = builder.build().map_err(|e| DataError::Download {
            url: repo.url(),
            message: e.to_string(),
            hint: hint(),
        })?;
        let repo = api.repo(repo);
        let url = repo.url(filename);
        // hf-hub gives up after 5 s when another process holds the file's download lock: wait
        // for that download instead (it leaves the file in the cache, which the retry finds).
        let waiting_since = std::time::Instant::now();
        let path = loop {
            match repo.get(filename) {
                Err(hf_hub::api::sync::ApiError::LockAcquisition(lock))
                    if waiting_since.elapsed() < LOCK_PATIENCE =>
                {
                    eprintln!(
                        "{filename}: another process is downloading it ({} is locked); waiting",
                        lock.display()
                    );
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
                other => {
                    break other.map_err(|e| DataError::Download {
                        url: url.clone(),
                        message: e.to_string(),
                        hint: hint(),
                    })?;
                }
            }
        };
        Ok((url, path))
    }

    /// The text of one WikiText split from the Hub, byte for byte `wiki.{split}.raw`: the rows
    /// concatenated (each row is a source line with its newline), with the blank lines the Hub's
    /// builder stored as empty rows put back as the raw file's `" \n"`.
    pub fn wikitext_split(&self, variant: WikiText, split: &str) -> Result<String, DataError> {
        if variant == WikiText::Local {
            return Err(DataError::Invalid(
                "a local WikiText needs its folder".into(),
            ));
        }
        let mut text = String::new();
        for file in variant.files(split) {
            let path = self.dataset_file(WIKITEXT_REPO, &file)?;
            // A file that opened but whose rows do not read is as broken as a truncated one.
            let rows = read_parquet_text(&path)
                .map_err(|e| unreadable(file.clone(), &path, &e.to_string()))?;
            for row in rows {
                text.push_str(if row.is_empty() { " \n" } else { &row });
            }
        }
        Ok(text)
    }
}

fn check_parquet(path: &Path) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    SerializedFileReader::new(file)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The error for a cached file that does not read: a truncated one is removed (the next run
/// downloads it afresh); any other is kept and named.
fn unreadable(url: String, path: &Path, problem: &str) -> DataError {
    if is_truncated(path) {
        let removed = remove_cached(path);
        return DataError::Download {
            url,
            message: format!("the downloaded file is incomplete ({problem}); {removed}"),
            hint: "run again to download it afresh".into(),
        };
    }
    let codec = ["GZIP", "BROTLI", "LZ4", "SNAPPY", "ZSTD", "LZO"]
        .into_iter()
        .find(|c| problem.to_uppercase().contains(c) && problem.contains("not"));
    DataError::Download {
        url,
        message: format!(
            "{} does not read as parquet ({problem}){}; it is whole, so it was kept",
            path.display(),
            codec.map_or(String::new(), |c| format!(
                " — this build may lack the {c} codec"
            ))
        ),
        hint: "if it keeps failing, delete that file to download it again".into(),
    }
}

/// Whether a parquet file is cut short: a whole one ends with its footer's length and the
/// magic `PAR1`.
fn is_truncated(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let tail = || -> std::io::Result<[u8; 4]> {
        let mut file = std::fs::File::open(path)?;
        if file.metadata()?.len() < 12 {
            return Ok([0; 4]);
        }
        file.seek(SeekFrom::End(-4))?;
        let mut magic = [0u8; 4];
        file.read_exact(&mut magic)?;
        Ok(magic)
    };
    // An unreadable file proves nothing: keep it.
    tail().is_ok_and(|magic| &magic != b"PAR1")
}

/// Removes a cached file and, when it is hf-hub's symlink, the blob it points to.
fn remove_cached(path: &Path) -> String {
    let blob = std::fs::canonicalize(path).ok();
    let _ = std::fs::remove_file(path);
    if let Some(blob) = blob.filter(|b| b != path) {
        let _ = std::fs::remove_file(&blob);
    }
    format!("removed {} from the cache", path.display())
}

/// The `text` column of a parquet file, one string per row (a null reads as "").
pub fn read_parquet_text(path: &Path) -> Result<Vec<String>, DataError> {
    let bad = |message: String| DataError::Parquet {
        path: path.into(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| DataError::io("read", path, e))?;
    let reader =
        SerializedFileReader::new(file).map_err(|e| bad(format!("not a parquet file ({e})")))?;
    let schema = reader.metadata().file_metadata().schema();
    let Some(field) = schema.get_fields().iter().find(|f| f.name() == "text") else {
        let columns: Vec<&str> = schema.get_fields().iter().map(|f| f.name()).collect();
        return Err(bad(format!(
            "has no `text` column (its columns: {})",
            columns.join(", ")
        )));
    };
    let projection = Type::group_type_builder(schema.name())
        .with_fields(vec![Arc::clone(field)])
        .build()
        .map_err(|e| bad(e.to_string()))?;
    let rows = reader
        .get_row_iter(Some(projection))
        .map_err(|e| bad(e.to_string()))?;
    let mut texts = Vec::with_capacity(reader.metadata().file_metadata().num_rows() as usize);
    for (index, row) in rows.enumerate() {
        let row = row.map_err(|e| bad(format!("row {index}: {e}")))?;
        match row.get_column_iter().next().map(|(_, field)| field) {
            Some(parquet::record::Field::Str(s)) => texts.push(s.clone()),
            Some(parquet::record::Field::Null) | None => texts.push(String::new()),
            Some(other) => {
                return Err(bad(format!(
                    "row {index}: `text` is not a string but {other}"
                )));
            }
        }
    }
    Ok(texts)
}

/// Where to put WikiText to run offline.
pub fn wikitext_hint() -> String {
    "Put WikiText's wiki.train.raw and wiki.valid.raw (or .tokens) in one folder and give it as the \
     WikiText folder, or run with network access to download Salesforce/wikitext from the Hugging Face Hub (HF_ENDPOINT selects a mirror)"
        .into()
}
