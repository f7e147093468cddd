//! Sharded runs in Thudi et al.'s data-dependent analysis: a run that is
//! a sharded dataset is read as the concatenation of its shards `{run}~{start}`
//! (each an ordinary dataset, read as the analysis reads any run: served here
//! or rebuilt from the shared log). Shard *s*'s example *j* is the run's
//! example *start + j*, so concatenating the shards' checkpoint levels in
//! range order gives exactly the levels one ledger of the whole run would have
//! logged; the analysis then runs once over all examples, as for an unsharded
//! run, so its answer is the unsharded answer by construction, whatever the
//! runs' layouts (sharded or not, any number of shards).

use super::{RunLog, RunView};
use crate::accounting::data_dependent::DataDependentError;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::Engine;

/// One dataset a run is read from: the run itself, or one of its shards.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Part {
    /// The dataset's id (`{run}~{start}` for a shard).
    pub(super) id: String,
    /// The run's id of the part's example 0.
    pub(super) start: u64,
}

impl Engine {
    /// The datasets run `id` is read from, in id order: its shards when it is
    /// a sharded dataset of this cluster, else itself.
    pub(super) async fn run_parts(&self, id: &str) -> EngineResult<Vec<Part>> {
        let layout = self.layout_of(id).await?;
        Ok(match layout {
            Some(layout) => (0..layout.ranges.len())
                .map(|s| Part {
                    id: layout.shard_dataset(s),
                    start: layout.ranges[s].start,
                })
                .collect(),
            None => vec![Part {
                id: id.to_string(),
                start: 0,
            }],
        })
    }
}

/// The view of run `run` from its parts' views: the first part's configuration
/// with every part's examples; every part must be at the same step (a step
/// being applied to some shards only is in flight: retry).
pub(super) fn combine_views(
    run: &str,
    parts: &[Part],
    views: Vec<RunView>,
) -> EngineResult<RunView> {
    let mut views = views.into_iter();
    let mut first = views
        .next()
        .ok_or_else(|| EngineError::Internal(format!("run {run:?} has no part")))?;
    for (part, v) in parts.iter().skip(1).zip(views) {
        if v.steps != first.steps {
            return Err(EngineError::Unavailable(format!(
                "the shards of run {run:?} are at different steps ({} has {}, the first {}): a \
                 step is being applied; retry",
                part.id, v.steps, first.steps
            )));
        }
        let mut same = v.config.clone();
        same.examples = first.config.examples;
        if same != first.config || v.grid != first.grid {
            return Err(DataDependentError::ConfigMismatch(format!(
                "shard {:?} of run {run:?} differs from its first shard in configuration",
                part.id
            ))
            .into());
        }
        first.config.examples += v.config.examples;
    }
    Ok(first)
}

/// The log of run `run` from its parts' logs (`sizes`: each part's examples):
/// the same steps in every part (each shard applies every step, with the
/// run's hyperparameters), and each checkpoint's levels concatenated in id
/// order (a part without that checkpoint contributes "not given", so the
/// analysis refuses the checkpoint as incomplete, as it would one ledger's).
pub(super) fn combine_logs(
    run: &str,
    parts: &[Part],
    sizes: &[usize],
    logs: Vec<RunLog>,
) -> EngineResult<RunLog> {
    if logs.len() == 1 {
        return Ok(logs.into_iter().next().expect("one log"));
    }
    let mut out = RunLog {
        steps: logs[0].steps.clone(),
        ..RunLog::default()
    };
    let positions: std::collections::BTreeSet<u64> = logs
        .iter()
        .flat_map(|l| l.checkpoints.keys().copied())
        .collect();
    for at in positions {
        let mut levels = Vec::with_capacity(sizes.iter().sum());
        for (log, &n) in logs.iter().zip(sizes) {
            match log.checkpoints.get(&at) {
                Some(l) => levels.extend_from_slice(l),
                None => levels.extend(std::iter::repeat_n(u32::MAX, n)),
            }
        }
        out.checkpoints.insert(at, levels);
    }
    for (part, log) in parts.iter().zip(logs) {
        if log.steps != out.steps {
            return Err(DataDependentError::ConfigMismatch(format!(
                "shard {:?} of run {run:?} logged other steps than its first shard",
                part.id
            ))
            .into());
        }
        if let (None, Some(m)) = (&out.bad_norm, log.bad_norm) {
            out.bad_norm = Some(format!(
                "shard {:?} (its example j is example {} + j): {m}",
                part.id, part.start
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::DatasetConfigExt;

    fn part(start: u64) -> Part {
        Part {
            id: format!("r~{start}"),
            start,
        }
    }

    #[test]
    fn shard_logs_concatenate_in_id_order() {
        let parts = [part(0), part(2)];
        let log = |at: &[(u64, Vec<u32>)]| RunLog {
            steps: vec![None, Some((Some(0.5), None))],
            checkpoints: at.iter().cloned().collect(),
            bad_norm: None,
        };
        let a = log(&[(0, vec![1, 2]), (1, vec![3, 4])]);
        let b = log(&[(0, vec![5, 6, 7])]);
        let got = combine_logs("r", &parts, &[2, 3], vec![a, b]).unwrap();
        assert_eq!(got.checkpoints[&0], [1, 2, 5, 6, 7]);
        assert_eq!(got.checkpoints[&1], [3, 4, u32::MAX, u32::MAX, u32::MAX]);
        assert_eq!(got.steps, log(&[]).steps);
        let mut other = log(&[]);
        other.steps[0] = Some((None, Some(2.0)));
        let e = combine_logs("r", &parts, &[2, 3], vec![log(&[]), other]).unwrap_err();
        assert!(e.to_string().contains("other steps"), "{e}");
    }

    #[test]
    fn shard_views_add_up_and_must_agree() {
        let parts = [part(0), part(2)];
        let view = |examples: u64, steps: u64, sigma: f64| {
            let config = crate::ledger::DatasetConfig::poisson(examples, 1.0, sigma, 0.5, 1e-5);
            RunView {
                grid: config.grid().unwrap(),
                config,
                steps,
            }
        };
        let got = combine_views("r", &parts, vec![view(2, 4, 1.0), view(3, 4, 1.0)]).unwrap();
        assert_eq!((got.config.examples, got.steps), (5, 4));
        assert_eq!(got.config, view(5, 4, 1.0).config);
        let e = combine_views("r", &parts, vec![view(2, 4, 1.0), view(3, 5, 1.0)]).unwrap_err();
        assert!(matches!(e, EngineError::Unavailable(_)), "{e}");
        let e = combine_views("r", &parts, vec![view(2, 4, 1.0), view(3, 4, 2.0)]).unwrap_err();
        assert!(matches!(e, EngineError::Conflict { .. }), "{e}");
    }
}
