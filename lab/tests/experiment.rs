//! Experiment files: a program's flags as TOML, overridden by the command line, with errors that
//! name the file and the key.

use clap::Parser;
use coupled_qk_lab::experiment::{ExperimentArgs, ExperimentError, ParseError, try_parse_args};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// A program's arguments, as the example programs declare them.
#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value = "shakespeare")]
    corpus: String,
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    seeds: Vec<u64>,
    #[arg(long, default_value_t = 400)]
    max_steps: usize,
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    #[arg(long)]
    retry_failed: bool,
    #[command(flatten)]
    experiment: ExperimentArgs,
}

fn file(name: &str, text: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("experiment");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn parse(words: &[&str]) -> Result<(Args, Option<String>), ParseError> {
    let argv: Vec<OsString> = std::iter::once("ablations")
        .chain(words.iter().copied())
        .map(OsString::from)
        .collect();
    try_parse_args::<Args>("ablations", argv)
}

fn experiment_error(words: &[&str]) -> ExperimentError {
    match parse(words) {
        Err(ParseError::Experiment(e)) => e,
        other => panic!("expected an experiment error, got {other:?}"),
    }
}

#[test]
fn the_file_sets_flags_and_the_command_line_overrides_them() {
    let path = file(
        "sotu.toml",
        "# a comment\nprogram = \"ablations\"\ncorpus = \"sotu\"\nseeds = [0, 1, 2, 3, 4, 5]\n\
         max_steps = 1500\nlr = 6e-4\nretry_failed = true\n",
    );
    let p = path.to_str().unwrap();
    let (args, print) = parse(&[p]).unwrap();
    assert_eq!(args.corpus, "sotu");
    assert_eq!(args.seeds, [0, 1, 2, 3, 4, 5]);
    assert_eq!(args.max_steps, 1500);
    assert_eq!(args.lr, 6e-4);
    assert!(args.retry_failed);
    assert!(print.is_none());

    // Flags after the file win, lists included (replaced, not appended).
    let (args, _) = parse(&[p, "--seeds", "6,7", "--max-steps", "20"]).unwrap();
    assert_eq!(args.seeds, [6, 7]);
    assert_eq!(args.max_steps, 20);
    assert_eq!(args.corpus, "sotu");
    // ... and before it.
    let (args, _) = parse(&["--corpus", "brown", p]).unwrap();
    assert_eq!(args.corpus, "brown");

    // Without a file, the program's defaults.
    let (args, _) = parse(&[]).unwrap();
    assert_eq!((args.corpus.as_str(), args.max_steps), ("shakespeare", 400));

    let (_, print) = parse(&[p, "--seeds", "6,7", "--print-command"]).unwrap();
    let print = print.unwrap();
    assert_eq!(
        print,
        "cargo run --release --example ablations -- --corpus=sotu --max-steps=1500 --lr=0.0006 \
         --retry-failed --seeds 6,7"
    );
}

#[test]
fn bad_files_are_refused_naming_the_file_and_the_key() {
    let typo = file("typo.toml", "program = \"ablations\"\nmax_step = 1500\n");
    let e = experiment_error(&[typo.to_str().unwrap()]);
    let message = e.to_string();
    eprintln!("{message}");
    assert!(matches!(e, ExperimentError::UnknownKey { .. }));
    assert!(message.contains("typo.toml") && message.contains("`max_step`"));
    assert!(
        message.contains("max_steps"),
        "the known keys are listed: {message}"
    );

    let other = file("mqar.toml", "program = \"mqar\"\nseeds = [0]\n");
    let message = experiment_error(&[other.to_str().unwrap()]).to_string();
    eprintln!("{message}");
    assert!(message.contains("`mqar`") && message.contains("--example mqar"));

    let none = file("none.toml", "seeds = [0]\n");
    let message = experiment_error(&[none.to_str().unwrap()]).to_string();
    assert!(message.contains("program ="), "{message}");

    let bad_value = file(
        "value.toml",
        "program = \"ablations\"\nmax_steps = \"many\"\n",
    );
    let message = experiment_error(&[bad_value.to_str().unwrap()]).to_string();
    eprintln!("{message}");
    assert!(message.contains("value.toml") && message.contains("--max-steps"));

    let table = file("table.toml", "program = \"ablations\"\n[lr]\nx = 1\n");
    let message = experiment_error(&[table.to_str().unwrap()]).to_string();
    assert!(message.contains("`lr`"), "{message}");

    let syntax = file("syntax.toml", "program = \"ablations\"\nseeds = [0, 1\n");
    let e = experiment_error(&[syntax.to_str().unwrap()]);
    assert!(matches!(e, ExperimentError::Syntax { .. }), "{e}");

    let missing = experiment_error(&["no/such/file.toml"]);
    assert!(matches!(missing, ExperimentError::Read { .. }));
}

#[test]
fn an_on_off_flag_takes_only_a_boolean_and_no_value_becomes_an_argument() {
    // A string "false" or a number would have been `--retry-failed false`: the flag on, and
    // `false` taken as the experiment file.
    for (name, value) in [
        ("quoted", "\"false\""),
        ("zero", "0"),
        ("true-text", "\"true\""),
    ] {
        let path = file(
            &format!("switch-{name}.toml"),
            &format!("program = \"ablations\"\nretry_failed = {value}\n"),
        );
        let e = experiment_error(&[path.to_str().unwrap()]);
        let message = e.to_string();
        eprintln!("{message}");
        assert!(
            matches!(e, ExperimentError::NotBoolean { .. }),
            "{value}: {e:?}"
        );
        assert!(
            message.contains("`retry_failed`") && message.contains("retry_failed = false"),
            "{message}"
        );
    }
    let off = file(
        "switch-off.toml",
        "program = \"ablations\"\nretry_failed = false\n",
    );
    assert!(!parse(&[off.to_str().unwrap()]).unwrap().0.retry_failed);

    // A negative number reaches the flag's own parser, which names it, instead of clap's advice
    // to write `-- -5`.
    let negative = file("negative.toml", "program = \"ablations\"\nmax_steps = -5\n");
    let message = experiment_error(&[negative.to_str().unwrap()]).to_string();
    eprintln!("{message}");
    assert!(
        message.contains("'-5'") && message.contains("--max-steps") && !message.contains("-- -5"),
        "{message}"
    );
    // A value that looks like a flag stays a value.
    let dashed = file(
        "dashed.toml",
        "program = \"ablations\"\ncorpus = \"--force\"\n",
    );
    assert_eq!(
        parse(&[dashed.to_str().unwrap()]).unwrap().0.corpus,
        "--force"
    );
}
