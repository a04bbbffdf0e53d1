//! The data pipeline: corpora shipped with the harness, on disk or on the Hugging Face Hub → tokenizers → a token cache →
//! training windows and evaluation batches.

mod batch;
mod cache;
mod error;
mod hub;
mod load;
mod named;
mod source;
mod tokenizer;
mod tokens;

pub use batch::{TokenBatch, TrainWindows, eval_batches};
pub use cache::{FORMAT_VERSION, Stale, TokenCache, fnv1a64};
pub use error::DataError;
pub use hub::{Hub, WIKITEXT_REPO, WikiText, read_parquet_text, wikitext_hint};
pub use load::{LoadOptions, Loaded, load_corpus, tokenise};
pub use named::{EmbeddedCorpus, FetchedCorpus, data_dir};
pub use source::{
    CorpusSource, CorpusText, DOCUMENT_SEPARATOR, Document, SplitOptions, read_corpus, read_jsonl,
    read_text_documents, read_utf8, read_wikitext_split, split_documents, text_documents,
};
pub use tokenizer::{
    ByteTokenizer, CHUNK_BYTES, Gpt2Tokenizer, Tokenizer, TokenizerKind, encode_parallel,
};
pub use tokens::{TokenIds, TokenStream, TokenizedCorpus, bits_per_byte};
