//! Group labels of examples: data, not secrets, but statistics
//! per group (sizes included) are released only with noise. Kept as one `u32`
//! per example so a million examples cost 4 MB.

use crate::accounting::error::{InvalidArgument, Result};
use serde::{Deserialize, Serialize};

/// Most distinct labels per dataset (each is a Prometheus label value too).
pub const MAX_GROUPS: usize = 256;
/// Longest label, in bytes.
pub const MAX_LABEL_BYTES: usize = 64;
const NONE: u32 = u32::MAX;

/// Refuses (naming `field`) a string that is not a label: 1 to
/// [`MAX_LABEL_BYTES`] bytes without control characters (labels are
/// Prometheus label values and appear in logs).
pub fn check_label(field: &str, l: &str) -> Result<()> {
    if l.is_empty() || l.len() > MAX_LABEL_BYTES || l.chars().any(char::is_control) {
        return Err(InvalidArgument::new(
            field,
            format!("{l:?}: a label is 1-{MAX_LABEL_BYTES} bytes without control characters"),
        ));
    }
    Ok(())
}

/// Label assignments: `labels[j]` for `ids[j]` (`null` removes a label).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelAssignment {
    /// Example ids.
    pub ids: Vec<u64>,
    /// One label per id; `null` leaves the example unlabelled.
    pub labels: Vec<Option<String>>,
}

/// The payload of a labels record: an assignment and, on a shard of a sharded
/// dataset, the dataset's label names in order of first use after
/// it, which the shard adopts before assigning, so that every shard names and
/// orders the groups as one unsharded ledger of the same trace does (groups
/// none of its examples carry included). An unsharded dataset's record has no
/// `names`; the JSON of an assignment reads as one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelRecord {
    /// Example ids (the shard's own).
    pub ids: Vec<u64>,
    /// One label per id; `null` leaves the example unlabelled.
    pub labels: Vec<Option<String>>,
    /// The sharded dataset's label names after the assignment, in order of
    /// first use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
}

/// Every example's group.
#[derive(Debug, Clone, Default)]
pub struct Labels {
    names: Vec<String>,
    of: Vec<u32>,
}

impl Labels {
    /// The distinct labels, in order of first use.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether any example was ever labelled.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Refuse an assignment that would not apply, without changing anything.
    pub fn check(&self, examples: u64, a: &LabelAssignment) -> Result<()> {
        if a.ids.len() != a.labels.len() {
            return Err(InvalidArgument::new(
                "labels",
                format!("{} labels for {} ids", a.labels.len(), a.ids.len()),
            ));
        }
        if let Some(id) = a.ids.iter().find(|&&id| id >= examples) {
            return Err(InvalidArgument::new(
                "ids",
                format!("{id} is not an example id (0..{examples})"),
            ));
        }
        let mut new = 0;
        let mut seen: Vec<&str> = Vec::new();
        for l in a.labels.iter().flatten() {
            check_label("labels", l)?;
            if !self.names.iter().any(|n| n == l) && !seen.contains(&l.as_str()) {
                seen.push(l);
                new += 1;
            }
        }
        if self.names.len() + new > MAX_GROUPS {
            return Err(InvalidArgument::new(
                "labels",
                format!("a dataset has at most {MAX_GROUPS} distinct labels"),
            ));
        }
        Ok(())
    }

    /// Labels with these names (in this order) and no example labelled: what
    /// a sharded dataset's coordinator checks an assignment against.
    pub fn with_names(names: &[String]) -> Result<Labels> {
        let mut l = Labels::default();
        l.adopt_names(names)?;
        Ok(l)
    }

    /// Refuse `names` as the new order of this dataset's names unless it lists
    /// every name it has, each once, and at most [`MAX_GROUPS`].
    fn check_names(&self, names: &[String]) -> Result<()> {
        let bad = |detail: String| Err(InvalidArgument::new("labels", detail));
        if names.len() > MAX_GROUPS {
            return bad(format!(
                "a dataset has at most {MAX_GROUPS} distinct labels"
            ));
        }
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return bad(format!("{n:?} is named twice"));
            }
        }
        if let Some(missing) = self.names.iter().find(|n| !names.contains(n)) {
            return bad(format!("the names leave out {missing:?}"));
        }
        Ok(())
    }

    /// Name the groups `names`, in that order (a superset of the names in
    /// use; [`Self::check_names`]), keeping every example's label.
    fn adopt_names(&mut self, names: &[String]) -> Result<()> {
        self.check_names(names)?;
        if self.names == names {
            return Ok(());
        }
        let map: Vec<u32> = self
            .names
            .iter()
            .map(|n| names.iter().position(|m| m == n).unwrap_or(0) as u32)
            .collect();
        for g in &mut self.of {
            if *g != NONE {
                *g = map[*g as usize];
            }
        }
        self.names = names.to_vec();
        Ok(())
    }

    /// Apply a labels record (an assignment, after adopting its `names` when
    /// it has them), or change nothing and say why.
    pub fn apply(&mut self, examples: u64, r: &LabelRecord) -> Result<()> {
        let a = LabelAssignment {
            ids: r.ids.clone(),
            labels: r.labels.clone(),
        };
        match &r.names {
            None => self.assign(examples, &a),
            Some(names) => {
                self.check_names(names)?;
                if let Some(l) = r.labels.iter().flatten().find(|l| !names.contains(l)) {
                    return Err(InvalidArgument::new(
                        "labels",
                        format!("{l:?} is not among the record's names"),
                    ));
                }
                Labels::with_names(names)?.check(examples, &a)?;
                self.adopt_names(names)?;
                self.assign(examples, &a)
            }
        }
    }

    /// Apply a checked assignment to a dataset of `examples` examples.
    pub fn assign(&mut self, examples: u64, a: &LabelAssignment) -> Result<()> {
        self.check(examples, a)?;
        if self.of.is_empty() {
            self.of = vec![NONE; examples as usize];
        }
        for (&id, label) in a.ids.iter().zip(&a.labels) {
            self.of[id as usize] = match label {
                None => NONE,
                Some(l) => match self.names.iter().position(|n| n == l) {
                    Some(g) => g as u32,
                    None => {
                        self.names.push(l.clone());
                        (self.names.len() - 1) as u32
                    }
                },
            };
        }
        Ok(())
    }

    /// `values` split by group: one vector per name (in [`Self::names`] order),
    /// then the unlabelled examples.
    pub fn partition(&self, values: &[f64]) -> (Vec<Vec<f64>>, Vec<f64>) {
        let mut groups = vec![Vec::new(); self.names.len()];
        let mut none = Vec::new();
        for (i, &v) in values.iter().enumerate() {
            match self.of.get(i) {
                Some(&g) if g != NONE => groups[g as usize].push(v),
                _ => none.push(v),
            }
        }
        (groups, none)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assign_partition_and_relabel() {
        let mut l = Labels::default();
        let a = LabelAssignment {
            ids: vec![0, 2, 3],
            labels: vec![Some("cat".into()), Some("dog".into()), Some("cat".into())],
        };
        l.assign(5, &a).unwrap();
        let (g, none) = l.partition(&[0.0, 1.0, 2.0, 3.0, 4.0]);
        assert_eq!(l.names(), ["cat", "dog"]);
        assert_eq!(g, vec![vec![0.0, 3.0], vec![2.0]]);
        assert_eq!(none, vec![1.0, 4.0]);
        l.assign(
            5,
            &LabelAssignment {
                ids: vec![0],
                labels: vec![None],
            },
        )
        .unwrap();
        assert_eq!(l.partition(&[0.0; 5]).1.len(), 3);
    }

    #[test]
    fn a_record_with_names_adopts_their_order_and_keeps_every_label() {
        let mut l = Labels::default();
        let a = LabelAssignment {
            ids: vec![0, 1, 2],
            labels: vec![Some("b".into()), Some("a".into()), None],
        };
        l.assign(4, &a).unwrap();
        assert_eq!(l.names(), ["b", "a"]);
        let names: Vec<String> = ["a", "c", "b", "d"].map(String::from).to_vec();
        let r = LabelRecord {
            ids: vec![3],
            labels: vec![Some("d".into())],
            names: Some(names.clone()),
        };
        l.apply(4, &r).unwrap();
        assert_eq!(l.names(), names.as_slice());
        let (g, none) = l.partition(&[0.0, 1.0, 2.0, 3.0]);
        assert_eq!(g, vec![vec![1.0], vec![], vec![0.0], vec![3.0]]);
        assert_eq!(none, vec![2.0]);
        // A record whose names leave one out, or repeat one, or whose
        // assignment does not apply, changes nothing.
        let bad = [
            LabelRecord {
                names: Some(vec!["a".into(), "b".into(), "d".into()]),
                ..r.clone()
            },
            LabelRecord {
                names: Some([names.clone(), vec!["a".into()]].concat()),
                ..r.clone()
            },
            LabelRecord {
                ids: vec![4],
                ..r.clone()
            },
            LabelRecord {
                labels: vec![Some("e".into())],
                ..r.clone()
            },
        ];
        for b in &bad {
            assert!(l.apply(4, b).is_err(), "{b:?}");
            assert_eq!(l.names(), names.as_slice());
            assert_eq!(l.partition(&[0.0, 1.0, 2.0, 3.0]).0, g);
        }
        // An assignment's JSON reads as a record without names.
        let json = serde_json::to_vec(&a).unwrap();
        let read: LabelRecord = serde_json::from_slice(&json).unwrap();
        assert_eq!(read.names, None);
    }

    #[test]
    fn bad_assignments_change_nothing() {
        let mut l = Labels::default();
        let bad = [
            LabelAssignment {
                ids: vec![5],
                labels: vec![Some("a".into())],
            },
            LabelAssignment {
                ids: vec![0, 1],
                labels: vec![Some("a".into())],
            },
            LabelAssignment {
                ids: vec![0],
                labels: vec![Some(String::new())],
            },
            LabelAssignment {
                ids: vec![0],
                labels: vec![Some("x".repeat(65))],
            },
        ];
        for a in &bad {
            assert!(l.assign(5, a).is_err(), "{a:?}");
        }
        assert!(l.is_empty());
        let many = LabelAssignment {
            ids: (0..300).collect(),
            labels: (0..300).map(|i| Some(format!("g{i}"))).collect(),
        };
        assert!(l.assign(300, &many).is_err());
    }
}
