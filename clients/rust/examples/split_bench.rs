//! Steps per second of a sharded dataset reported through this client (split
//! here, each part straight to its shard's owner) vs whole reports posted to
//! the nodes in turn (each node splits and forwards), alternated. Driven by
//! `scripts/bench-client-split`, which starts the cluster and creates the
//! dataset:
//!
//! ```text
//! split_bench TOKEN DATASET EXAMPLES BATCH STEPS ROUNDS FIRST_STEP URL...
//! ```
//!
//! Prints one line per phase and the ratio of the totals.

use dpledger_client::{codec, Client, StepReport};
use std::time::Instant;

/// A small deterministic generator (no dependency): xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `batch` distinct ids below `n` and their norms.
    fn batch(&mut self, n: u64, batch: usize) -> (Vec<u64>, Vec<f64>) {
        let mut seen = std::collections::HashSet::new();
        let mut ids = Vec::with_capacity(batch);
        while ids.len() < batch {
            let id = self.next() % n;
            if seen.insert(id) {
                ids.push(id);
            }
        }
        let norms = ids
            .iter()
            .map(|_| 0.05 + (self.next() % 1000) as f64 / 1000.0)
            .collect();
        (ids, norms)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 8 {
        return Err(
            "usage: split_bench TOKEN DATASET EXAMPLES BATCH STEPS ROUNDS FIRST_STEP URL...".into(),
        );
    }
    let (token, dataset) = (&args[0], &args[1]);
    let n: u64 = args[2].parse()?;
    let batch: usize = args[3].parse()?;
    let steps: u64 = args[4].parse()?;
    let rounds: u32 = args[5].parse()?;
    let mut t: u64 = args[6].parse()?;
    let urls = &args[7..];
    let client = Client::new(&urls[0], token)?;
    client.dataset(dataset).await?; // learns the layout
    let http = reqwest::Client::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut totals = [(0u64, 0f64); 2];
    for _ in 0..rounds {
        for (phase, name) in ["client-split", "node-split"].iter().enumerate() {
            let started = Instant::now();
            for k in 0..steps {
                let (ids, norms) = rng.batch(n, batch);
                let report = StepReport::new(t, ids, norms);
                if phase == 0 {
                    client.report_step(dataset, &report).await?;
                } else {
                    let url = format!(
                        "{}/v1/datasets/{dataset}/steps",
                        urls[k as usize % urls.len()]
                    );
                    let answer = http
                        .post(url)
                        .bearer_auth(token)
                        .header("content-type", codec::CONTENT_TYPE)
                        .body(codec::encode_step(&report))
                        .send()
                        .await?;
                    if !answer.status().is_success() {
                        return Err(format!("step {t}: {}", answer.text().await?).into());
                    }
                    answer.bytes().await?;
                }
                t += 1;
            }
            let took = started.elapsed().as_secs_f64();
            totals[phase].0 += steps;
            totals[phase].1 += took;
            println!(
                "{name:>12}: {:7.1} steps/s (Rust client)",
                steps as f64 / took
            );
        }
    }
    let rate = |p: usize| totals[p].0 as f64 / totals[p].1;
    println!(
        "Rust client: client-split/node-split steps/s = {:.2} ({n} examples, batch {batch})",
        rate(0) / rate(1)
    );
    Ok(())
}
