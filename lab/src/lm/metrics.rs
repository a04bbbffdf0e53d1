//! `metrics.csv`: one row every `log_every` steps and at every evaluation.
//!
//! Numbers are written in Rust's shortest round-trip form, so reading a row back gives the very
//! same `f64`s (the resume test compares losses bit for bit through this file).

use super::csv_row::{RowError, fields, number};
use super::{TrainError, Validation};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The header, exactly.
pub const HEADER: &str =
    "step,tokens,lr,train_loss,val_loss,val_ppl,val_bpb,tokens_per_s,elapsed_s";

/// One row of `metrics.csv`.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsRow {
    /// Steps done (1-based: the row is written after the step's update).
    pub step: usize,
    /// Training tokens seen so far.
    pub tokens: u64,
    /// The learning rate of this step's update.
    pub lr: f64,
    /// The mean training loss over the steps since the previous row (this step's alone when
    /// `log_every` is 1).
    pub train_loss: f64,
    /// The evaluation at this step, if there was one (empty fields otherwise).
    pub val: Option<Validation>,
    /// Training throughput since the previous row (tokens per second of training, evaluation and
    /// checkpointing left out).
    pub tokens_per_s: f64,
    /// Wall-clock seconds since the run started, summed over resumes.
    pub elapsed_s: f64,
}

impl MetricsRow {
    /// The CSV line, without its newline.
    pub fn to_csv(&self) -> String {
        let (val_loss, val_ppl, val_bpb) = match &self.val {
            Some(v) => (v.loss.to_string(), v.ppl.to_string(), v.bpb.to_string()),
            None => Default::default(),
        };
        format!(
            "{},{},{},{},{val_loss},{val_ppl},{val_bpb},{},{}",
            self.step, self.tokens, self.lr, self.train_loss, self.tokens_per_s, self.elapsed_s
        )
    }

    /// Parses a line written by [`to_csv`](Self::to_csv).
    ///
    /// # Errors
    /// A row of another field count, or a field that is not a number.
    pub fn parse(line: &str) -> Result<Self, RowError> {
        let fields = fields(line, 9)?;
        let val = if fields[4].is_empty() {
            None
        } else {
            Some(Validation {
                loss: number("val_loss", fields[4])?,
                ppl: number("val_ppl", fields[5])?,
                bpb: number("val_bpb", fields[6])?,
            })
        };
        Ok(MetricsRow {
            step: number("step", fields[0])?,
            tokens: number("tokens", fields[1])?,
            lr: number("lr", fields[2])?,
            train_loss: number("train_loss", fields[3])?,
            val,
            tokens_per_s: number("tokens_per_s", fields[7])?,
            elapsed_s: number("elapsed_s", fields[8])?,
        })
    }
}

/// Reads every row of a `metrics.csv`.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsRow>, TrainError> {
    read_metrics_until(path, usize::MAX)
}

/// Reads the rows of a `metrics.csv` up to step `last_step`, as a resume from that step's
/// checkpoint needs: rows past it (written after the checkpoint, by a run that was then
/// interrupted) are dropped unparsed, and so is a torn last line (a kill in mid-write), with a
/// warning. Any other unreadable row is an error naming its line.
pub fn read_metrics_until(path: &Path, last_step: usize) -> Result<Vec<MetricsRow>, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io("read", path, e))?;
    let corrupt = |message: String| TrainError::Corrupt {
        path: path.to_path_buf(),
        message,
        hint: "restore it or delete the run folder and start again",
    };
    let mut lines = text.lines();
    match lines.next() {
        Some(h) if h.trim_end_matches('\r') == HEADER => {}
        other => return Err(corrupt(format!("header is {other:?}, expected {HEADER:?}"))),
    }
    let rows: Vec<(usize, &str)> = lines
        .enumerate()
        .map(|(i, l)| (i + 2, l))
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let torn_last = !text.ends_with('\n');
    let mut out = Vec::new();
    for (k, &(number, line)) in rows.iter().enumerate() {
        let step = line.split(',').next().and_then(|s| s.parse::<usize>().ok());
        if step.is_some_and(|s| s > last_step) {
            continue;
        }
        match MetricsRow::parse(line) {
            Ok(row) => out.push(row),
            Err(_) if torn_last && k + 1 == rows.len() => eprintln!(
                "warning: {}: line {number} is incomplete (the run was stopped while writing \
                 it); dropped",
                path.display()
            ),
            Err(m) => return Err(corrupt(format!("line {number}: {m}"))),
        }
    }
    Ok(out)
}

/// `metrics.csv`, open for appending.
pub struct MetricsLog {
    file: File,
    path: PathBuf,
}

impl MetricsLog {
    /// Writes the header and `rows` atomically (a fresh run has none; a resumed one keeps the
    /// rows up to its checkpoint), then opens the file for appending.
    pub fn create(path: &Path, rows: &[MetricsRow]) -> Result<Self, TrainError> {
        let mut text = format!("{HEADER}\n");
        for row in rows {
            text.push_str(&row.to_csv());
            text.push('\n');
        }
        crate::atomic::write(path, text.as_bytes())
            .map_err(|e| TrainError::io("write", path, e))?;
        let file = File::options()
            .append(true)
            .open(path)
            .map_err(|e| TrainError::io("open", path, e))?;
        Ok(MetricsLog {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Appends a row (unbuffered: a crash loses no written row).
    pub fn append(&mut self, row: &MetricsRow) -> Result<(), TrainError> {
        writeln!(self.file, "{}", row.to_csv()).map_err(|e| TrainError::io("write", &self.path, e))
    }

    /// Flushes the rows to disk: called before a checkpoint, which vouches for them.
    pub fn sync(&mut self) -> Result<(), TrainError> {
        self.file
            .sync_data()
            .map_err(|e| TrainError::io("sync", &self.path, e))
    }
}
