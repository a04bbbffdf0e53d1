//! The data pipeline: tokenizers, token cache, document splits, batches, the Hub download path
//! (against a loopback server) and every error a user can meet, on real text shipped in the
//! repository (tiny-shakespeare, WikiText-2 fixtures). Offline.

mod support;

use coupled_qk_lab::data::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use support::hub_server::{HubServer, Mode, parquet_of};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("coupled-qk-data-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn quiet(cache: &Path) -> LoadOptions {
    LoadOptions {
        cache: TokenCache::new(cache),
        verbose: false,
        hub: Hub::default(),
        split: SplitOptions::default(),
    }
}

fn byte_stream(text: &str) -> TokenStream {
    TokenStream {
        ids: TokenIds::from_u32(text.bytes().map(u32::from).collect(), 256),
        byte_lens: Arc::new(ByteTokenizer.byte_lens()),
    }
}

const VARIED: &str = "The tower is 324 metres (1,063 ft) tall. \n \n = Heading = \n\
    It was the first structure to reach 300 m,  then   the Chrysler Building in 1930.\n\
    Ünïcödé — “quotes” and emoji 🎉 too; tabs\tand\r\nCRLF.  \n\nEnd";

#[test]
fn gpt2_gives_the_known_ids_of_fixed_sentences() {
    let gpt2 = Gpt2Tokenizer::default();
    assert_eq!(gpt2.encode("hello world"), vec![31373, 995]);
    assert_eq!(gpt2.encode("Hello world"), vec![15496, 995]);
    assert_eq!(gpt2.encode("Hello, world!"), vec![15496, 11, 995, 0]);
    // Special tokens in text are ordinary text, not id 50256.
    assert!(!gpt2.encode("a<|endoftext|>b").contains(&50256));
    assert_eq!(gpt2.vocab_size(), 50257);
    assert_eq!(gpt2.decode_bytes(&gpt2.encode(VARIED)), VARIED.as_bytes());
}

#[test]
fn byte_lengths_of_every_token_add_up_to_the_text() {
    let gpt2 = Gpt2Tokenizer::default();
    let lens = gpt2.byte_lens();
    assert_eq!(lens.len(), 50257);
    let ids = gpt2.encode(VARIED);
    let total: u64 = ids.iter().map(|&id| lens[id as usize] as u64).sum();
    assert_eq!(total, VARIED.len() as u64);
    let stream = TokenStream {
        ids: TokenIds::from_u32(ids, 50257),
        byte_lens: Arc::new(lens),
    };
    assert_eq!(stream.total_bytes(), VARIED.len() as u64);
}

#[test]
fn parallel_encoding_equals_whole_text_encoding() {
    let text = VARIED.repeat(40);
    for tokenizer in [TokenizerKind::Gpt2, TokenizerKind::Bytes] {
        let tokenizer = tokenizer.build();
        let whole = tokenizer.encode(&text);
        for chunk in [7, 33, 200] {
            let parallel = encode_parallel(tokenizer.as_ref(), &text, chunk, &|_| {});
            assert_eq!(
                parallel,
                whole,
                "{} with chunks of {chunk} bytes",
                tokenizer.id()
            );
        }
    }
    // Every cut the GPT-2 tokenizer allows is exact; a cut inside a word is not (so the check above
    // could fail if the chunker ignored `can_cut_at`).
    let gpt2 = Gpt2Tokenizer::default();
    let whole = gpt2.encode(VARIED);
    let mut allowed = 0;
    for at in (1..VARIED.len()).filter(|&at| VARIED.is_char_boundary(at)) {
        if gpt2.can_cut_at(VARIED, at) {
            allowed += 1;
            assert_eq!(
                [gpt2.encode(&VARIED[..at]), gpt2.encode(&VARIED[at..])].concat(),
                whole,
                "cut at {at}"
            );
        }
    }
    assert!(allowed > 20, "{allowed}");
    assert_ne!(
        [gpt2.encode("tow"), gpt2.encode("er")].concat(),
        gpt2.encode("tower")
    );
}

#[test]
fn token_ids_use_16_bits_when_the_vocabulary_fits() {
    assert_eq!(TokenIds::from_u32(vec![1, 50256], 50257).width(), 2);
    let wide = TokenIds::from_u32(vec![1, 70000], 100_000);
    assert_eq!(wide.width(), 4);
    assert_eq!(wide.get(1), 70000);
}

#[test]
fn the_token_cache_is_reused_and_rebuilt_when_stale_or_broken() {
    let dir = temp_dir("cache");
    let corpus = dir.join("notes.jsonl");
    let lines: Vec<String> = (0..30)
        .map(|i| {
            format!(
                "{{\"id\":{i},\"text\":\"document {i}: {}\"}}",
                "words ".repeat(i + 3)
            )
        })
        .collect();
    std::fs::write(&corpus, lines.join("\n")).unwrap();
    let source = CorpusSource::Jsonl(corpus.clone());
    let options = quiet(&dir.join("cache"));

    let first = load_corpus(&source, TokenizerKind::Gpt2, &options).unwrap();
    assert_eq!(first.from_cache, [false, false]);
    assert!(first.tokenised_bytes > 0);
    let second = load_corpus(&source, TokenizerKind::Gpt2, &options).unwrap();
    assert_eq!(second.from_cache, [true, true]);
    assert_eq!(second.tokenised_bytes, 0);
    assert_eq!(second.corpus.train.ids, first.corpus.train.ids);
    assert_eq!(second.corpus.valid.ids, first.corpus.valid.ids);

    // Truncate every cache file: detected, rebuilt, same ids.
    let files: Vec<PathBuf> = std::fs::read_dir(dir.join("cache"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        std::fs::write(file, &bytes[..bytes.len() - 3]).unwrap();
        let key = file.file_stem().unwrap().to_str().unwrap();
        assert!(matches!(
            options.cache.load(key, "gpt2", 0, 50257),
            Err(Stale::Corrupt(_)) | Err(Stale::Mismatch(_))
        ));
    }
    let third = load_corpus(&source, TokenizerKind::Gpt2, &options).unwrap();
    assert_eq!(third.from_cache, [false, false]);
    assert_eq!(third.corpus.train.ids, first.corpus.train.ids);

    // Another tokenizer does not take GPT-2's cache.
    let bytes = load_corpus(&source, TokenizerKind::Bytes, &options).unwrap();
    assert_eq!(bytes.from_cache, [false, false]);
    assert_eq!(bytes.corpus.vocab_size, 256);

    // A changed source is re-tokenised.
    std::fs::write(&corpus, lines.join("\n").replace("words", "other")).unwrap();
    let changed = load_corpus(&source, TokenizerKind::Gpt2, &options).unwrap();
    assert_eq!(changed.from_cache, [false, false]);
    assert_ne!(changed.corpus.train.ids, first.corpus.train.ids);
    // No temporary file is left behind.
    for entry in std::fs::read_dir(dir.join("cache")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(name.ends_with(".tok") && !name.starts_with('.'), "{name}");
    }
}

#[test]
fn cache_files_name_why_they_are_stale() {
    let dir = temp_dir("stale");
    let cache = TokenCache::new(&dir);
    let ids = TokenIds::from_u32(vec![5, 6, 7], 256);
    assert_eq!(cache.load("k", "bytes", 1, 256), Err(Stale::Missing));
    cache.store("k", "bytes", 1, &ids).unwrap();
    assert_eq!(cache.load("k", "bytes", 1, 256), Ok(ids));
    assert!(
        matches!(cache.load("k", "gpt2", 1, 256), Err(Stale::Mismatch(m)) if m.contains("tokenizer"))
    );
    assert!(
        matches!(cache.load("k", "bytes", 2, 256), Err(Stale::Mismatch(m)) if m.contains("source"))
    );
    // Truncated, with everything else right: corrupt, not used.
    let bytes = std::fs::read(cache.path("k")).unwrap();
    std::fs::write(cache.path("k"), &bytes[..bytes.len() - 1]).unwrap();
    assert!(
        matches!(cache.load("k", "bytes", 1, 256), Err(Stale::Corrupt(m)) if m.contains("header says"))
    );
    cache
        .store("k", "bytes", 1, &TokenIds::from_u32(vec![5, 6, 7], 256))
        .unwrap();
    // A header whose count overflows is corrupt, not a panic.
    let mut bytes = std::fs::read(cache.path("k")).unwrap();
    bytes[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(cache.path("k"), &bytes).unwrap();
    assert!(matches!(
        cache.load("k", "bytes", 1, 256),
        Err(Stale::Corrupt(_))
    ));
    // The right length but a changed id: the checksum catches it.
    cache
        .store("k", "bytes", 1, &TokenIds::from_u32(vec![5, 6, 7], 256))
        .unwrap();
    let mut bytes = std::fs::read(cache.path("k")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(cache.path("k"), &bytes).unwrap();
    assert!(
        matches!(cache.load("k", "bytes", 1, 256), Err(Stale::Corrupt(m)) if m.contains("checksum"))
    );
    // A whole file with an id the vocabulary does not have: refused before it can index an
    // embedding out of range.
    cache
        .store("k", "bytes", 1, &TokenIds::from_u32(vec![5, 300, 7], 512))
        .unwrap();
    assert!(
        matches!(cache.load("k", "bytes", 1, 256), Err(Stale::Corrupt(m)) if m.contains("id 300"))
    );
    assert!(cache.load("k", "bytes", 1, 512).is_ok());
    std::fs::write(cache.path("k"), b"garbage").unwrap();
    assert!(matches!(
        cache.load("k", "bytes", 1, 256),
        Err(Stale::Corrupt(_))
    ));
}

fn documents(n: usize) -> Vec<Document> {
    (0..n)
        .map(|i| Document {
            text: format!("<doc {i}> body of document {i}"),
            meta: Default::default(),
        })
        .collect()
}

#[test]
fn splits_are_by_document_seeded_and_complete() {
    let options = SplitOptions {
        valid_fraction: 0.2,
        seed: 3,
    };
    let (train, valid) = split_documents("docs", documents(50), options).unwrap();
    let again = split_documents("docs", documents(50), options).unwrap();
    assert_eq!((train.clone(), valid.clone()), again);
    let other =
        split_documents("docs", documents(50), SplitOptions { seed: 4, ..options }).unwrap();
    assert_ne!(valid, other.1);
    let train_docs: Vec<&str> = train.split(DOCUMENT_SEPARATOR).collect();
    let valid_docs: Vec<&str> = valid.split(DOCUMENT_SEPARATOR).collect();
    assert_eq!(valid_docs.len(), 10);
    assert_eq!(train_docs.len(), 40);
    // Every document lands whole in exactly one split.
    for doc in documents(50) {
        let in_train = train_docs.contains(&doc.text.as_str());
        let in_valid = valid_docs.contains(&doc.text.as_str());
        assert!(in_train ^ in_valid, "{}", doc.text);
    }
    // At least one document on each side, however small the fraction.
    let (train, valid) = split_documents(
        "docs",
        documents(3),
        SplitOptions {
            valid_fraction: 0.01,
            seed: 0,
        },
    )
    .unwrap();
    assert_eq!(valid.split(DOCUMENT_SEPARATOR).count(), 1);
    assert_eq!(train.split(DOCUMENT_SEPARATOR).count(), 2);
}

#[test]
fn text_documents_are_the_blocks_between_blank_lines() {
    let dir = temp_dir("text");
    let path = dir.join("play.txt");
    std::fs::write(
        &path,
        "First:\nline one\nline two\n\n\nSecond:\nmore\r\n\r\nThird:\nend\n \n = Fourth = \n",
    )
    .unwrap();
    let docs = read_text_documents(&path).unwrap();
    let texts: Vec<&str> = docs.iter().map(|d| d.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "First:\nline one\nline two",
            "Second:\nmore",
            "Third:\nend",
            " = Fourth = "
        ]
    );
}

#[test]
fn jsonl_keeps_other_fields_as_metadata() {
    let dir = temp_dir("jsonl");
    let path = dir.join("c.jsonl");
    std::fs::write(
        &path,
        "{\"id\":1,\"genre\":\"news\",\"text\":\"a b\"}\n\n{\"text\":\"c\"}\n",
    )
    .unwrap();
    let docs = read_jsonl(&path).unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].text, "a b");
    assert_eq!(docs[0].meta["genre"], "news");
    assert!(!docs[0].meta.contains_key("text"));
}

#[test]
fn every_bad_input_gets_an_error_that_names_it() {
    let dir = temp_dir("errors");
    let split = SplitOptions::default();
    let hub = Hub::default();
    let msg = |e: DataError| e.to_string();

    let missing = dir.join("nope.jsonl");
    let e = read_corpus(&CorpusSource::Jsonl(missing.clone()), split, &hub).unwrap_err();
    assert!(matches!(e, DataError::NotFound { .. }) && msg(e).contains("nope.jsonl"));
    assert!("definitely/not/here.txt".parse::<CorpusSource>().is_err());

    let wiki = CorpusSource::WikiText {
        variant: WikiText::Local,
        dir: Some(dir.join("wiki")),
    };
    let err = read_corpus(&wiki, split, &hub).unwrap_err();
    let advice = coupled_qk_lab::cli::advice(&err).unwrap_or_default();
    let e = msg(err);
    assert!(
        e.contains("wiki") && advice.contains("--data-dir"),
        "{e}\n{advice}"
    );
    std::fs::create_dir_all(dir.join("wiki")).unwrap();
    std::fs::write(dir.join("wiki/wiki.valid.raw"), "only validation").unwrap();
    let err = read_corpus(&wiki, split, &hub).unwrap_err();
    let advice = coupled_qk_lab::cli::advice(&err).unwrap_or_default();
    let e = msg(err);
    assert!(
        e.contains("wiki.train.raw") && advice.contains("--data-dir"),
        "{e}\n{advice}"
    );

    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "\n\n   \n").unwrap();
    let e = read_corpus(&CorpusSource::Text(empty), split, &hub).unwrap_err();
    assert!(matches!(e, DataError::Empty { .. }), "{e}");

    let one = dir.join("one.txt");
    std::fs::write(&one, "a single paragraph\nwith two lines\n").unwrap();
    let e = read_corpus(&CorpusSource::Text(one), split, &hub).unwrap_err();
    assert!(
        matches!(e, DataError::TooFewDocuments { documents: 1, .. }),
        "{e}"
    );

    let latin1 = dir.join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9\n\nmore").unwrap();
    let e = read_corpus(&CorpusSource::Text(latin1), split, &hub).unwrap_err();
    assert!(matches!(e, DataError::InvalidUtf8 { offset: 3, .. }) && msg(e).contains("latin1.txt"));

    let bad = dir.join("bad.jsonl");
    for (content, needle) in [
        (
            "{\"text\":\"ok\"}\n{\"text\":\"ok\"}\n{\"text\": oops}\n",
            "not JSON",
        ),
        ("{\"text\":\"ok\"}\n\n[1,2]\n", "not a JSON object"),
        ("{\"text\":\"ok\"}\n{\"body\":\"x\"}\n", "no \"text\" field"),
        ("{\"text\":\"ok\"}\n{\"text\":7}\n", "not a string"),
    ] {
        std::fs::write(&bad, content).unwrap();
        let e = read_jsonl(&bad).unwrap_err();
        let line = content.lines().count();
        assert!(
            matches!(e, DataError::Jsonl { line: l, .. } if l == line),
            "{e}"
        );
        let text = msg(e);
        assert!(
            text.contains(&format!("bad.jsonl:{line}: ")) && text.contains(needle),
            "{text}"
        );
    }

    let no_text = dir.join("no_text.parquet");
    std::fs::write(&no_text, parquet_of("body", &["x", "y"])).unwrap();
    let e = msg(read_parquet_text(&no_text).unwrap_err());
    assert!(
        e.contains("no_text.parquet") && e.contains("no `text` column") && e.contains("body"),
        "{e}"
    );
    let not_parquet = dir.join("junk.parquet");
    std::fs::write(&not_parquet, b"PAR1 not really").unwrap();
    assert!(msg(read_parquet_text(&not_parquet).unwrap_err()).contains("junk.parquet"));

    let short = byte_stream("0123456789");
    let e = TrainWindows::new(&short, 10, 0).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::TooShort {
                tokens: 10,
                needed: 11,
                ..
            }
        ),
        "{e}"
    );
    assert!(eval_batches(&short, 10, 4, None).is_err());
    assert!(TrainWindows::new(&short, 9, 0).is_ok());

    // A corpus whose validation split is the short one: the error names it all.
    let corpus = TokenizedCorpus {
        name: "tiny-notes".into(),
        tokenizer: "bytes".into(),
        vocab_size: 256,
        train: byte_stream(&"x".repeat(100)),
        valid: short.clone(),
    };
    assert!(corpus.check_context(9).is_ok());
    let e = msg(corpus.check_context(20).unwrap_err());
    for part in ["validation split", "tiny-notes", "bytes", "10 tokens", "21"] {
        assert!(e.contains(part), "`{part}` missing from: {e}");
    }

    assert!(msg("gpt3".parse::<TokenizerKind>().unwrap_err()).contains("gpt2"));
}

#[test]
fn training_windows_are_seeded_contiguous_and_shifted_by_one() {
    let text: String = (0..2000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let stream = byte_stream(&text);
    let windows = TrainWindows::new(&stream, 32, 7).unwrap();
    let batch = windows.batch(5, 4);
    assert_eq!(batch, windows.batch(5, 4));
    assert_ne!(batch.inputs, windows.batch(6, 4).inputs);
    assert_ne!(
        batch.inputs,
        TrainWindows::new(&stream, 32, 8)
            .unwrap()
            .batch(5, 4)
            .inputs
    );
    assert_eq!(
        (batch.rows, batch.seq_len, batch.inputs.len()),
        (4, 32, 128)
    );
    for r in 0..4 {
        let inputs = &batch.inputs[r * 32..(r + 1) * 32];
        let targets = &batch.targets[r * 32..(r + 1) * 32];
        assert_eq!(&inputs[1..], &targets[..31]);
        let window: String = inputs
            .iter()
            .chain(&targets[31..])
            .map(|&b| b as u8 as char)
            .collect();
        assert!(text.contains(&window));
    }
    assert_eq!(batch.target_bytes, 128);
    // Starts spread over the whole stream.
    let firsts: std::collections::HashSet<i64> =
        (0..50).map(|s| windows.batch(s, 1).inputs[0]).collect();
    assert!(firsts.len() > 10);
}

#[test]
fn evaluation_walks_non_overlapping_windows_in_order() {
    let text: String = (0..1000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let stream = byte_stream(&text);
    let batches = eval_batches(&stream, 100, 4, None).unwrap();
    assert_eq!(
        batches.iter().map(|b| b.rows).collect::<Vec<_>>(),
        [4, 4, 1]
    );
    let inputs: Vec<i64> = batches.iter().flat_map(|b| b.inputs.clone()).collect();
    let expected: Vec<i64> = text.bytes().take(900).map(i64::from).collect();
    assert_eq!(inputs, expected);
    assert_eq!(batches.iter().map(|b| b.target_bytes).sum::<u64>(), 900);
    // A cap spreads its windows over the whole stream: 3 of the 9 windows are windows 0, 3 and 6.
    let capped = eval_batches(&stream, 100, 4, Some(3)).unwrap();
    assert_eq!(capped.iter().map(|b| b.rows).sum::<usize>(), 3);
    let firsts: Vec<i64> = capped[0].inputs.chunks(100).map(|w| w[0]).collect();
    let expected: Vec<i64> = [0usize, 300, 600]
        .iter()
        .map(|&i| text.as_bytes()[i] as i64)
        .collect();
    assert_eq!(firsts, expected);
    assert_eq!(capped[0].inputs[200..300], inputs[600..700]);
    assert_eq!(eval_batches(&stream, 100, 4, None).unwrap(), batches);
}

#[test]
fn bits_per_byte_is_total_bits_over_bytes() {
    // Uniform over 256 bytes: 8 bits per byte.
    let nats = 1000.0 * (256f64).ln();
    assert!((bits_per_byte(nats, 1000) - 8.0).abs() < 1e-12);
    assert!((bits_per_byte(nats, 2000) - 4.0).abs() < 1e-12);
}

// ---- the Hub download path, against a loopback server ----

/// Every file under `dir`, following no links.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn hub_for(server: &HubServer, cache: &Path) -> Hub {
    Hub {
        endpoint: Some(server.endpoint()),
        cache_dir: Some(cache.into()),
        progress: false,
    }
}

const WIKI2_VALID: &str = "wikitext-2-raw-v1/validation-00000-of-00001.parquet";

fn wiki_rows() -> Vec<&'static str> {
    vec![
        "",
        " = Robert Boulter = \n",
        "",
        " Robert Boulter is an English actor . \n",
        "",
    ]
}

/// What `wiki.valid.raw` holds for those rows: the Hub stores its blank lines (`" \n"`) as "".
const WIKI_RAW: &str = " \n = Robert Boulter = \n \n Robert Boulter is an English actor . \n \n";

#[test]
fn hub_download_is_cached_and_the_second_run_makes_no_request() {
    let dir = temp_dir("hub");
    let server = HubServer::start(Mode::Serve);
    server.add(WIKI2_VALID, parquet_of("text", &wiki_rows()));
    let hub = hub_for(&server, &dir);
    let text = hub.wikitext_split(WikiText::Wiki2, "validation").unwrap();
    assert_eq!(text, WIKI_RAW);
    let requests = server.requests();
    assert!(requests >= 2, "metadata and body requests, got {requests}");
    let again = hub.wikitext_split(WikiText::Wiki2, "validation").unwrap();
    assert_eq!(again, text);
    assert_eq!(
        server.requests(),
        requests,
        "the second run is served from the cache"
    );
    // hf-hub's cache layout.
    assert!(dir.join("datasets--Salesforce--wikitext").is_dir());
}

#[test]
fn failed_downloads_name_the_url_and_leave_nothing_usable() {
    let dir = temp_dir("hub-fail");
    // 404.
    let server = HubServer::start(Mode::Serve);
    let e = hub_for(&server, &dir)
        .wikitext_split(WikiText::Wiki2, "validation")
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, DataError::Download { .. }), "{text}");
    assert!(
        text.contains(&server.endpoint()) && text.contains(WIKI2_VALID) && text.contains("404"),
        "{text}"
    );
    let advice = coupled_qk_lab::cli::advice(&e).unwrap_or_default();
    assert!(
        text.contains("WikiText folder") && advice.contains("--data-dir"),
        "says how to run offline: {text}\n{advice}"
    );

    // No server at all.
    let closed = HubServer::closed_endpoint();
    let hub = Hub {
        endpoint: Some(closed.clone()),
        cache_dir: Some(dir.clone()),
        progress: false,
    };
    let e = hub
        .wikitext_split(WikiText::Wiki2, "validation")
        .unwrap_err()
        .to_string();
    assert!(e.contains(&closed), "{e}");

    // A body cut short: never taken for the whole file; the next good run downloads it.
    let truncating = HubServer::start(Mode::Truncate);
    truncating.add(WIKI2_VALID, parquet_of("text", &wiki_rows()));
    let e = hub_for(&truncating, &dir)
        .wikitext_split(WikiText::Wiki2, "validation")
        .unwrap_err();
    assert!(
        matches!(e, DataError::Download { .. }) && e.to_string().contains(WIKI2_VALID),
        "{e}"
    );
    // Cut short with no length announced: hf-hub keeps the file, the parquet check rejects it and
    // removes it from the cache (else the next run would be served the broken file).
    let silent = HubServer::start(Mode::TruncateSilently);
    silent.add(WIKI2_VALID, parquet_of("text", &wiki_rows()));
    let e = hub_for(&silent, &dir)
        .wikitext_split(WikiText::Wiki2, "validation")
        .unwrap_err()
        .to_string();
    assert!(e.contains("incomplete") && e.contains("removed"), "{e}");
    // A whole file that does not read as this program expects (here: no `text` column) is
    // reported and kept: only a file proven truncated is deleted from the user's cache.
    let odd = HubServer::start(Mode::Serve);
    odd.add(WIKI2_VALID, parquet_of("body", &wiki_rows()));
    let odd_dir = dir.join("odd");
    let e = hub_for(&odd, &odd_dir)
        .wikitext_split(WikiText::Wiki2, "validation")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`text` column") && e.contains("kept"), "{e}");
    let kept: Vec<_> = walk(&odd_dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "parquet") && p.exists())
        .collect();
    assert_eq!(kept.len(), 1, "the whole file stays in the cache: {kept:?}");
    let good = HubServer::start(Mode::Serve);
    good.add(WIKI2_VALID, parquet_of("text", &wiki_rows()));
    let text = hub_for(&good, &dir)
        .wikitext_split(WikiText::Wiki2, "validation")
        .unwrap();
    assert_eq!(text, WIKI_RAW);
}

/// Two runs started together on an empty cache: hf-hub lets one download and gives the other a
/// lock error after 5 s; the loader waits for the download instead of failing.
#[test]
fn two_downloads_of_one_file_at_once_both_succeed() {
    let dir = temp_dir("hub-together");
    // Long enough that the second caller's 5 s of hf-hub lock attempts run out.
    let server = HubServer::start(Mode::Slow(7_000));
    server.add(WIKI2_VALID, parquet_of("text", &wiki_rows()));
    let hub = hub_for(&server, &dir);
    let texts: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| hub.wikitext_split(WikiText::Wiki2, "validation")))
            .collect();
        runs.into_iter()
            .map(|run| run.join().unwrap().unwrap())
            .collect()
    });
    assert_eq!(texts, [WIKI_RAW, WIKI_RAW]);
}

/// Runs in a child process (so setting variables races with no other test): hf-hub's
/// `ApiBuilder::from_env` must see `HF_ENDPOINT` and `HF_HOME`.
#[test]
fn hub_honours_hf_endpoint_and_hf_home() {
    let dir = temp_dir("hub-env");
    let server = HubServer::start(Mode::Serve);
    server.add(WIKI2_VALID, parquet_of("text", &wiki_rows()));
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hub_child_with_environment",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HF_ENDPOINT", server.endpoint())
        .env("HF_HOME", &dir)
        .env("COUPLED_QK_HUB_CHILD", "1")
        .status()
        .unwrap();
    assert!(status.success());
    assert!(server.requests() >= 2);
    assert!(
        dir.join("hub/datasets--Salesforce--wikitext").is_dir(),
        "downloaded under $HF_HOME/hub"
    );
}

#[test]
#[ignore = "run by hub_honours_hf_endpoint_and_hf_home in a child process"]
fn hub_child_with_environment() {
    if std::env::var_os("COUPLED_QK_HUB_CHILD").is_none() {
        return;
    }
    let text = Hub::default()
        .wikitext_split(WikiText::Wiki2, "validation")
        .unwrap();
    assert_eq!(text, WIKI_RAW);
}

// ---- real text: the shipped corpus, WikiText fixtures, the data folder ----

#[test]
fn the_shipped_corpus_is_read_by_name_split_and_tokenised() {
    for name in ["shakespeare", "tinyshakespeare"] {
        assert_eq!(
            name.parse::<CorpusSource>().unwrap(),
            CorpusSource::Embedded(EmbeddedCorpus::TinyShakespeare)
        );
    }
    let source = CorpusSource::Embedded(EmbeddedCorpus::TinyShakespeare);
    assert_eq!(source.name(), "tinyshakespeare");
    let text = EmbeddedCorpus::TinyShakespeare.text();
    assert_eq!(text.len(), 1_115_394, "char-rnn's input.txt, byte for byte");
    assert!(text.starts_with("First Citizen:\nBefore we proceed any further, hear me speak."));
    // Its documents are the speeches; every one lands in exactly one split, whole.
    let documents = text_documents(text);
    assert!(documents.len() > 7_000, "{}", documents.len());
    let corpus = read_corpus(&source, SplitOptions::default(), &Hub::default()).unwrap();
    let joined: usize = documents.iter().map(|d| d.text.len()).sum::<usize>()
        + DOCUMENT_SEPARATOR.len() * (documents.len() - 2);
    assert_eq!(corpus.train.len() + corpus.valid.len(), joined);
    let valid_share = corpus.valid.len() as f64 / joined as f64;
    assert!((0.05..0.15).contains(&valid_share), "{valid_share}");

    let dir = temp_dir("shipped");
    let loaded = load_corpus(&source, TokenizerKind::Bytes, &quiet(&dir)).unwrap();
    assert_eq!(loaded.corpus.name, "tinyshakespeare");
    assert_eq!(loaded.corpus.train.len(), corpus.train.len());
    let gpt2 = Gpt2Tokenizer::default();
    let ids = tokenise(&gpt2, &corpus.valid, false, "tinyshakespeare valid");
    assert!(
        (corpus.valid.len() / 5..corpus.valid.len() / 2).contains(&ids.len()),
        "{} GPT-2 tokens for {} bytes",
        ids.len(),
        corpus.valid.len()
    );
    assert_eq!(gpt2.decode_bytes(&ids.to_u32()), corpus.valid.as_bytes());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// WikiText-2 in its original layout, cut to one article a split (tests/fixtures/wikitext-2).
fn wikitext_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wikitext-2")
}

#[test]
fn a_wikitext_folder_in_the_original_layout_loads_as_wikitext() {
    let dir = wikitext_fixture();
    let source: CorpusSource = dir.to_str().unwrap().parse().unwrap();
    assert_eq!(
        source,
        CorpusSource::WikiText {
            variant: WikiText::Local,
            dir: Some(dir.clone())
        }
    );
    // `--corpus wikitext-2 --data-dir DIR` is the same folder under WikiText-2's name.
    let named = "wikitext-2"
        .parse::<CorpusSource>()
        .unwrap()
        .with_data_dir(Some(dir.clone()))
        .unwrap();
    assert_eq!(named.name(), "wikitext-2");
    let valid = read_wikitext_split(&dir, "valid").unwrap();
    assert_eq!(
        valid.len() as u64,
        std::fs::metadata(dir.join("wiki.valid.tokens"))
            .unwrap()
            .len()
    );
    assert!(valid.starts_with(" \n = Homarus gammarus = \n"));
    let cache = temp_dir("wikitext-fixture");
    let loaded = load_corpus(&named, TokenizerKind::Gpt2, &quiet(&cache)).unwrap();
    let gpt2 = Gpt2Tokenizer::default();
    assert_eq!(
        gpt2.decode_bytes(&loaded.corpus.valid.ids.to_u32()),
        valid.as_bytes()
    );
    // Whitespace tokens, `<unk>` and headings: BPE takes fewer ids than bytes, more than words.
    let words = valid.split_whitespace().count();
    let ids = loaded.corpus.valid.len();
    assert!(
        (words..valid.len() / 2).contains(&ids),
        "{ids} ids, {words} words"
    );
    std::fs::remove_dir_all(&cache).unwrap();
}

/// Runs in a child process (setting a variable races with no other test): `sotu` and `brown`
/// are read from `$COUPLED_QK_DATA`, and a missing one is an error that says how to get it.
#[test]
fn named_corpora_are_read_from_the_data_folder() {
    let dir = temp_dir("data-folder");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "data_folder_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("COUPLED_QK_DATA", &dir)
        .env("COUPLED_QK_DATA_CHILD", "1")
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "run by named_corpora_are_read_from_the_data_folder in a child process"]
fn data_folder_child() {
    if std::env::var_os("COUPLED_QK_DATA_CHILD").is_none() {
        return;
    }
    let dir = PathBuf::from(std::env::var_os("COUPLED_QK_DATA").unwrap());
    assert_eq!(data_dir(), dir);
    let err = "sotu".parse::<CorpusSource>().unwrap_err();
    assert!(matches!(err, DataError::NotFetched { .. }), "{err}");
    let message = err.to_string();
    for part in [
        "`sotu`",
        "State of the Union",
        "docs/data.md",
        "COUPLED_QK_DATA",
    ] {
        assert!(message.contains(part), "{part} not in: {message}");
    }
    assert!(
        message.contains(&dir.join("sotu.jsonl").display().to_string()),
        "{message}"
    );
    std::fs::write(
        dir.join("sotu.jsonl"),
        "{\"year\": 1790, \"text\": \"Fellow-Citizens of the Senate.\"}\n\
         {\"year\": 1791, \"text\": \"Fellow-Citizens of the House.\"}\n",
    )
    .unwrap();
    let source: CorpusSource = "sotu".parse().unwrap();
    assert_eq!(source, CorpusSource::Jsonl(dir.join("sotu.jsonl")));
    assert_eq!(source.name(), "sotu");
    let text = read_corpus(&source, SplitOptions::default(), &Hub::default()).unwrap();
    assert!(text.train.starts_with("Fellow-Citizens") && text.valid.starts_with("Fellow-Citizens"));
    assert!("brown".parse::<CorpusSource>().is_err());
}

/// The larger corpora of the results, when `COUPLED_QK_DATA` holds them
/// (`scripts/fetch_corpora.sh`): their documents and metadata as the results describe them.
#[test]
#[ignore = "reads sotu.jsonl and brown.jsonl from $COUPLED_QK_DATA (scripts/fetch_corpora.sh)"]
fn fetched_corpora_hold_what_the_results_describe() {
    let data = data_dir();
    let sotu = read_jsonl(&data.join("sotu.jsonl")).unwrap();
    assert_eq!(sotu.len(), 233);
    assert!(sotu.iter().all(|d| d.meta.contains_key("year")));
    let brown = read_jsonl(&data.join("brown.jsonl")).unwrap();
    assert_eq!(brown.len(), 500);
    let genres: std::collections::HashSet<String> =
        brown.iter().map(|d| d.meta["genre"].to_string()).collect();
    assert_eq!(genres.len(), 15);
}

/// The GPT-2 fixture of the layer crate's tests (tests/reference/gpt2_tiny.py).
fn gpt2_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gpt2-tiny")
}

#[test]
fn a_gpt2_checkpoint_is_found_in_a_folder_beside_a_file_or_on_the_hub() {
    use coupled_qk_lab::pretrained::Gpt2Checkpoint;
    let local = Gpt2Checkpoint::locate(gpt2_fixture().to_str().unwrap(), &Hub::default()).unwrap();
    let c = &local.config;
    assert_eq!(
        (c.vocab_size, c.context, c.d_model, c.n_layers, c.n_heads),
        (256, 32, 64, 2, 2)
    );
    let file = gpt2_fixture().join("model.safetensors");
    let beside = Gpt2Checkpoint::locate(file.to_str().unwrap(), &Hub::default()).unwrap();
    assert_eq!(beside.weights, file);

    // From the (loopback) Hub: both files downloaded into the cache, the same model.
    let dir = temp_dir("gpt2-hub");
    let server = HubServer::start(Mode::Serve);
    for name in ["config.json", "model.safetensors"] {
        server.add_model_file(
            "tiny/gpt2",
            name,
            std::fs::read(gpt2_fixture().join(name)).unwrap(),
        );
    }
    let hub = hub_for(&server, &dir);
    let remote = Gpt2Checkpoint::locate("tiny/gpt2", &hub).unwrap();
    assert!(
        remote.weights.starts_with(&dir),
        "{}",
        remote.weights.display()
    );
    assert_eq!(
        std::fs::read(&remote.weights).unwrap(),
        std::fs::read(&file).unwrap()
    );
    assert_eq!(remote.config.d_model, 64);

    // A truncated download is an error, never a checkpoint.
    let truncating = HubServer::start(Mode::Truncate);
    truncating.add_model_file(
        "tiny/gpt2",
        "model.safetensors",
        std::fs::read(&file).unwrap(),
    );
    let cut = temp_dir("gpt2-cut");
    let err = Gpt2Checkpoint::locate("tiny/gpt2", &hub_for(&truncating, &cut)).unwrap_err();
    assert!(matches!(err, DataError::Download { .. }), "{err}");
    std::fs::remove_dir_all(&cut).unwrap();

    let err = Gpt2Checkpoint::locate("no-such-folder", &Hub::default()).unwrap_err();
    assert!(err.to_string().contains("no-such-folder"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_leading_byte_order_mark_is_not_text() {
    let dir = temp_dir("bom");
    let text = dir.join("bom.txt");
    std::fs::write(&text, "\u{feff}First speech\n\nSecond speech\n").unwrap();
    let documents = read_text_documents(&text).unwrap();
    assert_eq!(documents[0].text, "First speech");
    let jsonl = dir.join("bom.jsonl");
    std::fs::write(&jsonl, "\u{feff}{\"text\": \"one\"}\n{\"text\": \"two\"}\n").unwrap();
    let documents = read_jsonl(&jsonl).unwrap();
    assert_eq!(documents[0].text, "one");
    // Only a leading mark is dropped; one inside the text is text.
    std::fs::write(&text, "a\u{feff}b\n\nc\n").unwrap();
    assert_eq!(read_text_documents(&text).unwrap()[0].text, "a\u{feff}b");
    std::fs::remove_dir_all(&dir).unwrap();
}
