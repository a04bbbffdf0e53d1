//! Why a row of `metrics.csv` or `dynamics.csv` does not parse.

use std::str::FromStr;

/// A CSV row of the run folder that does not parse, naming the column.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    /// Another number of fields than the header has.
    #[error("expected {expected} fields, found {found}")]
    Fields {
        /// The header's count.
        expected: usize,
        /// The row's.
        found: usize,
    },
    /// A field that is not a number.
    #[error("{column} `{text}` is not a number")]
    NotANumber {
        /// The column.
        column: &'static str,
        /// The text found.
        text: String,
    },
}

/// The fields of `line` (a trailing `\r` dropped), which must be `expected` many.
pub(super) fn fields(line: &str, expected: usize) -> Result<Vec<&str>, RowError> {
    let fields: Vec<&str> = line.trim_end_matches('\r').split(',').collect();
    if fields.len() != expected {
        return Err(RowError::Fields {
            expected,
            found: fields.len(),
        });
    }
    Ok(fields)
}

/// `text` as a number of column `column`.
pub(super) fn number<T: FromStr>(column: &'static str, text: &str) -> Result<T, RowError> {
    text.parse().map_err(|_| RowError::NotANumber {
        column,
        text: text.to_string(),
    })
}
