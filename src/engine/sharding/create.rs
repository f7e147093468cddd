//! A sharded dataset's creation (`docs/sharding.md`, "Shards"), coordinated
//! by the node that receives it: everything is validated first, then the
//! layout is recorded (it takes the name), then every shard is created on the
//! node [`ClusterNode::spread`](crate::engine::cluster::ClusterNode::spread)
//! gives it, in parallel: on this engine for the shards placed here, through
//! [`Peers::create_shard`] for the rest. A shard whose node cannot be
//! reached at all (nothing was sent) is created here instead. A retried
//! creation with the same content records nothing new and creates only the
//! shards that are missing.

use super::changes::check_policy;
use super::labels::creation_label_names;
use super::{shard_id, shards_for, Credential, OwnerRef, ShardCall, ShardLayout};
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::DatasetSetup;
use crate::engine::{valid_dataset_id, Engine};
use crate::ledger::{DatasetConfig, DatasetConfigExt};
use crate::release::{LabelAssignment, Labels, ReleasePolicy};
use dpledger_api::views::DatasetView;
use serde_json::json;
use std::ops::Range;
use std::sync::Arc;

/// One shard's creation as its node receives it: the layout's configuration
/// for its range, its slice of the labels and the dataset's release policy.
#[derive(Debug, Clone)]
pub struct ShardCreation {
    /// The layout's configuration with the shard's number of examples.
    pub config: DatasetConfig,
    /// The labels of the shard's own ids (none when the labels end before it).
    pub labels: Option<Vec<Option<String>>>,
    /// The dataset's release policy, held by every shard's book.
    pub release_policy: Option<ReleasePolicy>,
}

/// What a shard's creation became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardCreated {
    /// Created now.
    Created,
    /// Its name is taken already (a retried creation). Its content is the
    /// one asked: the creation was derived from the recorded layout, which
    /// the node that made it checked it against; the view read at the end
    /// of the creation reaches every shard.
    Existed,
    /// Its node could not be reached at all: nothing was sent.
    Unreached,
}

impl Engine {
    /// Creates sharded dataset `id` with `config` in `shards` shards (`None`:
    /// one per `bound` examples, the cluster's `--max-shard-examples`), its
    /// labels and release policy from `setup`, for a caller authorised as
    /// administrator who presented `credential` (passed on to the nodes that
    /// create the shards, which authorise it again); see the module
    /// documentation. Answers the dataset's view.
    pub async fn create_sharded(
        &self,
        id: &str,
        config: DatasetConfig,
        shards: Option<u32>,
        bound: u64,
        mut setup: DatasetSetup,
        credential: Option<Credential>,
    ) -> EngineResult<DatasetView> {
        let node = self.node()?;
        let (config, k) = check_creation(id, config, (shards, bound), &setup)?;
        // The policy (validated as the shards will see it) is part of the
        // layout, which every shard's creation must match: every shard's book
        // holds it from its first record.
        let mut spec = json!({"config": config, "labels": setup.labels});
        if let Some(policy) = &mut setup.release_policy {
            let names = creation_label_names(setup.labels.as_deref().unwrap_or_default());
            check_policy(policy, &names)?;
            spec["release_policy"] = json!(policy);
        }
        let layout = Arc::new(ShardLayout::new(
            id.to_string(),
            config.examples,
            k,
            spec.to_string(),
        ));
        if !node.claim_layout(&layout).await? {
            return Err(EngineError::conflict(format!(
                "dataset {id:?} already exists"
            )));
        }
        let nodes = node.spread(layout.ranges.len());
        let here = OwnerRef {
            node_id: node.config.node_id.clone(),
            advertise: node.config.advertise.clone(),
        };
        let mut tasks = Vec::new();
        for (s, range) in layout.ranges.iter().enumerate() {
            let creation = ShardCreation {
                config: layout.shard_config(s)?,
                labels: labels_of(setup.labels.as_deref(), range),
                release_policy: setup.release_policy.clone(),
            };
            let owner = nodes.get(s).map_or(here.clone(), |n| OwnerRef {
                node_id: n.node_id.clone(),
                advertise: n.advertise.clone(),
            });
            let call = ShardCall {
                owner,
                shard: shard_id(&layout.dataset, range.start),
                credential: credential.clone(),
            };
            let engine = self.clone();
            let me = here.node_id.clone();
            tasks.push(tokio::spawn(async move {
                engine.create_shard(call, creation, &me).await
            }));
        }
        for task in tasks {
            task.await
                .map_err(|_| EngineError::Internal("a shard's creation stopped".into()))??;
        }
        self.coordinate(layout, credential)?.view().await
    }

    /// Creates one shard on the node `call` names (this engine when it is
    /// node `me`, or when that node cannot be reached).
    async fn create_shard(
        &self,
        call: ShardCall,
        creation: ShardCreation,
        me: &str,
    ) -> EngineResult<ShardCreated> {
        if call.owner.node_id != me {
            let answer = self.peers()?.create_shard(call.clone(), creation.clone());
            match answer.await? {
                ShardCreated::Unreached => {}
                done => return Ok(done),
            }
        }
        let setup = DatasetSetup {
            release_budget: None,
            labels: creation.labels,
            release_policy: creation.release_policy,
        };
        match self
            .create_dataset(&call.shard, creation.config, setup, None)
            .await
        {
            Ok(_) => Ok(ShardCreated::Created),
            // A taken name (a retried creation): the only conflict a
            // creation derived from the recorded layout meets (see
            // `ShardCreated::Existed`).
            Err(EngineError::Conflict { .. }) => Ok(ShardCreated::Existed),
            Err(e) => Err(e),
        }
    }
}

/// Checks what a sharded creation asks for before anything is recorded
/// (`shards` asked for, and the cluster's `bound` of examples per shard), and
/// gives its configuration with the creation defaults made explicit and its
/// number of shards.
fn check_creation(
    id: &str,
    config: DatasetConfig,
    (shards, bound): (Option<u32>, u64),
    setup: &DatasetSetup,
) -> EngineResult<(DatasetConfig, u32)> {
    let bad = |detail: &str, field| EngineError::BadRequest {
        detail: detail.to_string(),
        field: Some(field),
    };
    if setup.release_budget.is_some() {
        return Err(bad(
            "a sharded dataset's release budget is set after its creation (PUT \
             .../release-budget, charged to every shard alike): create it without one",
            "release_budget",
        ));
    }
    if !valid_dataset_id(id) {
        return Err(bad(
            "id must be 1-64 characters of A-Z a-z 0-9 . _ - (and not . or ..)",
            "id",
        ));
    }
    let config = config.with_creation_defaults()?;
    if config.label_budgets.is_some() {
        return Err(bad(
            "a sharded dataset has one individual budget for all its examples: budgets per \
             label are fixed by the labels at creation, which its shards do not share",
            "label_budgets",
        ));
    }
    let k = shards_for(&config, shards, bound)?;
    let n = config.examples;
    if let Some(labels) = &setup.labels {
        if labels.len() as u64 > n {
            return Err(EngineError::BadRequest {
                detail: format!("labels has more entries than the {n} examples"),
                field: Some("labels"),
            });
        }
        // Every shard checks its slice again; checking the whole list before
        // the layout is recorded keeps a bad label from taking the name with
        // shards that can never all be created.
        let whole = LabelAssignment {
            ids: (0..labels.len() as u64).collect(),
            labels: labels.clone(),
        };
        Labels::default().check(n, &whole)?;
    }
    Ok((config, k))
}

/// The labels of the ids in `range` (none when the labels end before it).
fn labels_of(labels: Option<&[Option<String>]>, range: &Range<u64>) -> Option<Vec<Option<String>>> {
    let labels = labels?;
    let len = labels.len() as u64;
    let slice = &labels[range.start.min(len) as usize..range.end.min(len) as usize];
    (!slice.is_empty()).then(|| slice.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(n: usize) -> Vec<Option<String>> {
        (0..n).map(|i| Some(format!("g{}", i % 2))).collect()
    }

    #[test]
    fn each_shard_gets_the_labels_of_its_own_ids() {
        let all = labels(5);
        assert_eq!(labels_of(Some(&all), &(0..3)), Some(all[0..3].to_vec()));
        assert_eq!(labels_of(Some(&all), &(3..6)), Some(all[3..5].to_vec()));
        assert_eq!(labels_of(Some(&all), &(6..9)), None);
        assert_eq!(labels_of(None, &(0..3)), None);
    }

    fn config(examples: u64) -> DatasetConfig {
        DatasetConfig::poisson(examples, 1.0, 1.0, 0.01, 1e-5)
    }

    #[test]
    fn a_creation_is_refused_before_anything_is_recorded() {
        let field = |e: EngineError| match e {
            EngineError::BadRequest { field, .. } => field,
            other => panic!("not a bad request: {other}"),
        };
        let budget = DatasetSetup {
            release_budget: Some(1.0),
            ..DatasetSetup::default()
        };
        let refused = check_creation("d", config(10), (None, 100), &budget).unwrap_err();
        assert_eq!(field(refused), Some("release_budget"));
        let refused =
            check_creation("d~0", config(10), (None, 100), &DatasetSetup::default()).unwrap_err();
        assert_eq!(field(refused), Some("id"));
        let long = DatasetSetup {
            labels: Some(labels(11)),
            ..DatasetSetup::default()
        };
        let refused = check_creation("d", config(10), (None, 100), &long).unwrap_err();
        assert_eq!(field(refused), Some("labels"));
        let fine = DatasetSetup {
            labels: Some(labels(10)),
            ..DatasetSetup::default()
        };
        let refused = check_creation("d", config(10), (Some(11), 100), &fine).unwrap_err();
        assert_eq!(field(refused), Some("shards"));
        let (made, k) =
            check_creation("d", config(10), (None, 4), &fine).expect("a valid creation");
        assert!(made.thresholds.is_some(), "creation defaults made explicit");
        assert_eq!(k, 3, "one shard per 4 examples");
    }
}
