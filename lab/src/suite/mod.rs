//! Suites of training runs for the paper's tables: variants × corpora × seeds, each run a folder
//! of the LM harness, skipped when already finished, aggregated into mean ± std.

mod budget;
mod cells;
mod plot;
mod report;
mod spread;
mod stats;
mod variant;

pub use budget::{Budget, Cells, SuiteError, SuiteOutcome};
pub use cells::{
    CellResult, CellState, CurvePoint, FailedCell, Selection, Suite, cell_state, run_cell,
};
pub use plot::write_curves_plot;
pub use report::{
    PAPER_60M, ReportError, ablation_table, attention_table, change_pct, command_line,
    dynamics_table, paired_table, seed_table, spread_table, write_markdown, write_report,
};
pub use spread::{SpreadTest, f_cdf, spread_tests};
pub use stats::{
    Aggregate, Paired, aggregate, first_reach, mean_std, paired, paired_to_baselines, t_975,
};
pub use variant::{StepsError, parse_variants, variant_with_steps};
