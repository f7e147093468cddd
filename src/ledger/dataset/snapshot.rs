//! A ledger's whole state as bytes, and back (snapshots).
//!
//! Restarting a service that has seen a hundred million reported norms by
//! replaying its log takes tens of seconds; loading the state the log led to
//! takes about as long as reading it. The encoding has two parts:
//!
//! * a header, MessagePack (self-describing, so the serde attributes of the
//!   configuration and answers keep working), with everything but the
//!   per-example columns: configuration, hyperparameters, prefix-sum segments
//!   (their tables are recomputed or taken from the cache on load, never
//!   stored), the filter, pending parts, the retry window, the PLD history and
//!   the level history;
//! * the per-example columns as raw little-endian arrays, copied, not parsed:
//!   `bucket` (u32), `since` (u64, shuffle mode only) and `flags` (u8).
//!
//! There are no RDP rows: the level history in the header (each example's open
//! run and closed `(segment, level)` counts) is the compact form every RDP value
//! is evaluated from (`compact.rs`), so an image holds about what the ledger
//! holds in memory, a few tens of bytes per example.
//!
//! Floating-point values are stored as their bits (MessagePack f64 and raw
//! columns), so a loaded ledger is bit-identical to the one encoded: every
//! later step, query and release gives what the original would have given.
//! Integrity is the store's job (a SHA-256 of the bytes, see
//! `store::snapshots`); [`Ledger::from_snapshot`] still refuses any image whose
//! shape does not fit its configuration rather than serve numbers from it.

use super::columns::LEFT_OUT;
use super::discounts::Discounts;
use super::left_out::ReleaseShares;
use super::levels::LevelHistory;
use super::parts::{Pending, PendingPart, StepRecord};
use super::schedule::RefreshProgress;
use super::shuffle::ShuffleState;
use super::{table_cache, Accrual, Ledger, StepParams};
use crate::accounting::table::StepMechanism;
use crate::ledger::config::{DatasetConfig, Sampling};
use crate::ledger::filter::Filter;
use crate::ledger::pld_events::PldHistory;
use crate::ledger::prefix::PrefixSums;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Read;

/// First bytes of every ledger image.
const MAGIC: &[u8; 4] = b"DPLS";
/// Version of the image layout; an image of another version is refused (the
/// log is replayed instead). 2: the level history's per-example lists as flat
/// bytes (`flat.rs`). 3: no dense RDP rows, no `since` in Poisson mode (the
/// compact form).
pub const SNAPSHOT_FORMAT: u32 = 3;

/// Everything but the per-example columns.
#[derive(Serialize, Deserialize)]
struct Header {
    config: DatasetConfig,
    n: u64,
    m: u64,
    current: StepMechanism,
    default: StepMechanism,
    next_step: u64,
    release: Vec<f64>,
    releases: u64,
    filter: Option<Filter>,
    pending: Option<PendingImage>,
    history: Vec<StepRecord>,
    retired: u64,
    over_budget: u64,
    pld: PldHistory,
    levels: LevelHistory,
    accrual: AccrualImage,
    /// Predictable mode's refresh in progress (absent in older images).
    #[serde(default)]
    refresh_progress: Option<RefreshProgress>,
    /// Release charges of examples left out of a release (absent in older
    /// images, which have none).
    #[serde(default)]
    shares: ReleaseShares,
    /// The discounted ledger's discounts (absent in older images: their
    /// estimates then read the threshold ledger, an over-estimate).
    #[serde(default)]
    discounts: Discounts,
}

/// [`Header`] as the encoder writes it: borrowed, so that a snapshot of a
/// large ledger does not first copy its level history and filter (the same
/// field names in the same order: it decodes as a `Header`).
#[derive(Serialize)]
struct HeaderRef<'a> {
    config: &'a DatasetConfig,
    n: u64,
    m: u64,
    current: StepMechanism,
    default: StepMechanism,
    next_step: u64,
    release: &'a [f64],
    releases: u64,
    filter: &'a Option<Filter>,
    pending: Option<PendingImage>,
    history: Vec<&'a StepRecord>,
    retired: u64,
    over_budget: u64,
    pld: &'a PldHistory,
    levels: &'a LevelHistory,
    accrual: AccrualImage,
    refresh_progress: &'a Option<RefreshProgress>,
    shares: &'a ReleaseShares,
    discounts: &'a Discounts,
}

/// The accrual state without its tables.
#[derive(Serialize, Deserialize)]
enum AccrualImage {
    Poisson(Vec<(u64, StepMechanism, Vec<f64>)>),
    Shuffle(ShuffleState),
}

/// A multi-part step in progress, without its table.
#[derive(Serialize, Deserialize)]
struct PendingImage {
    step: u64,
    count: u32,
    noise_bits: Option<u64>,
    rate_bits: Option<u64>,
    mechanism: StepMechanism,
    parts: Vec<Option<PendingPart>>,
    received: u32,
}

/// Why an image could not be turned back into a ledger.
#[derive(Debug, thiserror::Error)]
#[error("ledger snapshot: {0}")]
pub struct SnapshotError(String);

fn bad(detail: impl Into<String>) -> SnapshotError {
    SnapshotError(detail.into())
}

impl Ledger {
    /// The ledger's whole state as bytes (see the module documentation). Costs
    /// one pass over the columns, about a memory copy of the ledger.
    pub fn to_snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_snapshot(&mut out);
        out
    }

    /// [`Ledger::to_snapshot`], appended to `out` (a caller framing the image
    /// with more data avoids a second copy).
    pub fn write_snapshot(&self, out: &mut Vec<u8>) {
        let header = HeaderRef {
            config: &self.config,
            n: self.n as u64,
            m: self.m as u64,
            current: self.current.mechanism,
            default: self.default.mechanism,
            next_step: self.next_step,
            release: &self.release,
            releases: self.releases,
            filter: &self.filter,
            pending: self.pending.as_ref().map(|p| PendingImage {
                step: p.step,
                count: p.count,
                noise_bits: p.noise_bits,
                rate_bits: p.rate_bits,
                mechanism: p.params.mechanism,
                parts: p.parts.clone(),
                received: p.received,
            }),
            history: self.history.iter().collect(),
            retired: self.retired,
            over_budget: self.over_budget,
            pld: &self.pld,
            levels: &self.levels,
            accrual: match &self.accrual {
                Accrual::Poisson(p) => AccrualImage::Poisson(p.image()),
                Accrual::Shuffle(s) => AccrualImage::Shuffle(s.clone()),
            },
            refresh_progress: &self.refresh_progress,
            shares: self.shares.as_ref(),
            discounts: &self.discounts,
        };
        // Serializing plain data into a Vec cannot fail.
        let head = rmp_serde::to_vec_named(&header).expect("ledger header serializes");
        let columns = self.n * (4 + 1) + self.since.len() * 8;
        out.reserve(16 + head.len() + columns);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
        out.extend_from_slice(&(head.len() as u64).to_le_bytes());
        out.extend_from_slice(&head);
        for b in &self.bucket {
            out.extend_from_slice(&b.to_le_bytes());
        }
        for s in &self.since {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out.extend_from_slice(&self.flags);
    }

    /// The ledger an image of [`Ledger::to_snapshot`] describes. Refuses an image
    /// of another format or whose parts do not fit its configuration.
    pub fn from_snapshot(bytes: &[u8]) -> Result<Ledger, SnapshotError> {
        let mut reader = bytes;
        Self::read_snapshot(&mut reader, bytes.len() as u64)
    }

    /// [`Ledger::from_snapshot`] from a reader that yields exactly `len` bytes
    /// (a snapshot decoded while the store still reads it). Allocations are
    /// bounded by `len`: the header's dimensions must account for every byte
    /// before the columns are allocated, so even unverified bytes cannot make
    /// it allocate more than the image's own size.
    pub fn read_snapshot(reader: &mut dyn Read, len: u64) -> Result<Ledger, SnapshotError> {
        let mut prefix = [0u8; 16];
        reader
            .read_exact(&mut prefix)
            .map_err(|_| bad("not a ledger image"))?;
        if &prefix[..4] != MAGIC {
            return Err(bad("not a ledger image"));
        }
        let format = u32::from_le_bytes(prefix[4..8].try_into().expect("4 bytes"));
        if format != SNAPSHOT_FORMAT {
            return Err(bad(format!(
                "image format {format}, this build reads {SNAPSHOT_FORMAT}"
            )));
        }
        let head_len = u64::from_le_bytes(prefix[8..16].try_into().expect("8 bytes"));
        let columns_len = len
            .checked_sub(16)
            .and_then(|rest| rest.checked_sub(head_len))
            .ok_or_else(|| bad("header runs past the end"))?;
        let head = read_bytes(reader, head_len).ok_or_else(|| bad("header runs past the end"))?;
        let header: Header =
            rmp_serde::from_slice(&head).map_err(|e| bad(format!("header: {e}")))?;
        drop(head);
        let per_example = match header.config.sampling {
            Sampling::Poisson { .. } => 4 + 1,
            Sampling::Shuffle { .. } => 4 + 8 + 1,
        };
        let expected = header.n.checked_mul(per_example);
        if header.n != header.config.examples || expected != Some(columns_len) {
            return Err(bad("the columns do not fit the image's length"));
        }
        let mut columns = Columns {
            reader,
            buf: vec![0u8; 1 << 16],
        };
        let fresh = Ledger::new(header.config.clone()).map_err(|e| bad(e.to_string()))?;
        let (n, m) = (fresh.n, fresh.m);
        if header.n != n as u64 || header.m != m as u64 || header.release.len() != m {
            return Err(bad("dimensions do not match the configuration"));
        }
        let mut ledger = fresh;
        let grid = ledger.grid;
        let orders = ledger.orders.clone();
        let table = |mechanism: StepMechanism| table_cache().get(&grid, mechanism, &orders);
        columns.fill(&mut ledger.bucket, u32::from_le_bytes)?;
        columns.fill(&mut ledger.since, u64::from_le_bytes)?;
        columns.fill(&mut ledger.flags, u8::from_le_bytes)?;
        if columns
            .reader
            .read(&mut columns.buf)
            .map_or(true, |more| more > 0)
        {
            return Err(bad("bytes after the last column"));
        }
        if ledger.bucket.iter().any(|&b| b > ledger.top) {
            return Err(bad("a threshold bucket beyond the grid"));
        }
        ledger.accrual = match (header.accrual, &header.config.sampling) {
            (AccrualImage::Poisson(segments), Sampling::Poisson { .. }) => Accrual::Poisson(
                PrefixSums::from_image(segments, ledger.grid.len(), m, table)
                    .ok_or_else(|| bad("malformed prefix sums"))?,
            ),
            (AccrualImage::Shuffle(state), Sampling::Shuffle { .. }) => Accrual::Shuffle(state),
            _ => return Err(bad("accrual does not match the sampling")),
        };
        ledger.current = StepParams {
            mechanism: header.current,
            table: table(header.current),
        };
        ledger.default = StepParams {
            mechanism: header.default,
            table: table(header.default),
        };
        if let Some(filter) = &header.filter {
            let classes = 1 + header.config.label_budgets.as_ref().map_or(0, |l| l.len());
            if !filter.fits(n, m, ledger.top as usize + 1) || filter.classes.len() != classes {
                return Err(bad("filter does not match the configuration"));
            }
        }
        ledger.pending = header.pending.map(|p| Pending {
            step: p.step,
            count: p.count,
            noise_bits: p.noise_bits,
            rate_bits: p.rate_bits,
            params: StepParams {
                mechanism: p.mechanism,
                table: table(p.mechanism),
            },
            parts: p.parts,
            received: p.received,
        });
        let poisson = matches!(ledger.accrual, Accrual::Poisson(_));
        if !header.levels.fits(n, poisson) || !header.levels.refers_within(ledger.top) {
            return Err(bad("level history does not match the configuration"));
        }
        ledger.next_step = header.next_step;
        ledger.release = header.release;
        ledger.releases = header.releases;
        ledger.filter = header.filter;
        ledger.history = VecDeque::from(header.history);
        ledger.retired = header.retired;
        ledger.over_budget = header.over_budget;
        ledger.pld = header.pld;
        ledger.levels = header.levels;
        ledger.refresh_progress = header.refresh_progress;
        let flagged = ledger.flags.iter().filter(|&&f| f & LEFT_OUT != 0).count();
        if !header.shares.fits(n, m)
            || flagged != header.shares.members().count()
            || header
                .shares
                .members()
                .any(|i| ledger.flags[i] & LEFT_OUT == 0)
        {
            return Err(bad("release shares do not match the flags"));
        }
        ledger.shares = std::sync::Arc::new(header.shares);
        if ledger.levels.unavailable().is_some() {
            return Err(bad("a level history without its counts"));
        }
        ledger.seg_tables.clear();
        ledger.sync_seg_tables();
        if !header
            .discounts
            .fits(n, ledger.seg_tables.len(), ledger.top)
        {
            return Err(bad("discounts do not match the configuration"));
        }
        ledger.discounts = header.discounts;
        Ok(ledger)
    }
}

/// Exactly `len` bytes from `reader`; `None` if fewer come or they cannot be
/// allocated. Callers first check `len` against the image's recorded length,
/// so unverified bytes cannot ask for more memory than the image itself.
pub fn read_bytes(reader: &mut dyn Read, len: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    out.try_reserve_exact(usize::try_from(len).ok()?).ok()?;
    reader.take(len).read_to_end(&mut out).ok()?;
    (out.len() as u64 == len).then_some(out)
}

/// The raw columns after the header, consumed in order.
struct Columns<'a> {
    reader: &'a mut dyn Read,
    buf: Vec<u8>,
}

impl Columns<'_> {
    /// Overwrite `column` (already of its final length) from the next bytes.
    fn fill<T, const W: usize>(
        &mut self,
        column: &mut [T],
        decode: fn([u8; W]) -> T,
    ) -> Result<(), SnapshotError> {
        let per_read = self.buf.len() / W;
        for part in column.chunks_mut(per_read) {
            let bytes = &mut self.buf[..part.len() * W];
            self.reader
                .read_exact(bytes)
                .map_err(|_| bad("a column is cut short"))?;
            for (slot, chunk) in part.iter_mut().zip(bytes.chunks_exact(W)) {
                *slot = decode(chunk.try_into().expect("chunk of W bytes"));
            }
        }
        Ok(())
    }
}
