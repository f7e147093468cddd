//! The refusal document every error answer carries (RFC 9457
//! `application/problem+json`), read by the client exactly as the server
//! writes it: what was wrong (`detail`), the field at fault, and the two
//! extensions a caller acts on (a release's budget state; the owner of a
//! dataset a cluster node could not serve).

use serde::{Deserialize, Serialize};

/// The media type of error bodies.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The problem type of a cluster node that can neither serve nor forward a
/// dataset's request: retryable (answered `503` with `Retry-After`), and a
/// promise that nothing was applied.
pub const NOT_OWNER: &str = "urn:dpledger:problem:not-owner";

/// An error answer. `detail` never contains a secret or a per-example
/// privacy value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// A URN naming the kind of problem (stable, machine-readable), e.g.
    /// `urn:dpledger:problem:conflict`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short human-readable summary of the kind (the HTTP reason phrase).
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What exactly was wrong with this request.
    pub detail: String,
    /// The request field at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For a release refused by its budget: what was spent and what was
    /// asked (boxed: most problems have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<BudgetRefusal>))]
    pub budget: Option<Box<BudgetRefusal>>,
    /// For [`NOT_OWNER`] (cluster mode): the node that owns the dataset, when
    /// it is known. Answered with `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<OwnerRef>))]
    pub owner: Option<Box<OwnerRef>>,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.title, self.detail)?;
        if let Some(field) = &self.field {
            write!(f, " (field {field})")?;
        }
        Ok(())
    }
}

/// A refused release's budget state: the `budget` extension of a `409`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BudgetRefusal {
    /// zCDP `rho` already spent.
    pub rho_spent: f64,
    /// zCDP `rho` this release would cost.
    pub rho_requested: f64,
    /// The budget (`null`: none set).
    #[serde(default)]
    pub rho_budget: Option<f64>,
}

/// A cluster node by its id and advertised URL: the owner a not-owner
/// problem sends the caller to, and the owner of a shard as a node calls it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OwnerRef {
    /// The node's id.
    pub node_id: String,
    /// Its advertised base URL (send the dataset's requests there).
    pub advertise: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_reads_back_as_written_and_says_its_field() {
        let problem = Problem {
            kind: NOT_OWNER.into(),
            title: "Service Unavailable".into(),
            status: 503,
            detail: "moving: retry".into(),
            field: Some("id".into()),
            budget: None,
            owner: Some(Box::new(OwnerRef {
                node_id: "n2".into(),
                advertise: "http://n2:8080".into(),
            })),
        };
        let text = serde_json::to_string(&problem).unwrap();
        assert!(!text.contains("budget"), "{text}");
        assert_eq!(serde_json::from_str::<Problem>(&text).unwrap(), problem);
        assert_eq!(
            problem.to_string(),
            "503 Service Unavailable: moving: retry (field id)"
        );
    }
}
