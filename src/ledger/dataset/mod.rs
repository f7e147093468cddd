//! One dataset's ledger: per-example state, the step protocol, refreshes, the
//! individual filter, releases and queries (spec §3, §6, §7).
//!
//! # Storage: columnar arrays, not a concurrent map
//!
//! Ids are dense (`0..n`), so per-example state lives in plain vectors indexed by id:
//! `bucket: Vec<u32>`, `flags: Vec<u8>`, `since: Vec<u64>` (shuffle mode only) and
//! the level history (`levels.rs`: each example's open-run start and its closed
//! `(segment, level)` counts). Against a `dashmap` (or any hash map) this saves the
//! hashing and probing on every report and the per-entry key and control bytes; a
//! concurrent map would buy nothing: steps must be applied one at a time and in
//! order, so the server serialises them per dataset anyway (one lock per ledger).
//!
//! # The compact form
//!
//! No dense RDP row is kept per example: its RDP is evaluated from the level
//! history, the per-segment tables and the prefix sums (`compact.rs`, with the
//! exactness argument). At 64 orders an example costs about 45 bytes plus 4 per
//! `(segment, level)` entry it holds, against 640 with the dense row
//! (docs/ledger-memory.md); see [`Ledger::memory_bytes`].
//!
//! # Where a step's time goes
//!
//! A step is bound by memory, not arithmetic: each reported example's columns and
//! level-history header are random accesses into hundreds of megabytes. They are
//! prefetched `PREFETCH_AHEAD` reports ahead (`columns.rs`), and a report that keeps
//! the example's bucket writes nothing but its flags' unchanged byte.
//!
//! # Where each job lives
//!
//! | file | its one job |
//! |---|---|
//! | `mod.rs` | the [`Ledger`] struct, its creation and accessors |
//! | `columns.rs` | per-example columns: flag bits, allocation, huge pages, prefetching, memory |
//! | `compact.rs` | an example's RDP evaluated from its compact form |
//! | `pass.rs` | every example's epsilon at once (releases, views), vectorised, bit for bit `compact.rs` |
//! | `step.rs` | one step's validation and accrual (spec §3.2–§3.4), refreshes (§3.5), compaction |
//! | `parts.rs` | exactly once, in order: retries and the retry window, multi-part steps |
//! | `shuffle.rs` | shuffle mode's epochs and its worst case (spec §2, shuffled batches) |
//! | `retirement.rs` | the individual filter applied to examples (spec §7) |
//! | `schedule.rs` | the predictable mode's refresh schedule: ids due, off-schedule refusals, steps held until their refresh arrived (§3.2) |
//! | `releases.rs` | release charges to every example (spec §6) |
//! | `query.rs` | per-example privacy, the worst case (§4), thresholds, epsilons, status |
//! | `levels.rs` | each example's steps per (segment, grid level), for its PLD estimate (§8) |
//! | `snapshot.rs` | the whole state as bytes and back (snapshots) |
//! | `archive.rs` | what an archived ledger's queries need once it is out of memory |
//! | `view.rs` | every example as at one step while later steps go on (releases off the write lock) |

mod archive;
mod columns;
mod compact;
mod discounts;
mod flat;
mod left_out;
mod levels;
mod parts;
mod pass;
mod query;
mod releases;
mod retirement;
mod schedule;
mod shuffle;
mod snapshot;
mod step;
mod view;

pub use archive::{ArchiveSummary, ArchivedExample};
pub use levels::{LevelCount, LevelHistory, SegmentParams, MAX_SEGMENTS};
pub use parts::{MAX_PARTS, RETRY_WINDOW};
pub use snapshot::{read_bytes, SnapshotError, SNAPSHOT_FORMAT};
pub use view::ViewToken;

use self::columns::{try_filled, ALL_TOP};
use self::parts::{Pending, StepRecord};
use self::shuffle::ShuffleState;
use super::config::{DatasetConfig, Sampling};
use super::error::LedgerError;
use super::filter::{next_check, Filter};
use super::pld_events::PldHistory;
use super::prefix::PrefixSums;
use crate::accounting::grid::BucketGrid;
use crate::accounting::table::{RdpTable, StepMechanism, TableCache};
use crate::ledger::config::DatasetConfigExt;
use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

/// The process-wide cache of per-bucket tables: datasets with the same grid,
/// orders and hyperparameters share their tables. Bounded (see [`TableCache`]);
/// `dpledger serve --table-cache-bytes` sets the bound.
pub fn table_cache() -> &'static Arc<TableCache> {
    static CACHE: OnceLock<Arc<TableCache>> = OnceLock::new();
    CACHE.get_or_init(|| Arc::new(TableCache::new()))
}

/// The hyperparameters of one step and the table they determine.
#[derive(Debug, Clone)]
struct StepParams {
    mechanism: StepMechanism,
    table: Arc<RdpTable>,
}

/// How accrual is kept: prefix sums over steps (Poisson) or epochs (shuffle).
#[derive(Debug, Clone)]
enum Accrual {
    Poisson(PrefixSums),
    Shuffle(ShuffleState),
}

/// Which accrual a ledger uses (before its state exists).
#[derive(Clone, Copy)]
enum AccrualKind {
    Poisson,
    Shuffle,
}

/// The per-example privacy ledger of one dataset (one training run).
///
/// A plain struct (`Send + Sync`); a server wraps each ledger in its own lock.
/// Every `&mut self` method validates its whole input before changing anything, so
/// an error never leaves partial state.
#[derive(Debug, Clone)]
pub struct Ledger {
    config: DatasetConfig,
    grid: BucketGrid,
    orders: Vec<f64>,
    n: usize,
    m: usize,
    top: u32,
    default_sigma: f64,
    default_rate: f64,
    /// Threshold bucket `b_i` (for the next step); 0 once retired.
    bucket: Vec<u32>,
    /// Shuffle: one past the epoch of the example's last processing (0: never).
    /// Empty in Poisson mode (the open run's start is in `levels`).
    since: Vec<u64>,
    flags: Vec<u8>,
    accrual: Accrual,
    /// `seg_tables[s]`: the per-bucket table of the level history's segment `s`
    /// (held for the ledger's life: every example's RDP is evaluated from them,
    /// `compact.rs`).
    seg_tables: Vec<Arc<RdpTable>>,
    /// The latest step's hyperparameters (the defaults before step 0).
    current: StepParams,
    /// The dataset's default hyperparameters.
    default: StepParams,
    next_step: u64,
    release: Vec<f64>,
    /// The release charges of examples left out of a release (`left_out.rs`).
    shares: Arc<left_out::ReleaseShares>,
    releases: u64,
    filter: Option<Filter>,
    pending: Option<Pending>,
    history: VecDeque<StepRecord>,
    retired: u64,
    over_budget: u64,
    /// Steps and releases as PLD events (spec §8 worst case).
    pld: PldHistory,
    /// Where this ledger's tables come from (the process-wide cache unless a
    /// test gives its own).
    tables: Arc<TableCache>,
    /// Each example's steps per (segment, grid level), for its PLD estimate (§8).
    levels: LevelHistory,
    /// The open view of a release in progress, if any (`view.rs`).
    view: Option<view::EpochView>,
    /// Views opened so far (names the next one).
    view_serial: u64,
    /// Predictable mode: what of the refresh due before the next step arrived.
    refresh_progress: Option<schedule::RefreshProgress>,
    /// Predictable mode: the discounted ledger's discounts (`discounts.rs`).
    discounts: discounts::Discounts,
}

impl Ledger {
    /// Create the ledger of a dataset: every example at threshold `C`, nothing
    /// accrued. Computes (or takes from the cache) the default per-bucket table.
    pub fn new(config: DatasetConfig) -> Result<Self, LedgerError> {
        Self::with_table_cache(config, table_cache().clone())
    }

    /// [`Ledger::new`] taking its tables from `tables` instead of the
    /// process-wide cache (tests of the cache's bound use their own).
    pub fn with_table_cache(
        config: DatasetConfig,
        tables: Arc<TableCache>,
    ) -> Result<Self, LedgerError> {
        config.validate()?;
        let grid = config.grid()?;
        let orders = config.sorted_orders()?;
        let n = usize::try_from(config.examples)
            .map_err(|_| LedgerError::invalid("examples", "too large for this machine"))?;
        let m = orders.len();
        n.checked_mul(m)
            .filter(|&x| x <= isize::MAX as usize / 8)
            .ok_or_else(|| LedgerError::invalid("examples", "examples × orders is too large"))?;
        let top = grid.top();
        let sigma = config.noise_multiplier;
        let accrual_kind = match config.sampling {
            Sampling::Poisson { .. } => AccrualKind::Poisson,
            Sampling::Shuffle { .. } => AccrualKind::Shuffle,
        };
        let (accrual, current, default_rate, initial_flags) = match config.sampling {
            Sampling::Poisson { rate } => {
                let mechanism = StepMechanism::Poisson { q: rate, sigma };
                let table = tables.get(&grid, mechanism, &orders);
                (
                    Accrual::Poisson(PrefixSums::new(mechanism, table.clone(), grid.len(), m)),
                    StepParams { mechanism, table },
                    rate,
                    ALL_TOP,
                )
            }
            Sampling::Shuffle { .. } => {
                let mechanism = StepMechanism::Gaussian { sigma };
                let table = tables.get(&grid, mechanism, &orders);
                let steps_per_epoch = config.steps_per_epoch().unwrap_or(1);
                (
                    Accrual::Shuffle(ShuffleState::new(steps_per_epoch, m)),
                    StepParams { mechanism, table },
                    1.0,
                    0,
                )
            }
        };
        let mut ledger = Self {
            grid,
            n,
            m,
            top,
            default_sigma: sigma,
            default_rate,
            bucket: try_filled(n, top)?,
            since: match accrual_kind {
                AccrualKind::Poisson => Vec::new(),
                AccrualKind::Shuffle => try_filled(n, 0u64)?,
            },
            flags: try_filled(n, initial_flags)?,
            accrual,
            seg_tables: Vec::new(),
            default: current.clone(),
            current,
            next_step: 0,
            release: vec![0.0; m],
            shares: Default::default(),
            discounts: Default::default(),
            releases: 0,
            filter: None,
            pending: None,
            history: VecDeque::new(),
            retired: 0,
            over_budget: 0,
            pld: PldHistory::default(),
            levels: LevelHistory::new(n, matches!(accrual_kind, AccrualKind::Poisson))?,
            view: None,
            view_serial: 0,
            refresh_progress: None,
            tables,
            orders,
            config,
        };
        if let Some(budget) = ledger.config.individual_budget {
            let mut classes = vec![ledger.budget_class(None, budget)?];
            for (label, &budget) in ledger.config.label_budgets.iter().flatten() {
                classes.push(ledger.budget_class(Some(label.clone()), budget)?);
            }
            // All examples start alike, in the dataset's class until labels
            // give them theirs: one prediction for everyone.
            let first = &classes[0];
            let c = first.bound[top as usize];
            let at = next_check(0, 0.0, c, ledger.unsampled_rate(c), first.limit);
            let predicted = try_filled(n, at)?;
            ledger.filter = Some(Filter::new(classes, predicted));
        }
        Ok(ledger)
    }

    // ------------------------------------------------------------------ accessors

    /// The configuration the ledger was created with.
    /// A ledger of one example with this one's configuration and tables: what
    /// a paged-out dataset keeps in memory instead of its ledger (a few tens of
    /// kilobytes; nothing reads it, the dataset is loaded back first).
    pub fn placeholder(&self) -> Result<Ledger, LedgerError> {
        let mut config = self.config.clone();
        config.examples = 1;
        if let Sampling::Shuffle { batch_size, .. } = &mut config.sampling {
            *batch_size = 1;
        }
        Ledger::with_table_cache(config, self.tables.clone())
    }

    pub fn config(&self) -> &DatasetConfig {
        &self.config
    }

    /// The sorted orders every RDP vector of this ledger refers to.
    pub fn orders(&self) -> &[f64] {
        &self.orders
    }

    /// The bucket grid of thresholds.
    pub fn grid(&self) -> &BucketGrid {
        &self.grid
    }

    /// Number of examples.
    pub fn examples(&self) -> u64 {
        self.n as u64
    }

    /// Each example's steps per (segment, grid level), for PLD estimates (§8);
    /// part of the ledger's state (a snapshot must carry it).
    pub fn level_history(&self) -> &LevelHistory {
        &self.levels
    }

    /// Fetch the table of every level-history segment not yet held (after a
    /// step registered a new setting, or after a snapshot was loaded).
    fn sync_seg_tables(&mut self) {
        let poisson = matches!(self.accrual, Accrual::Poisson(_));
        while self.seg_tables.len() < self.levels.segments().len() {
            let s = self.levels.segments()[self.seg_tables.len()];
            let mechanism = if poisson {
                StepMechanism::Poisson {
                    q: s.sampling_rate,
                    sigma: s.noise_multiplier,
                }
            } else {
                StepMechanism::Gaussian {
                    sigma: s.noise_multiplier,
                }
            };
            let table = if self.current.mechanism == mechanism {
                self.current.table.clone()
            } else {
                self.tables.get(&self.grid, mechanism, &self.orders)
            };
            self.seg_tables.push(table);
        }
    }

    /// The all-epsilons pass at `at` (`pass.rs`) with `release` and `conv`.
    fn pass<'a>(
        &'a self,
        at: compact::At,
        release: &'a [f64],
        shares: &'a left_out::ReleaseShares,
        conv: &'a crate::ledger::convert::Converter,
    ) -> pass::Pass<'a> {
        pass::Pass {
            eval: self.eval(),
            at,
            release,
            shares,
            conv,
            bucket: &self.bucket,
            flags: &self.flags,
        }
    }

    /// What evaluating an example from its compact form needs (`compact.rs`).
    fn eval(&self) -> compact::Eval<'_> {
        compact::Eval {
            levels: &self.levels,
            tables: &self.seg_tables,
            prefix: match &self.accrual {
                Accrual::Poisson(p) => Some(p),
                Accrual::Shuffle(_) => None,
            },
            top: self.top,
        }
    }

    /// The step the ledger accepts next (= the number of steps applied).
    pub fn next_step(&self) -> u64 {
        self.next_step
    }
}
