//! A release's sufficient statistics: what each mechanism consumes
//! of the data, so that shards can compute them over their own examples, a
//! coordinator can add them up exactly, and the mechanism runs once on the
//! merged statistics with inputs bit-identical to one ledger's. One ledger's
//! release goes through the same path (values → summary → mechanism), so the
//! two cannot drift apart.
//!
//! | statistic | sufficient statistic | merge |
//! |---|---|---|
//! | mean | the exact centred sum ([`ExactSum`]) and the count | exact sum, integer sum |
//! | histogram | the count in each bin | integer sums |
//! | quantiles (`kss`) | the count in each cell of the public grid (sparse) | integer sums per cell |
//!
//! The seed's `gradient_descent` quantiles are interactive (each gradient step
//! depends on the previous noisy one) and have no such summary: a sharded
//! dataset refuses them.

use super::exact_sum::ExactSum;
use super::histogram::{bin_counts, release_histogram_of};
use super::labels::Labels;
use super::mean::{centred_sum, release_mean_of};
use super::quantiles::{gradient_quantiles, kss_quantiles_of_cells, Grid, GRADIENT_STEPS};
use super::{
    GroupStatistics, QuantileMethod, QuantileValue, ReleaseRequest, ReleaseValues, Statistics,
};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// One population's sufficient statistics for a request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of examples.
    pub count: u64,
    /// `Σ (clamp(x, 0, B) − B/2)`, exactly (when the mean is asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub centred: Option<ExactSum>,
    /// Exact counts per histogram bin (when a histogram is asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bins: Option<Vec<u64>>,
    /// `(cell, count)` of the served quantile grid, by increasing cell, empty
    /// cells left out (when `kss` quantiles are asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cells: Option<Vec<(u32, u64)>>,
}

/// Why two summaries cannot be merged (a shard answered another request).
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch(pub String);

impl Summary {
    /// The summary of `values` (each example's epsilon, at most `bound`).
    pub fn of(request: &ReleaseRequest, values: &[f64], bound: f64) -> Summary {
        let cells = request
            .quantiles
            .as_ref()
            .filter(|q| q.method == QuantileMethod::Kss)
            .map(|_| {
                let sorted = Grid::SERVED.sorted_cells(values, bound);
                let mut runs: Vec<(u32, u64)> = Vec::new();
                for c in sorted {
                    match runs.last_mut() {
                        Some((last, n)) if *last == c => *n += 1,
                        _ => runs.push((c, 1)),
                    }
                }
                runs
            });
        Summary {
            count: values.len() as u64,
            centred: request.mean.as_ref().map(|_| centred_sum(values, bound)),
            bins: request
                .histogram
                .as_ref()
                .map(|h| bin_counts(values, bound, h.bins)),
            cells,
        }
    }

    /// Add `other` (another range of examples' summary of the same request).
    pub fn merge(&mut self, other: &Summary) -> Result<(), Mismatch> {
        self.count += other.count;
        match (&mut self.centred, &other.centred) {
            (Some(a), Some(b)) => a.merge(b),
            (None, None) => {}
            _ => return Err(Mismatch("the mean's sum".into())),
        }
        match (&mut self.bins, &other.bins) {
            (Some(a), Some(b)) if a.len() == b.len() => {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
            }
            (None, None) => {}
            _ => return Err(Mismatch("the histogram's bins".into())),
        }
        match (&mut self.cells, &other.cells) {
            (Some(a), Some(b)) => *a = merge_runs(a, b),
            (None, None) => {}
            _ => return Err(Mismatch("the quantiles' cells".into())),
        }
        Ok(())
    }

    /// Release `request` from this summary: the mechanisms in the order one
    /// ledger runs them (mean, quantiles, histogram), so that the same random
    /// stream gives the same values. `values` are needed only by the
    /// `gradient_descent` quantiles (`None`: refused before, by the caller).
    pub fn release<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        request: &ReleaseRequest,
        values: Option<&[f64]>,
        bound: f64,
    ) -> Statistics {
        Statistics {
            mean: request.mean.as_ref().map(|m| {
                let centred = self.centred.as_ref().map_or(0.0, ExactSum::value);
                release_mean_of(rng, centred, self.count, bound, m.rho)
            }),
            quantiles: request.quantiles.as_ref().map(|q| {
                let est = match q.method {
                    QuantileMethod::Kss => {
                        let cells = expand(self.cells.as_deref().unwrap_or_default());
                        kss_quantiles_of_cells(Grid::SERVED, rng, &cells, bound, &q.levels, q.rho)
                    }
                    QuantileMethod::GradientDescent => gradient_quantiles(
                        rng,
                        values.unwrap_or_default(),
                        bound,
                        &q.levels,
                        q.rho,
                        q.steps.unwrap_or(GRADIENT_STEPS),
                    ),
                };
                q.levels
                    .iter()
                    .zip(est)
                    .map(|(&level, value)| QuantileValue { level, value })
                    .collect()
            }),
            histogram: request.histogram.as_ref().map(|h| {
                let bins = self.bins.clone().unwrap_or_else(|| vec![0; h.bins]);
                release_histogram_of(rng, &bins, bound, h.rho)
            }),
        }
    }
}

/// Two sorted `(cell, count)` lists added cell by cell.
fn merge_runs(a: &[(u32, u64)], b: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(&(c, n)), Some(&(d, m))) if c == d => {
                out.push((c, n + m));
                i += 1;
                j += 1;
            }
            (Some(&(c, n)), Some(&(d, _))) if c < d => {
                out.push((c, n));
                i += 1;
            }
            (Some(&x), None) => {
                out.push(x);
                i += 1;
            }
            (_, Some(&y)) => {
                out.push(y);
                j += 1;
            }
            (None, None) => break,
        }
    }
    out
}

/// The sorted cells a list of `(cell, count)` stands for.
fn expand(runs: &[(u32, u64)]) -> Vec<u32> {
    let mut cells = Vec::with_capacity(runs.iter().map(|r| r.1 as usize).sum());
    for &(c, n) in runs {
        cells.extend(std::iter::repeat_n(c, n as usize));
    }
    cells
}

/// A release's sufficient statistics: the population's, or every group's
/// (labels by name, the unlabelled examples as `None`, last).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReleaseSummary {
    /// The population's (when `by_group` is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<Summary>,
    /// Every group's, by label (when `by_group` is true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<(Option<String>, Summary)>>,
}

impl ReleaseSummary {
    /// The summary of `values` by id, grouped by `labels` when asked.
    pub fn of(
        request: &ReleaseRequest,
        values: &[f64],
        bound: f64,
        labels: &Labels,
    ) -> ReleaseSummary {
        if !request.by_group {
            return ReleaseSummary {
                population: Some(Summary::of(request, values, bound)),
                groups: None,
            };
        }
        let (groups, unlabelled) = labels.partition(values);
        let mut out: Vec<(Option<String>, Summary)> = labels
            .names()
            .iter()
            .zip(&groups)
            .map(|(name, vals)| (Some(name.clone()), Summary::of(request, vals, bound)))
            .collect();
        out.push((None, Summary::of(request, &unlabelled, bound)));
        ReleaseSummary {
            population: None,
            groups: Some(out),
        }
    }

    /// Add shards' summaries. A by-group merge lists the groups in `names`
    /// order (the dataset's labels in order of first use), then the
    /// unlabelled; a group a shard lacks counts as empty there.
    pub fn merge_all(
        request: &ReleaseRequest,
        parts: &[ReleaseSummary],
        names: &[String],
        bound: f64,
    ) -> Result<ReleaseSummary, Mismatch> {
        let empty = Summary::of(request, &[], bound);
        if !request.by_group {
            let mut total = empty;
            for p in parts {
                let s = p
                    .population
                    .as_ref()
                    .ok_or_else(|| Mismatch("a shard gave no population".into()))?;
                total.merge(s)?;
            }
            return Ok(ReleaseSummary {
                population: Some(total),
                groups: None,
            });
        }
        let keys: Vec<Option<String>> = names.iter().cloned().map(Some).chain([None]).collect();
        let mut totals: Vec<Summary> = vec![empty; keys.len()];
        for p in parts {
            let groups = p
                .groups
                .as_ref()
                .ok_or_else(|| Mismatch("a shard gave no groups".into()))?;
            for (label, s) in groups {
                let i = keys
                    .iter()
                    .position(|k| k == label)
                    .ok_or_else(|| Mismatch(format!("a shard has an unknown label {label:?}")))?;
                totals[i].merge(s)?;
            }
        }
        Ok(ReleaseSummary {
            population: None,
            groups: Some(keys.into_iter().zip(totals).collect()),
        })
    }

    /// Release `request` from these statistics (see [`Summary::release`]).
    pub fn release<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        request: &ReleaseRequest,
        values: Option<(&[f64], &Labels)>,
        bound: f64,
    ) -> ReleaseValues {
        if let Some(p) = &self.population {
            return ReleaseValues {
                population: Some(p.release(rng, request, values.map(|v| v.0), bound)),
                groups: None,
            };
        }
        let partition = values.map(|(v, labels)| labels.partition(v));
        let groups = self.groups.as_deref().unwrap_or_default();
        let out = groups
            .iter()
            .enumerate()
            .map(|(i, (label, s))| {
                let vals = partition.as_ref().map(|(g, none)| match label {
                    Some(_) => g.get(i).map_or(&[][..], Vec::as_slice),
                    None => none.as_slice(),
                });
                GroupStatistics {
                    label: label.clone(),
                    statistics: s.release(rng, request, vals, bound),
                }
            })
            .collect();
        ReleaseValues {
            population: None,
            groups: Some(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::release::{HistogramRequest, MeanRequest, QuantilesRequest};
    use rand::SeedableRng;

    fn request() -> ReleaseRequest {
        let mut r = ReleaseRequest {
            mean: Some(MeanRequest { rho: 0.5 }),
            quantiles: Some(QuantilesRequest {
                rho: 0.5,
                levels: vec![0.1, 0.5, 0.9],
                method: QuantileMethod::Kss,
                steps: None,
            }),
            histogram: Some(HistogramRequest { rho: 0.5, bins: 7 }),
            by_group: false,
            delta: None,
        };
        r.validate().unwrap();
        r
    }

    /// Shards' summaries merged release exactly what one ledger's does, for
    /// any split of the ids, with the same random stream.
    #[test]
    fn merged_shards_release_what_one_ledger_releases() {
        let values: Vec<f64> = (0..1001)
            .map(|i| ((i * 7919) % 1000) as f64 / 97.0)
            .chain([0.0, 10.31, 10.31])
            .collect();
        let bound = 10.31;
        let r = request();
        let whole = ReleaseSummary::of(&r, &values, bound, &Labels::default());
        let one = whole.release(&mut rand_pcg::Pcg64::seed_from_u64(3), &r, None, bound);
        for cuts in [vec![0, 251, 502, 753], vec![0, 1, 2, 1000]] {
            let parts: Vec<ReleaseSummary> = cuts
                .iter()
                .zip(cuts.iter().skip(1).chain([&values.len()]))
                .map(|(&a, &b)| ReleaseSummary::of(&r, &values[a..b], bound, &Labels::default()))
                .collect();
            let merged = ReleaseSummary::merge_all(&r, &parts, &[], bound).unwrap();
            assert_eq!(merged, whole);
            let got = merged.release(&mut rand_pcg::Pcg64::seed_from_u64(3), &r, None, bound);
            assert_eq!(got, one);
        }
    }

    /// What a shard sends is bounded by the grid and the bins, not by its
    /// number of examples (the figure in `docs/sharding.md`).
    #[test]
    fn a_summary_is_bounded_by_the_grid_not_by_the_examples() {
        let r = request();
        for n in [1_000usize, 1_000_000] {
            let values: Vec<f64> = (0..n).map(|i| 7.0 * i as f64 / n as f64).collect();
            let s = ReleaseSummary::of(&r, &values, 7.0, &Labels::default());
            let bytes = serde_json::to_vec(&s).unwrap().len();
            let cells = s.population.as_ref().unwrap().cells.as_ref().unwrap().len();
            assert!(cells <= n.min(Grid::SERVED.top() as usize + 1), "{cells}");
            assert!(bytes < 200_000, "{n} examples: {bytes} bytes");
            eprintln!("{n} examples: {cells} cells, {bytes} bytes of JSON");
        }
    }

    #[test]
    fn summaries_of_other_requests_do_not_merge() {
        let r = request();
        let mut a = Summary::of(&r, &[1.0], 2.0);
        let mut other = r.clone();
        other.mean = None;
        assert!(a.merge(&Summary::of(&other, &[1.0], 2.0)).is_err());
    }
}
