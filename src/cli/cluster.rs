//! `dpledger cluster ...`: operating a cluster of nodes through any node's API
//! (docs/cluster.md).

use clap::{Args, Subcommand};

/// `dpledger cluster`.
#[derive(Debug, Args)]
pub struct ClusterCmd {
    /// What to do.
    #[command(subcommand)]
    pub action: ClusterAction,
}

/// The cluster operations.
#[derive(Debug, Subcommand)]
pub enum ClusterAction {
    /// Ask node NODE to hand its datasets over, one by one, and exit when it
    /// holds none (a rolling upgrade: drain, upgrade, start it again).
    Drain {
        /// The node's id (`--node-id` of its `dpledger serve`).
        node: String,
        /// Any node's base URL.
        #[arg(long, default_value = "http://127.0.0.1:8080", env = "DPLEDGER_URL")]
        url: String,
        /// An admin token.
        #[arg(long, env = "DPLEDGER_TOKEN")]
        token: String,
    },
    /// Print the cluster map (`GET /v1/cluster`): nodes, owners, epochs.
    Status {
        /// Any node's base URL.
        #[arg(long, default_value = "http://127.0.0.1:8080", env = "DPLEDGER_URL")]
        url: String,
        /// A token (admin sees every dataset).
        #[arg(long, env = "DPLEDGER_TOKEN")]
        token: String,
    },
}

impl ClusterCmd {
    /// Calls the API and returns its answer as pretty JSON.
    pub fn run(&self) -> anyhow::Result<String> {
        let agent = ureq::AgentBuilder::new()
            .timeout(std::time::Duration::from_secs(30))
            .build();
        let (request, what) = match &self.action {
            ClusterAction::Drain { node, url, token } => (
                agent
                    .post(&format!(
                        "{}/v1/cluster/nodes/{node}/drain",
                        url.trim_end_matches('/')
                    ))
                    .set("Authorization", &format!("Bearer {token}")),
                "drain",
            ),
            ClusterAction::Status { url, token } => (
                agent
                    .get(&format!("{}/v1/cluster", url.trim_end_matches('/')))
                    .set("Authorization", &format!("Bearer {token}")),
                "status",
            ),
        };
        let response = match request.call() {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                let body = r.into_string().unwrap_or_default();
                anyhow::bail!("cluster {what} refused ({code}): {body}");
            }
            Err(e) => anyhow::bail!("cluster {what} failed: {e}"),
        };
        let value: serde_json::Value = response.into_json()?;
        Ok(serde_json::to_string_pretty(&value)? + "\n")
    }
}
