//! Labels after creation of a sharded dataset (`docs/sharding.md`
//! "Labels after creation and shuffled sampling"): one change across shards,
//! like a release budget, whose record differs per shard.
//!
//! One unsharded ledger names its groups in order of first use over the whole
//! trace: the creation's labels in id order, then each assignment's labels in
//! the order of its list. Per-group releases of a sharded dataset merge the
//! shards' statistics by name in that order, so every shard must agree on it,
//! including names none of its examples carry. The coordinator therefore
//! derives the dataset's order from the shards' books
//! ([`dataset_label_names`]), extends it by the assignment's new names in list
//! order ([`split_labels`]), and sends every shard one record: its examples'
//! part of the assignment (its own ids, in list order) and the whole new
//! order, which the shard adopts before assigning
//! ([`Labels::apply`](crate::release::Labels::apply)).
//!
//! A shard's book before any such record names only the creation's labels its
//! own examples carry (in its own order); after one, exactly the dataset's
//! order, which starts with the creation's names. So the creation's names
//! (cached in the layout) followed by a shard's names that are not among them
//! is the dataset's order, on every shard, before and after.

use crate::release::{LabelAssignment, LabelRecord};
use std::ops::Range;

/// The sharded dataset's label names in order of first use, from its
/// creation's names (`creation`, the layout's) and each shard's book's names
/// (`shards`, as prepared): the creation's names, then those of a shard's
/// names not among them, in the shard's order. `None` when the shards do not
/// all give the same (module note).
pub fn dataset_label_names<'a>(
    creation: &[String],
    shards: impl IntoIterator<Item = &'a [String]>,
) -> Option<Vec<String>> {
    let of = |names: &[String]| {
        let mut all = creation.to_vec();
        all.extend(names.iter().filter(|n| !creation.contains(n)).cloned());
        all
    };
    let mut shards = shards.into_iter();
    let first = shards.next().map_or_else(|| creation.to_vec(), of);
    shards.all(|names| of(names) == first).then_some(first)
}

/// The assignment `a` (checked against the whole dataset) cut into one record
/// per shard of `ranges`: each shard's ids (its own, in list order) and
/// labels, and every record naming the dataset's labels after it, `names`
/// extended by the assignment's new labels in list order (returned too: the
/// answer's groups).
pub fn split_labels(
    ranges: &[Range<u64>],
    a: &LabelAssignment,
    names: &[String],
) -> (Vec<String>, Vec<LabelRecord>) {
    let mut after = names.to_vec();
    extend_in_first_use(&mut after, &a.labels);
    let mut records: Vec<LabelRecord> = ranges
        .iter()
        .map(|_| LabelRecord {
            ids: Vec::new(),
            labels: Vec::new(),
            names: Some(after.clone()),
        })
        .collect();
    for (&id, label) in a.ids.iter().zip(&a.labels) {
        if let Some(s) = dpledger_api::shard_rule::shard_of(ranges, id) {
            records[s].ids.push(id - ranges[s].start);
            records[s].labels.push(label.clone());
        }
    }
    (after, records)
}

/// `names` extended by the labels of `labels` not among them yet, in list
/// order: the group order one ledger keeps (order of first use).
fn extend_in_first_use(names: &mut Vec<String>, labels: &[Option<String>]) {
    for l in labels.iter().flatten() {
        if !names.contains(l) {
            names.push(l.clone());
        }
    }
}

/// The distinct labels of a creation's `labels`, in order of first use.
pub fn creation_label_names(labels: &[Option<String>]) -> Vec<String> {
    let mut names = Vec::new();
    extend_in_first_use(&mut names, labels);
    names
}

/// The label names of a sharded dataset's creation in order of first use,
/// from its specification: parsed once per layout (`ShardLayout::label_names`);
/// labels set later extend them ([`dataset_label_names`]).
pub fn label_names(spec: &str) -> Vec<String> {
    let spec: serde_json::Value = serde_json::from_str(spec).unwrap_or_default();
    serde_json::from_value::<Vec<Option<String>>>(spec["labels"].clone())
        .map(|labels| creation_label_names(&labels))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sharding::shard_ranges;
    use crate::release::Labels;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Shards fed the creation's slices and then split assignments end with
    /// the unsharded ledger's names and every example's group.
    #[test]
    fn shards_of_split_assignments_agree_with_one_ledger() {
        let n = 12;
        let ranges = shard_ranges(n, 4);
        let creation: Vec<Option<String>> = [
            None,
            Some("x"),
            None,
            None,
            None,
            None,
            Some("w"),
            Some("x"),
        ]
        .map(|l| l.map(String::from))
        .to_vec();
        let creation_names = names(&["x", "w"]);
        let whole = LabelAssignment {
            ids: (0..creation.len() as u64).collect(),
            labels: creation.clone(),
        };
        let mut one = Labels::default();
        one.assign(n, &whole).unwrap();
        let mut shards: Vec<Labels> = ranges
            .iter()
            .map(|r| {
                let mut l = Labels::default();
                let slice = LabelAssignment {
                    ids: (0..r.end - r.start).filter(|&i| r.start + i < 8).collect(),
                    labels: creation[r.start.min(8) as usize..r.end.min(8) as usize].to_vec(),
                };
                l.assign(r.end - r.start, &slice).unwrap();
                l
            })
            .collect();
        // New names first used on a later shard, in list order not id order,
        // a relabel, and a label removed.
        let changes = [
            LabelAssignment {
                ids: vec![11, 2, 1],
                labels: vec![Some("z".into()), Some("a".into()), None],
            },
            LabelAssignment {
                ids: vec![5, 11, 0],
                labels: vec![Some("b".into()), Some("w".into()), Some("z".into())],
            },
        ];
        for a in &changes {
            let order =
                dataset_label_names(&creation_names, shards.iter().map(Labels::names)).unwrap();
            assert_eq!(order, one.names());
            Labels::with_names(&order).unwrap().check(n, a).unwrap();
            let (after, records) = split_labels(&ranges, a, &order);
            one.assign(n, a).unwrap();
            assert_eq!(after, one.names());
            for ((l, r), range) in shards.iter_mut().zip(&records).zip(&ranges) {
                l.apply(range.end - range.start, r).unwrap();
                assert_eq!(l.names(), one.names());
            }
        }
        assert_eq!(one.names(), names(&["x", "w", "z", "a", "b"]));
        let values: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let (groups, none) = one.partition(&values);
        let mut merged = vec![Vec::new(); groups.len()];
        let mut merged_none = Vec::new();
        for (l, r) in shards.iter().zip(&ranges) {
            let (g, u) = l.partition(&values[r.start as usize..r.end as usize]);
            for (m, g) in merged.iter_mut().zip(g) {
                m.extend(g);
            }
            merged_none.extend(u);
        }
        assert_eq!(merged, groups);
        assert_eq!(merged_none, none);
    }

    #[test]
    fn shards_that_disagree_on_names_are_apart() {
        let creation = names(&["x"]);
        let ok = [names(&[]), names(&["x"])];
        fn slices(v: &[Vec<String>]) -> Vec<&[String]> {
            v.iter().map(Vec::as_slice).collect()
        }
        assert_eq!(
            dataset_label_names(&creation, slices(&ok)).unwrap(),
            creation
        );
        let apart = [names(&["x", "a"]), names(&["x"])];
        assert!(dataset_label_names(&creation, slices(&apart)).is_none());
        assert_eq!(dataset_label_names(&creation, []).unwrap(), creation);
    }
}
