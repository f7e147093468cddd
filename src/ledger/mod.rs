//! Per-example RDP ledgers and the step protocol (spec §3).
//!
//! A [`Ledger`] holds, for one dataset (one training run), every example's clipping
//! threshold and accumulated Rényi-DP, and applies the trainer's step reports:
//!
//! * **Accrual.** Under Poisson sampling every step charges every example,
//!   `rho_t(alpha; v_{b_i})` when unsampled and `rho_t(alpha; v_min(b_i, bucket(g_i)))`
//!   when sampled. The ledger keeps per-bucket prefix sums over steps (one
//!   piecewise-linear segment per change of hyperparameters) and per example
//!   `(b_i, since_i, A_i)`, so a step costs `O(|batch| × #orders)` whatever `n`.
//!   Under shuffling an example is charged only at the step that processed it
//!   (see [`Sampling::Shuffle`] for the epoch rule).
//! * **Where a step is not `O(batch)`.** Three rare events cost one `O(n)` pass,
//!   each documented where it happens: a compaction of prefix-sum segments (after
//!   hundreds of changes of hyperparameters, [`Ledger::compact`]); with an
//!   individual filter, a step whose hyperparameters raise the bound on the next
//!   step's charge (every example's retirement check is recomputed); and a release
//!   charged with a filter ([`Ledger::charge_release`]).
//! * **Exactly once, in order.** Steps are numbered from 0. A gap is refused
//!   ([`LedgerError::OutOfOrder`]); a retry with identical content (xxh3 of a
//!   canonical encoding) gets the original answer with `duplicate: true` and changes
//!   nothing; different content is a [`LedgerError::Conflict`]. A step may come in
//!   parts (data-parallel workers): each part is idempotent, parts must be disjoint
//!   and agree on count and hyperparameters, and the step is applied when its last
//!   part arrives.
//! * **Validation first.** Every mutating call checks its whole input before it
//!   changes anything: an error never leaves partial state.
//! * **Worst case.** The data-independent accountant is kept alongside; an example
//!   whose norms were always `>= C` reports exactly (bit for bit) the worst case.
//! * **Individual filter** (spec §7, Feldman & Zrnic 2021). With an individual
//!   budget `(epsilon*, delta*)` the ledger fixes, at creation, the order `alpha*`
//!   allowing the most worst-case steps and the RDP budget `B` at it. After each
//!   step (and refresh) it retires every example whose RDP at `alpha*` plus the
//!   most the next step could charge it would exceed `B` (up to a relative margin
//!   of [`FILTER_MARGIN`]); "the most" is taken at the larger of the dataset's
//!   default hyperparameters and the latest step's. Retirements are announced in
//!   the answer of the step after which they take effect; a retired example has
//!   threshold 0, accrues nothing, and is accepted but not charged if still
//!   reported. A later step whose hyperparameters charge more than that bound
//!   (the trainer has already trained it) is still charged: examples it pushes past
//!   `B` are counted in [`LedgerStatus::over_budget`] and flagged in
//!   [`ExamplePrivacy::over_budget`].
//! * **Refreshes** (spec §3.5, [`Ledger::refresh`]) and **release charges** (spec
//!   §6, [`Ledger::charge_release`]: one dataset-wide RDP offset, `O(#orders)`).
//!
//! [`replay()`] recomputes a ledger offline from a JSON-lines trace (format in
//! [`mod@replay`]).
//!
//! # Where each rule of the spec lives
//!
//! | spec (`docs/spec.md`) | file |
//! |---|---|
//! | §1 buckets `v_k`, orders, `r = C/100` | `config.rs` (`DatasetConfig`), `accounting/grid.rs` |
//! | §2 one step's RDP per bucket (Poisson; shuffled batches) | `accounting/table.rs` (per-bucket tables, cached), `dataset/shuffle.rs` |
//! | §3.1 the trainer clips at `v_{b_i}`: thresholds served | `dataset/query.rs` (`thresholds`), `dataset/step.rs` (the thresholds of a step's answer) |
//! | §3.2–§3.4 accrual of every example, then `b_i <- bucket(g_i)` | `dataset/step.rs` (`apply_step`) |
//! | §3.5 refresh | `dataset/step.rs` (`refresh`) |
//! | §3.6 `bucket(g)` rounds up | `accounting/grid.rs` (`bucket_of`) |
//! | §3 exactly once, in order; retries; parts | `dataset/parts.rs` |
//! | §3 `estimate` label for global clipping | `config.rs` (`Clipping`), `dataset/query.rs` (`guarantee`) |
//! | §3 cost: prefix sums, `O(batch × #orders)` per step | `prefix.rs`, `dataset/step.rs`, `dataset/columns.rs` (storage) |
//! | §3 discounted ledger (estimates only) | `dataset/discounts.rs`, `served.rs` |
//! | §3 shuffled batches: the epoch booked at its first step | `dataset/shuffle.rs`, `dataset/step.rs` |
//! | §4 worst case | `dataset/query.rs` (`worst_case`), `dataset/shuffle.rs` (per epoch) |
//! | §5 RDP → `(epsilon, delta)` | `convert.rs`, `accounting/conversion.rs` |
//! | §6 release charges to every example | `dataset/releases.rs` |
//! | §7 individual filter | `filter.rs` (order, budget classes, queue), `dataset/retirement.rs` (retiring examples, budget classes) |
//! | §8 PLD worst case and per-example `min(RDP_i, PLD worst)` | `pld_events.rs` (the history as PLD events), `bounds.rs` (the minimum and its label); the cache sits on `engine::Dataset` |
//! | §8 per-example PLD estimate (not a guarantee) | `dataset/levels.rs` (steps per segment and level), `estimate.rs` (served types); composed from cached spectra in `engine/estimate.rs` |
//!
//! The `Ledger` itself is split by job under `dataset/`: `mod.rs` (the struct,
//! creation, accessors), `columns.rs` (per-example columns and memory), `step.rs`
//! (step validation and accrual, refreshes, compaction), `parts.rs` (multi-part
//! steps and the retry window), `shuffle.rs` (shuffle mode), `discounts.rs`
//! (the discounted ledger), `retirement.rs` (the
//! filter on examples), `releases.rs` (release charges) and `query.rs` (queries).

pub mod bounds;
mod config;
mod convert;
mod dataset;
mod error;
pub mod estimate;
mod filter;
pub mod idempotency;
mod pld_events;
mod prefix;
mod protocol;
mod refresh_schedule;
pub mod replay;
mod served;
pub mod wire;

pub use bounds::{PldWorstCase, WorstCaseBounds, WorstCaseMethod};
pub use config::{
    Clipping, DatasetConfig, DatasetConfigExt, ExPostOrders, IndividualBudget, Sampling,
    ThresholdMode, MAX_EXAMPLES, MAX_ORDERS,
};
pub use dataset::{
    read_bytes, table_cache, ArchiveSummary, ArchivedExample, Ledger, LevelCount, LevelHistory,
    SegmentParams, SnapshotError, ViewToken, MAX_PARTS, MAX_SEGMENTS, RETRY_WINDOW,
    SNAPSHOT_FORMAT,
};
pub use error::{ErrorKind, LedgerError};
pub use estimate::{EstimateInput, LevelSteps, PldEstimate};
pub use filter::FILTER_MARGIN;
pub use idempotency::{valid_key, IdempotencyKey};
pub use protocol::{
    check_norms, Bound, ExamplePrivacy, FilterStatus, LabelBudgetStatus, LedgerKind, LedgerStatus,
    Part, PendingStatus, PrivacyKind, PrivacyPart, RefreshDue, RefreshOutcome, StepOutcome,
    StepReport, WorstCase,
};
pub use refresh_schedule::{RefreshSchedule, ShardSpan};
pub use replay::{replay, ReplayError, ReplayExample, ReplayReport};
