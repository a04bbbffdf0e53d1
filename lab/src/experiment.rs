//! Experiments as files: one program's command line written as TOML, checked in under
//! `experiments/`, so that a table of the results names the file that produced it.
//!
//! ```toml
//! # experiments/sotu-affine-control-six-seeds.toml
//! program = "ablations"
//! corpus = "sotu"
//! variants = ["affine-uncoupled", "affine", "standard"]
//! seeds = [0, 1, 2, 3, 4, 5]
//! max_steps = 1500
//! ```
//!
//! Every key but `program` is a flag of that program with `_` for `-` (`max_steps` is
//! `--max-steps`); arrays are comma lists; an on/off flag takes only `true` (given) or `false`
//! (left out), never a string or number. A program that takes [`ExperimentArgs`] reads its file
//! with [`parse_args`]: the file's flags first, then those of the command line, which override
//! the file's (`ablations experiments/x.toml --seeds 6,7`). `--print-command` prints the command
//! the file and the flags stand for and stops.

use clap::Parser;
use clap::parser::ValueSource;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The arguments of a program that reads experiment files (flatten it into the program's
/// `Args` with `#[command(flatten)]`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ExperimentArgs {
    /// An experiment file (experiments/*.toml): the flags of this program as TOML keys; flags
    /// given after it override its values.
    #[arg(value_name = "EXPERIMENT.toml")]
    pub experiment: Option<PathBuf>,
    /// Print the command line the experiment file and the flags stand for, and stop.
    #[arg(long)]
    pub print_command: bool,
}

/// An experiment file that cannot be used, naming the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// The file cannot be read.
    #[error("cannot read the experiment file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Not TOML.
    #[error("{} is not valid TOML: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// The file is another program's experiment, or names none.
    #[error(
        "{} is an experiment of `{found}`, not of `{expected}`: run it with \
         `cargo run --release --example {found} -- {}`",
        path.display(),
        path.display()
    )]
    OtherProgram {
        /// The file.
        path: PathBuf,
        /// The program reading it.
        expected: String,
        /// The program the file names.
        found: String,
    },
    /// A key that is no flag of the program.
    #[error(
        "{}: `{key}` is not a flag of `{program}` (its flags, as keys: {known})",
        path.display()
    )]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The program.
        program: String,
        /// The keys it accepts.
        known: String,
    },
    /// An on/off flag given anything but a TOML boolean: a string `"false"` or a number would
    /// otherwise turn the flag on.
    #[error(
        "{}: `{key}` = {value}: `--{long}` is an on/off flag and takes only a TOML boolean: \
         write `{key} = true` or `{key} = false` (no quotes)",
        path.display()
    )]
    NotBoolean {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The flag's long name.
        long: String,
        /// The value as written.
        value: String,
    },
    /// A value of a type no flag takes (a table, a date, a nested array).
    #[error("{}: `{key}` = {value}: expected a string, number, boolean or array of them", path.display())]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The value as written.
        value: String,
    },
    /// The program refuses the file's flags (clap's message names the flag).
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What the program says.
        message: String,
    },
}

/// The program's arguments from the process's command line, with its experiment file's flags
/// (see the module docs); exits as clap does on `--help` or a bad flag, and with the file's error
/// on a bad file. With `--print-command` it prints the merged command and exits.
pub fn parse_args<A: Parser>(program: &str) -> A {
    let argv: Vec<OsString> = std::env::args_os().collect();
    match try_parse_args::<A>(program, argv) {
        Ok((args, None)) => args,
        Ok((_, Some(command))) => {
            println!("{command}");
            std::process::exit(0);
        }
        Err(ParseError::Clap(e)) => e.exit(),
        Err(ParseError::Experiment(e)) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}

/// Why [`try_parse_args`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// A bad command line (or `--help`, `--version`).
    #[error(transparent)]
    Clap(#[from] clap::Error),
    /// A bad experiment file.
    #[error(transparent)]
    Experiment(#[from] ExperimentError),
}

/// [`parse_args`] on `argv` (the program's name first), returning the arguments and, with
/// `--print-command`, the command line they stand for.
///
/// # Errors
/// A bad command line, or an experiment file that cannot be read, is another program's, has a
/// key that is no flag of the program, or a value the program refuses.
pub fn try_parse_args<A: Parser>(
    program: &str,
    argv: Vec<OsString>,
) -> Result<(A, Option<String>), ParseError> {
    let command = A::command();
    let matches = command.clone().try_get_matches_from(&argv)?;
    let Some(path) = experiment_of(&matches) else {
        let print = print_command(&matches);
        let args = A::from_arg_matches(&matches)?;
        return Ok((args, print.then(|| shell_line(program, &argv[1..]))));
    };
    let from_file = file_flags(program, &path, &command)?;
    // The file's flags alone must parse: then a refusal names the file.
    let mut alone = vec![argv[0].clone()];
    alone.extend(from_file.iter().flat_map(|(_, flag)| flag.iter().cloned()));
    if let Err(e) = command.clone().try_get_matches_from(&alone) {
        return Err(ExperimentError::Invalid {
            path,
            message: e.render().to_string().trim().to_string(),
        }
        .into());
    }
    // Flags of the command line win: the file's go in only where the line has none.
    let mut merged = vec![argv[0].clone()];
    for (id, flag) in &from_file {
        if matches.value_source(id) != Some(ValueSource::CommandLine) {
            merged.extend(flag.iter().cloned());
        }
    }
    let experiment = path.as_os_str().to_owned();
    merged.extend(argv[1..].iter().filter(|a| **a != experiment).cloned());
    let matches = command.try_get_matches_from(&merged)?;
    let print = print_command(&matches);
    let args = A::from_arg_matches(&matches)?;
    let shown: Vec<OsString> = merged[1..]
        .iter()
        .filter(|a| *a != "--print-command")
        .cloned()
        .collect();
    Ok((args, print.then(|| shell_line(program, &shown))))
}

/// The experiment file given, where the program flattens [`ExperimentArgs`].
fn experiment_of(matches: &clap::ArgMatches) -> Option<PathBuf> {
    matches
        .try_get_one::<PathBuf>("experiment")
        .ok()
        .flatten()
        .cloned()
}

fn print_command(matches: &clap::ArgMatches) -> bool {
    matches
        .try_get_one::<bool>("print_command")
        .ok()
        .flatten()
        .copied()
        .unwrap_or(false)
}

/// The file's keys as (argument id, command-line words), in the file's order.
fn file_flags(
    program: &str,
    path: &Path,
    command: &clap::Command,
) -> Result<Vec<(String, Vec<OsString>)>, ExperimentError> {
    let text = std::fs::read_to_string(path).map_err(|source| ExperimentError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ExperimentError::Syntax {
                path: path.to_path_buf(),
                message: e.to_string().trim().to_string(),
            })?;
    let found = table.get("program").and_then(toml::Value::as_str);
    if found != Some(program) {
        return Err(ExperimentError::OtherProgram {
            path: path.to_path_buf(),
            expected: program.to_string(),
            found: found
                .unwrap_or("no program (add `program = \"...\"`)")
                .to_string(),
        });
    }
    let flags: Vec<&clap::Arg> = command
        .get_arguments()
        .filter(|a| a.get_long().is_some() && a.get_id() != "print_command")
        .collect();
    let mut out = Vec::new();
    for (key, value) in table.iter().filter(|(k, _)| *k != "program") {
        let Some(arg) = flags.iter().find(|a| a.get_id().as_str() == key) else {
            let known: Vec<&str> = flags.iter().map(|a| a.get_id().as_str()).collect();
            return Err(ExperimentError::UnknownKey {
                path: path.to_path_buf(),
                key: key.clone(),
                program: program.to_string(),
                known: known.join(", "),
            });
        };
        let long = format!("--{}", arg.get_long().expect("filtered on a long name"));
        let bad = || ExperimentError::BadValue {
            path: path.to_path_buf(),
            key: key.clone(),
            value: value.to_string(),
        };
        // Values go in as one word, `--flag=value`, so that no value (a `false`, a `-5`) can
        // become the positional argument or be read as a flag: each reaches the flag's own parser.
        let words: Vec<OsString> = if arg.get_action().takes_values() {
            let value = match value {
                toml::Value::Array(items) => {
                    let items: Option<Vec<String>> = items.iter().map(scalar).collect();
                    items.ok_or_else(bad)?.join(",")
                }
                other => scalar(other).ok_or_else(bad)?,
            };
            vec![format!("{long}={value}").into()]
        } else {
            match value {
                toml::Value::Boolean(true) => vec![long.into()],
                toml::Value::Boolean(false) => Vec::new(),
                other => {
                    return Err(ExperimentError::NotBoolean {
                        path: path.to_path_buf(),
                        key: key.clone(),
                        long: long.trim_start_matches('-').to_string(),
                        value: other.to_string(),
                    });
                }
            }
        };
        out.push((arg.get_id().to_string(), words));
    }
    Ok(out)
}

/// A string, number or boolean as a command-line word.
fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `cargo run --release --example PROGRAM -- WORDS`, quoted for a POSIX shell where needed.
fn shell_line(program: &str, words: &[OsString]) -> String {
    let quote = |word: &OsString| {
        let word = word.to_string_lossy();
        let plain = !word.is_empty()
            && word
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.,:/=+@%".contains(c));
        if plain {
            word.into_owned()
        } else {
            format!("'{}'", word.replace('\'', r"'\''"))
        }
    };
    let words: Vec<String> = words.iter().map(quote).collect();
    format!(
        "cargo run --release --example {program} -- {}",
        words.join(" ")
    )
}
