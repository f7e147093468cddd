//! Types of Thudi et al.'s data-dependent analysis over several runs
//! (`GET /v1/analyses/data-dependent`): an estimate (`guarantee: false`), shown
//! next to the data-independent and seed-000 per-instance epsilons.

/// The analysis' report, defined once with the server in the workspace crate
/// `dpledger-api`, under the names of the OpenAPI document (its numbers are
/// plain `f64`, read as before).
pub use dpledger_api::analysis::{
    Analysis as DataDependentAnalysis, DataIndependent as DataIndependentEpsilon,
    ExampleResult as DataDependentExample, ExampleView as DataDependentExampleView,
    Interval as DataDependentInterval, Quantiles as DataDependentQuantiles,
    Summary as DataDependentSummary,
};

/// Parameters of an analysis; `runs` is required (at least 2 dataset ids):
/// the server's own query type, so that what the client writes is what the
/// server reads.
pub use dpledger_api::analysis::AnalysisQuery;
