//! A loopback HTTP server in the Hugging Face Hub's layout (`/datasets/{repo}/resolve/main/{file}`),
//! answering hf-hub's range requests, for tests of the download path with no network.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How the server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Serve files whole.
    Serve,
    /// Announce the full length but send only half of each body, then hang up.
    Truncate,
    /// Send half of each body with no length announced, then hang up: the client cannot tell.
    TruncateSilently,
    /// Serve files whole, each body after a pause of this many milliseconds.
    Slow(u64),
}

/// The server; it lives until the test process ends.
pub struct HubServer {
    port: u16,
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    requests: Arc<AtomicUsize>,
}

const PREFIX: &str = "/datasets/Salesforce/wikitext/resolve/main/";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

impl HubServer {
    /// Starts serving on an ephemeral port of 127.0.0.1.
    pub fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let files: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let requests = Arc::new(AtomicUsize::new(0));
        let (f, r) = (Arc::clone(&files), Arc::clone(&requests));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                r.fetch_add(1, Ordering::SeqCst);
                let files = Arc::clone(&f);
                std::thread::spawn(move || {
                    let _ = answer(stream, &files, mode);
                });
            }
        });
        HubServer {
            port,
            files,
            requests,
        }
    }

    /// An endpoint where nothing listens.
    pub fn closed_endpoint() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        format!("http://127.0.0.1:{port}")
    }

    /// The endpoint to give hf-hub.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Serves `bytes` as `file` of `Salesforce/wikitext`.
    pub fn add(&self, file: &str, bytes: Vec<u8>) {
        self.files
            .lock()
            .unwrap()
            .insert(format!("{PREFIX}{file}"), bytes);
    }

    /// Serves `bytes` as `file` of the model repository `repo` (e.g. `openai-community/gpt2`).
    pub fn add_model_file(&self, repo: &str, file: &str, bytes: Vec<u8>) {
        self.files
            .lock()
            .unwrap()
            .insert(format!("/{repo}/resolve/main/{file}"), bytes);
    }

    /// Connections accepted so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn answer(
    stream: TcpStream,
    files: &Mutex<HashMap<String, Vec<u8>>>,
    mode: Mode,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_string();
    let mut range: Option<(usize, Option<usize>)> = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(spec) = lower.strip_prefix("range: bytes=") {
            let (start, end) = spec.trim().split_once('-').unwrap_or(("0", ""));
            range = Some((start.parse().unwrap_or(0), end.parse().ok()));
        }
    }
    let mut out = stream;
    let file = files.lock().unwrap().get(&path).cloned();
    let Some(bytes) = file else {
        let body = b"Entry not found";
        write!(
            out,
            "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )?;
        return out.write_all(body);
    };
    let n = bytes.len();
    let (start, end) = match range {
        Some((start, end)) => (start.min(n), end.map_or(n - 1, |e| e.min(n - 1))),
        None => (0, n - 1),
    };
    let body = &bytes[start..=end];
    let whole_file_request = body.len() > 1;
    let length = if mode == Mode::TruncateSilently && whole_file_request {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    write!(
        out,
        "HTTP/1.1 206 Partial Content\r\n{length}Content-Range: bytes {start}-{end}/{n}\r\n\
         ETag: \"{:016x}\"\r\nX-Repo-Commit: {COMMIT}\r\nConnection: close\r\n\r\n",
        fnv(&bytes)
    )?;
    if let Mode::Slow(ms) = mode
        && whole_file_request
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    if matches!(mode, Mode::Truncate | Mode::TruncateSilently) && whole_file_request {
        out.write_all(&body[..body.len() / 2])?;
    } else {
        out.write_all(body)?;
    }
    out.flush()
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// A parquet file (snappy-compressed) with one UTF-8 string column `column`, one row per entry.
pub fn parquet_of(column: &str, rows: &[&str]) -> Vec<u8> {
    use parquet::basic::Compression;
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    let schema = Arc::new(
        parse_message_type(&format!(
            "message schema {{ REQUIRED BYTE_ARRAY {column} (UTF8); }}"
        ))
        .unwrap(),
    );
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let mut buffer = Vec::new();
    let mut writer = SerializedFileWriter::new(&mut buffer, schema, props).unwrap();
    let mut group = writer.next_row_group().unwrap();
    let mut col = group.next_column().unwrap().unwrap();
    let values: Vec<ByteArray> = rows.iter().map(|r| ByteArray::from(*r)).collect();
    col.typed::<ByteArrayType>()
        .write_batch(&values, None, None)
        .unwrap();
    col.close().unwrap();
    group.close().unwrap();
    writer.close().unwrap();
    buffer
}
