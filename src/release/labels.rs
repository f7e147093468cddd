//! Group labels of examples (issue 6, item 3): data, not secrets, but statistics
//! per group (sizes included) are released only with noise. Kept as one `u32`
//! per example so a million examples cost 4 MB.

use crate::accounting::error::{InvalidArgument, Result};
use serde::{Deserialize, Serialize};

/// Most distinct labels per dataset (each is a Prometheus label value too).
pub const MAX_GROUPS: usize = 256;
/// Longest label, in bytes.
pub const MAX_LABEL_BYTES: usize = 64;
const NONE: u32 = u32::MAX;

/// Label assignments: `labels[j]` for `ids[j]` (`null` removes a label).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelAssignment {
    /// Example ids.
    pub ids: Vec<u64>,
    /// One label per id; `null` leaves the example unlabelled.
    pub labels: Vec<Option<String>>,
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
            if l.is_empty() || l.len() > MAX_LABEL_BYTES || l.chars().any(char::is_control) {
                return Err(InvalidArgument::new(
                    "labels",
                    format!(
                        "{l:?}: a label is 1-{MAX_LABEL_BYTES} bytes without control characters"
                    ),
                ));
            }
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
