//! The typed client: one async method per endpoint, bearer authentication, and
//! retries where they are safe (see [`crate::retry`]).

use crate::accountant::{
    CompareRequest, CompareResponse, EpsilonRequest, EpsilonResponse, NoiseRequest, NoiseResponse,
    RdpRequest, RdpResponse, ScheduleRequest, ScheduleResponse,
};
use crate::cluster::{self, ClusterView, DrainAnswer, Routes};
use crate::codec;
use crate::error::{Error, Problem, Result};
use crate::release::{
    BudgetRequest, BudgetStatus, DatasetSetup, LabelAssignment, LabelsView, PolicyUpdate,
    PolicyView, Release, ReleaseList, ReleaseOutcome, ReleasePolicy, ReleaseRequest,
};
use crate::retry::{new_idempotency_key, retry_status, retry_transport, Idempotency, RetryPolicy};
use crate::shard::{self, Layouts, ShardLayout};
use crate::types::{
    CreateDataset, DatasetConfig, DatasetList, DatasetView, Health, PrivacyQuery, PrivacyView,
    RefreshOutcome, RefreshRequest, StepOutcome, StepReport, StorageReport, Thresholds,
    WorstCaseBounds,
};
use reqwest::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use url::Url;

/// How a step report travels. Both are the same report to the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// The compact binary encoding ([`crate::codec`]): about 2.5x smaller than
    /// JSON and norms travel bit for bit. The default.
    #[default]
    Binary,
    /// JSON, as in the OpenAPI document.
    Json,
}

/// A request body, kept as bytes so that a retry resends exactly the same report.
enum Body {
    None,
    Json(Vec<u8>),
    Binary(Vec<u8>),
}

/// A successful answer: status and body.
struct Answer {
    status: u16,
    bytes: Vec<u8>,
}

/// A dpledger client. Cheap to clone (the connection pool is shared); use
/// [`Client::with_token`] for a copy acting under another token.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    token: Option<Arc<str>>,
    retry: RetryPolicy,
    /// Who owns which dataset in a cluster (shared by clones: one map per client).
    routes: Arc<Routes>,
    /// Which datasets are sharded, and how (read once each: layouts never change).
    layouts: Arc<Layouts>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the token.
        f.debug_struct("Client")
            .field("base", &self.base.as_str())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("retry", &self.retry)
            .finish()
    }
}

/// Builds a [`Client`] with a token, retry policy and timeouts.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base: String,
    token: Option<String>,
    retry: RetryPolicy,
    timeout: Duration,
    connect_timeout: Duration,
}

impl ClientBuilder {
    /// The bearer token (a JWT minted by `dpledger token` or your identity provider).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The retry policy (default [`RetryPolicy::default`]).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Timeout of one attempt, from sending to the end of the body (default 60 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Timeout of establishing a connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Build the client. Fails on a malformed base URL.
    pub fn build(self) -> Result<Client> {
        let mut base = Url::parse(&self.base)
            .map_err(|e| Error::InvalidRequest(format!("base URL {:?}: {e}", self.base)))?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            return Err(Error::InvalidRequest(format!(
                "base URL {:?} must be an http(s) URL",
                self.base
            )));
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        if let Some(token) = &self.token {
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                Error::InvalidRequest(
                    "the token contains characters not allowed in a header".into(),
                )
            })?;
        }
        let http = reqwest::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            .build()
            .map_err(|e| Error::InvalidRequest(format!("HTTP client: {e}")))?;
        Ok(Client {
            http,
            base,
            token: self.token.map(Arc::from),
            retry: self.retry,
            routes: Arc::new(Routes::default()),
            layouts: Arc::new(Layouts::default()),
        })
    }
}

/// Dataset ids are 1-64 of `A-Z a-z 0-9 . _ -`; `.` and `..` cannot be addressed in
/// a URL (they are path navigation), so they are refused here.
fn check_dataset_id(id: &str) -> Result<()> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && id != "."
        && id != "..";
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidRequest(format!(
            "dataset id {id:?} must be 1-64 characters of A-Z a-z 0-9 . _ - (and not . or ..)"
        )))
    }
}

impl Client {
    /// A builder for a server at `base_url` (e.g. `http://127.0.0.1:8080`).
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base: base_url.into(),
            token: None,
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// A client for `base_url` acting under `token`, with the default retries.
    pub fn new(base_url: &str, token: &str) -> Result<Client> {
        Self::builder(base_url).token(token).build()
    }

    /// The same client (sharing connections) acting under another token.
    pub fn with_token(&self, token: &str) -> Result<Client> {
        HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            Error::InvalidRequest("the token contains characters not allowed in a header".into())
        })?;
        Ok(Client {
            token: Some(Arc::from(token)),
            ..self.clone()
        })
    }

    /// The same client with another retry policy.
    pub fn with_retry(&self, retry: RetryPolicy) -> Client {
        Client {
            retry,
            ..self.clone()
        }
    }

    /// The base URL.
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Result<Url> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|_| Error::InvalidRequest("base URL cannot have a path".into()))?
            .pop_if_empty()
            .extend(segments);
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k, v);
            }
        }
        Ok(url)
    }

    /// Send with retries; the body of a 2xx answer, or the error of the last attempt.
    async fn execute(
        &self,
        method: Method,
        url: Url,
        body: Body,
        idempotency: Idempotency,
    ) -> Result<Answer> {
        let max_attempts = self.retry.max_attempts.max(1);
        let dataset = cluster::dataset_of(&self.base, &url);
        // One key per call, the same on every attempt: the server applies the
        // change once and answers the retries from it.
        let key = (idempotency == Idempotency::Keyed).then(new_idempotency_key);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= max_attempts;
            if dataset.is_some() && self.routes.needs_load() {
                self.load_routes().await;
            }
            let owner = dataset.as_deref().and_then(|d| self.routes.owner(d));
            let target = owner
                .and_then(|o| cluster::rebase(&self.base, &url, &o))
                .unwrap_or_else(|| url.clone());
            let via_owner = target != url;
            let mut req = self.http.request(method.clone(), target.clone());
            if let Some(token) = &self.token {
                req = req.bearer_auth(token);
            }
            if let Some(key) = &key {
                req = req.header("Idempotency-Key", key.as_str());
            }
            req = match &body {
                Body::None => req,
                Body::Json(b) => req.header(CONTENT_TYPE, "application/json").body(b.clone()),
                Body::Binary(b) => req
                    .header(CONTENT_TYPE, codec::CONTENT_TYPE)
                    .body(b.clone()),
            };
            let outcome = match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let header = |name| {
                        resp.headers()
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string()
                    };
                    let content_type = header(CONTENT_TYPE);
                    let retry_after = cluster::retry_after_secs(Some(&header(RETRY_AFTER)));
                    match resp.bytes().await {
                        Ok(bytes) => Ok((status, content_type, retry_after, bytes.to_vec())),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            match outcome {
                Err(e) => {
                    if via_owner && e.is_connect() {
                        // The owner we knew is gone: back to the base URL, and read
                        // the map again before the next attempt.
                        if let Some(d) = &dataset {
                            self.routes.forget(d);
                        }
                    }
                    if !last && retry_transport(&e, idempotency) {
                        tokio::time::sleep(self.retry.backoff(attempt)).await;
                        continue;
                    }
                    return Err(Error::Transport {
                        source: e,
                        attempts: attempt,
                    });
                }
                Ok((status, _, _, bytes)) if (200..300).contains(&status) => {
                    return Ok(Answer { status, bytes });
                }
                Ok((status, content_type, retry_after, bytes)) => {
                    let problem = problem_from(status, &content_type, &bytes);
                    if status == 503 && problem.kind == cluster::NOT_OWNER {
                        // Nothing was applied: resend whatever the retry class, to
                        // the owner the problem names (at once), or after the wait.
                        let moved = match (&dataset, &problem.owner) {
                            (Some(d), Some(hint)) => {
                                self.routes.learn(d, &hint.advertise);
                                self.routes
                                    .owner(d)
                                    .is_some_and(|o| !target.as_str().starts_with(o.as_str()))
                            }
                            (Some(d), None) => {
                                self.routes.forget(d);
                                false
                            }
                            _ => false,
                        };
                        if !last {
                            if !moved {
                                let wait = retry_after
                                    .map(Duration::from_secs)
                                    .unwrap_or_else(|| self.retry.backoff(attempt))
                                    .min(self.retry.max_backoff.max(Duration::from_millis(100)));
                                tokio::time::sleep(wait).await;
                            }
                            continue;
                        }
                        return Err(Error::Api {
                            problem,
                            attempts: attempt,
                        });
                    }
                    if !last && retry_status(status, idempotency) {
                        tokio::time::sleep(self.retry.backoff(attempt)).await;
                        continue;
                    }
                    return Err(Error::Api {
                        problem,
                        attempts: attempt,
                    });
                }
            }
        }
    }

    /// Read the cluster map once (one attempt, no retries): on any failure (a
    /// server without a cluster endpoint, a refusal) the requests go to the base URL.
    async fn load_routes(&self) {
        let view = self.fetch_cluster().await.ok();
        self.routes.install(view.as_ref());
    }

    async fn fetch_cluster(&self) -> Result<ClusterView> {
        let url = self.url(&["v1", "cluster"], &[])?;
        let mut req = self.http.get(url);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.map_err(|source| Error::Transport {
            source,
            attempts: 1,
        })?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|source| Error::Transport {
            source,
            attempts: 1,
        })?;
        if !(200..300).contains(&status) {
            return Err(Error::Api {
                problem: problem_from(status, "application/problem+json", &bytes),
                attempts: 1,
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode {
            endpoint: "GET /v1/cluster".into(),
            status,
            message: e.to_string(),
        })
    }

    async fn json_call<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, String)],
        body: Body,
        idempotency: Idempotency,
    ) -> Result<T> {
        let url = self.url(segments, query)?;
        let endpoint = format!("{method} {}", url.path());
        let answer = self.execute(method, url, body, idempotency).await?;
        serde_json::from_slice(&answer.bytes).map_err(|e| Error::Decode {
            endpoint,
            status: answer.status,
            message: e.to_string(),
        })
    }

    fn json_body(value: &impl Serialize) -> Result<Body> {
        serde_json::to_vec(value)
            .map(Body::Json)
            .map_err(|e| Error::InvalidRequest(format!("cannot encode the body as JSON: {e}")))
    }

    // ------------------------------------------------------------- datasets

    /// `POST /v1/datasets` (admin): create a ledger. Retried with an
    /// idempotency key (a retry of a creation that landed is answered with the
    /// dataset); a 409 means the id is taken by another creation.
    pub async fn create_dataset(&self, id: &str, config: &DatasetConfig) -> Result<DatasetView> {
        self.create_dataset_with(id, config, &DatasetSetup::default())
            .await
    }

    /// `POST /v1/datasets` (admin) with release settings stored atomically with
    /// the creation: a release budget, group labels of examples `0, 1, ...` and an
    /// automatic release policy. Retried with an idempotency key, like
    /// [`Client::create_dataset`].
    pub async fn create_dataset_with(
        &self,
        id: &str,
        config: &DatasetConfig,
        setup: &DatasetSetup,
    ) -> Result<DatasetView> {
        check_dataset_id(id)?;
        let body = Self::json_body(&CreateDataset { id, config, setup })?;
        let view: DatasetView = self
            .json_call(
                Method::POST,
                &["v1", "datasets"],
                &[],
                body,
                Idempotency::Keyed,
            )
            .await?;
        self.layouts.set(id, ShardLayout::of(&view));
        Ok(view)
    }

    /// `GET /v1/datasets`: the ids this token can see, sorted.
    pub async fn list_datasets(&self) -> Result<Vec<String>> {
        let list: DatasetList = self
            .json_call(
                Method::GET,
                &["v1", "datasets"],
                &[],
                Body::None,
                Idempotency::Idempotent,
            )
            .await?;
        Ok(list.datasets)
    }

    /// `GET /v1/datasets/{d}` (admin, curator, trainer): configuration, status and
    /// the worst case.
    ///
    /// The view says whether the dataset is sharded (`shards`): the client
    /// remembers it, and splits that dataset's steps without reading it again.
    pub async fn dataset(&self, id: &str) -> Result<DatasetView> {
        check_dataset_id(id)?;
        let view: DatasetView = self
            .json_call(
                Method::GET,
                &["v1", "datasets", id],
                &[],
                Body::None,
                Idempotency::Idempotent,
            )
            .await?;
        self.layouts.set(id, ShardLayout::of(&view));
        Ok(view)
    }

    /// `POST /v1/datasets/{d}/archive` (admin, curator): read-only from then on.
    /// Retried with an idempotency key (archiving an archived dataset is a no-op).
    pub async fn archive_dataset(&self, id: &str) -> Result<DatasetView> {
        check_dataset_id(id)?;
        self.json_call(
            Method::POST,
            &["v1", "datasets", id, "archive"],
            &[],
            Body::None,
            Idempotency::Keyed,
        )
        .await
    }

    // ------------------------------------------------------------- training

    /// `POST /v1/datasets/{d}/steps` in the binary encoding: report one step.
    /// See [`Client::report_step_with`].
    pub async fn report_step(&self, dataset: &str, report: &StepReport) -> Result<StepOutcome> {
        self.report_step_with(dataset, report, Encoding::Binary)
            .await
    }

    /// Report one step (or part) in the given encoding. Retried on transport
    /// errors and transient statuses: the ledger applies each step number once, and
    /// answers a retry of an applied step with its original answer and
    /// `duplicate: true`, which this returns as success. A report that still fails
    /// after the retries is an error; it is never dropped silently.
    ///
    /// For a sharded dataset (cluster mode) the report is split by id
    /// range and each shard's part sent straight to its owner, in parallel
    /// ([`crate::shard`]); the answer is the same as a node's split would give.
    /// A retry of the whole report after an error is safe: each part is
    /// applied once.
    pub async fn report_step_with(
        &self,
        dataset: &str,
        report: &StepReport,
        encoding: Encoding,
    ) -> Result<StepOutcome> {
        check_dataset_id(dataset)?;
        if report.ids.len() != report.norms.len() {
            return Err(Error::InvalidRequest(format!(
                "step {}: {} ids but {} norms",
                report.step,
                report.ids.len(),
                report.norms.len()
            )));
        }
        match self.shard_layout(dataset).await {
            Some(layout) => self.report_split(&layout, report, encoding).await,
            None => self.send_step(dataset, report, encoding).await,
        }
    }

    /// The layout of `dataset` if it is sharded: known, or read once. The cluster map
    /// (read anyway for routing) says which: it lists a sharded dataset's
    /// shards; only then is the view read (once). When the map does not say
    /// (a dataset it does not list) or the view cannot be read now, `None`
    /// without remembering it: the whole report goes to a node, which splits
    /// it if need be.
    async fn shard_layout(&self, dataset: &str) -> Option<Arc<ShardLayout>> {
        if let Some(known) = self.layouts.get(dataset) {
            return known;
        }
        if self.routes.needs_load() {
            self.load_routes().await;
        }
        match self.routes.may_be_sharded(dataset) {
            None => return None,
            Some(false) => return self.layouts.set(dataset, None),
            Some(true) => {}
        }
        // Reading the view remembers the layout.
        self.dataset(dataset)
            .await
            .ok()
            .and_then(|_| self.layouts.get(dataset))
            .flatten()
    }

    /// A sharded dataset's step: split, the parts sent in parallel (each with
    /// its own retries, to its shard's owner), the answers merged.
    async fn report_split(
        &self,
        layout: &ShardLayout,
        report: &StepReport,
        encoding: Encoding,
    ) -> Result<StepOutcome> {
        let split = shard::split(layout, report)?;
        let sends = split
            .parts
            .iter()
            .zip(&layout.names)
            .map(|(part, name)| self.send_step(name, part, encoding))
            .collect();
        let results = shard::join_all(sends).await;
        shard::combine(layout, &split, results)
    }

    /// `POST /v1/datasets/{d}/steps` of one report (a dataset's, or a shard's
    /// part), with retries; checks that the answer is for this report.
    async fn send_step(
        &self,
        dataset: &str,
        report: &StepReport,
        encoding: Encoding,
    ) -> Result<StepOutcome> {
        let body = match encoding {
            Encoding::Binary => Body::Binary(codec::encode_step(report)),
            Encoding::Json => Self::json_body(report)?,
        };
        let outcome: StepOutcome = self
            .json_call(
                Method::POST,
                &["v1", "datasets", dataset, "steps"],
                &[],
                body,
                Idempotency::Idempotent,
            )
            .await?;
        if outcome.step != report.step || outcome.thresholds.len() != report.ids.len() {
            return Err(Error::Decode {
                endpoint: format!("POST /v1/datasets/{dataset}/steps"),
                status: 200,
                message: format!(
                    "answer for step {} with {} thresholds to a report of step {} with {} ids",
                    outcome.step,
                    outcome.thresholds.len(),
                    report.step,
                    report.ids.len()
                ),
            });
        }
        Ok(outcome)
    }

    /// `GET /v1/datasets/{d}/thresholds?start=&end=`: current thresholds of ids
    /// `start..end` (at most 1,048,576 per call), e.g. to resume after a crash.
    pub async fn thresholds(
        &self,
        dataset: &str,
        start: Option<u64>,
        end: Option<u64>,
    ) -> Result<Thresholds> {
        check_dataset_id(dataset)?;
        let mut query = Vec::new();
        if let Some(s) = start {
            query.push(("start", s.to_string()));
        }
        if let Some(e) = end {
            query.push(("end", e.to_string()));
        }
        self.json_call(
            Method::GET,
            &["v1", "datasets", dataset, "thresholds"],
            &query,
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `POST /v1/datasets/{d}/refresh`: full-batch norms set new thresholds from
    /// the next step on, charging nothing. Retried with an idempotency key: the
    /// refresh is stored once.
    pub async fn refresh(
        &self,
        dataset: &str,
        ids: &[u64],
        norms: &[f64],
    ) -> Result<RefreshOutcome> {
        check_dataset_id(dataset)?;
        if ids.len() != norms.len() {
            return Err(Error::InvalidRequest(format!(
                "refresh: {} ids but {} norms",
                ids.len(),
                norms.len()
            )));
        }
        let body = Self::json_body(&RefreshRequest { ids, norms })?;
        self.json_call(
            Method::POST,
            &["v1", "datasets", dataset, "refresh"],
            &[],
            body,
            Idempotency::Keyed,
        )
        .await
    }

    // ------------------------------------------------------------- privacy

    /// `GET /v1/datasets/{d}/examples/{i}/privacy` (admin, curator, owner of `i`):
    /// the example's epsilon next to the worst case.
    pub async fn example_privacy(
        &self,
        dataset: &str,
        example: u64,
        query: PrivacyQuery,
    ) -> Result<PrivacyView> {
        check_dataset_id(dataset)?;
        let id = example.to_string();
        self.json_call(
            Method::GET,
            &["v1", "datasets", dataset, "examples", &id, "privacy"],
            &query.pairs(),
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `GET /v1/datasets/{d}/examples/{i}/privacy?method=pld_estimate` (admin,
    /// curator, owner of `i`): as [`Client::example_privacy`], plus the example's
    /// PLD estimate over its actual thresholds in [`PrivacyView::pld_estimate`]:
    /// an estimate (not a proven bound), never mixed into `example.epsilon`.
    pub async fn example_pld_estimate(
        &self,
        dataset: &str,
        example: u64,
        query: PrivacyQuery,
    ) -> Result<PrivacyView> {
        check_dataset_id(dataset)?;
        let id = example.to_string();
        let mut pairs = query.pairs();
        pairs.push(("method", "pld_estimate".to_string()));
        self.json_call(
            Method::GET,
            &["v1", "datasets", dataset, "examples", &id, "privacy"],
            &pairs,
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `GET /v1/datasets/{d}/worst-case` (every role of `d`): the public,
    /// data-independent accountant.
    pub async fn worst_case(&self, dataset: &str, query: PrivacyQuery) -> Result<WorstCaseBounds> {
        check_dataset_id(dataset)?;
        self.json_call(
            Method::GET,
            &["v1", "datasets", dataset, "worst-case"],
            &query.pairs(),
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    // ------------------------------------------------------------- analyses

    /// `GET /v1/analyses/data-dependent` (admin, curator of every run): seed
    /// 001's data-dependent estimate for every example over the runs, with the
    /// data-independent and seed-000 epsilons beside it (`guarantee: false`).
    /// Refusals: 400 (fewer than 2 runs, a bad parameter), 404 (unknown run),
    /// 409 (runs of different configurations, an incomplete refresh).
    pub async fn data_dependent_analysis(
        &self,
        query: &crate::analysis::AnalysisQuery,
    ) -> Result<crate::analysis::DataDependentAnalysis> {
        for r in &query.runs {
            check_dataset_id(r)?;
        }
        self.json_call(
            Method::GET,
            &["v1", "analyses", "data-dependent"],
            &query.pairs(),
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `GET /v1/analyses/data-dependent/examples/{i}` (admin, curator of every
    /// run, owner of `i` in every run): one example's estimate.
    pub async fn data_dependent_example(
        &self,
        example: u64,
        query: &crate::analysis::AnalysisQuery,
    ) -> Result<crate::analysis::DataDependentExampleView> {
        for r in &query.runs {
            check_dataset_id(r)?;
        }
        let id = example.to_string();
        self.json_call(
            Method::GET,
            &["v1", "analyses", "data-dependent", "examples", &id],
            &query.pairs(),
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    // ------------------------------------------------------------- releases

    /// `POST /v1/datasets/{d}/releases` (admin, curator): publish a DP release of
    /// aggregate statistics of the per-example epsilons (mean, quantiles,
    /// histogram; of everyone or, with `by_group`, of every label group). Its zCDP
    /// cost `rho` (the sum of the statistics') is charged to every example and to
    /// the worst case as RDP `alpha * rho` at every order.
    ///
    /// Every accepted release spends budget, so the call carries an
    /// idempotency key and its retries (after a timeout, a reset, a 5xx, or the
    /// server's `outcome-unknown` answer) reuse it: the server publishes and
    /// charges the release once and answers every retry with it. Refusals: 409 when over the release budget or none is set
    /// ([`Error::budget`] then says the spend, the request and the budget), when
    /// `by_group` is asked without labels, before the first step, or when the
    /// release would retire examples; 400 names the invalid field.
    pub async fn create_release(
        &self,
        dataset: &str,
        request: &ReleaseRequest,
    ) -> Result<ReleaseOutcome> {
        check_dataset_id(dataset)?;
        let body = Self::json_body(request)?;
        self.json_call(
            Method::POST,
            &["v1", "datasets", dataset, "releases"],
            &[],
            body,
            Idempotency::Keyed,
        )
        .await
    }

    /// `GET /v1/datasets/{d}/releases?limit=` (every role of `d`): the releases,
    /// newest first (at most `limit`, server default 20, at most 1000), with the
    /// budget and the policy. Reading costs no privacy.
    pub async fn releases(&self, dataset: &str, limit: Option<usize>) -> Result<ReleaseList> {
        check_dataset_id(dataset)?;
        let query: Vec<(&str, String)> = limit
            .map(|l| vec![("limit", l.to_string())])
            .unwrap_or_default();
        self.json_call(
            Method::GET,
            &["v1", "datasets", dataset, "releases"],
            &query,
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `GET /v1/datasets/{d}/releases/latest` (every role of `d`): the newest
    /// release, at no privacy cost (dashboards poll this). 404 when nothing has
    /// been released yet (or there is no such dataset).
    pub async fn latest_release(&self, dataset: &str) -> Result<Release> {
        check_dataset_id(dataset)?;
        self.json_call(
            Method::GET,
            &["v1", "datasets", dataset, "releases", "latest"],
            &[],
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `GET /v1/datasets/{d}/release-budget` (every role of `d`): the release
    /// budget, its spend and the number of releases.
    pub async fn release_budget(&self, dataset: &str) -> Result<BudgetStatus> {
        check_dataset_id(dataset)?;
        self.json_call(
            Method::GET,
            &["v1", "datasets", dataset, "release-budget"],
            &[],
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `PUT /v1/datasets/{d}/release-budget` (admin, curator): set the release
    /// budget, as a zCDP `rho` or an `(epsilon, delta)` target. Retried (setting a
    /// budget twice is setting it once). 409 when below what is already spent.
    pub async fn set_release_budget(
        &self,
        dataset: &str,
        budget: &BudgetRequest,
    ) -> Result<BudgetStatus> {
        check_dataset_id(dataset)?;
        let body = Self::json_body(budget)?;
        self.json_call(
            Method::PUT,
            &["v1", "datasets", dataset, "release-budget"],
            &[],
            body,
            Idempotency::Keyed,
        )
        .await
    }

    /// `GET /v1/datasets/{d}/release-policy` (every role of `d`): the automatic
    /// release policy, and why its latest release was refused, if it was.
    pub async fn release_policy(&self, dataset: &str) -> Result<PolicyView> {
        check_dataset_id(dataset)?;
        self.json_call(
            Method::GET,
            &["v1", "datasets", dataset, "release-policy"],
            &[],
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `PUT /v1/datasets/{d}/release-policy` (admin, curator): release
    /// automatically every `every_steps` steps, or with `None` stop doing so.
    /// Retried (setting a policy twice is setting it once).
    pub async fn set_release_policy(
        &self,
        dataset: &str,
        policy: Option<&ReleasePolicy>,
    ) -> Result<PolicyView> {
        check_dataset_id(dataset)?;
        let body = Self::json_body(&PolicyUpdate { policy })?;
        self.json_call(
            Method::PUT,
            &["v1", "datasets", dataset, "release-policy"],
            &[],
            body,
            Idempotency::Keyed,
        )
        .await
    }

    /// `PUT /v1/datasets/{d}/labels` (admin, curator): label example `ids[j]` with
    /// `labels[j]` (`None` removes its label), for per-group releases. Labels are
    /// 1-64 bytes, at most 256 distinct per dataset. Retried (assigning the same
    /// labels twice is assigning them once). Answers every label in use or used
    /// before, in order of first use.
    pub async fn set_labels(
        &self,
        dataset: &str,
        ids: &[u64],
        labels: &[Option<String>],
    ) -> Result<LabelsView> {
        check_dataset_id(dataset)?;
        if ids.len() != labels.len() {
            return Err(Error::InvalidRequest(format!(
                "labels: {} ids but {} labels",
                ids.len(),
                labels.len()
            )));
        }
        let body = Self::json_body(&LabelAssignment { ids, labels })?;
        self.json_call(
            Method::PUT,
            &["v1", "datasets", dataset, "labels"],
            &[],
            body,
            Idempotency::Keyed,
        )
        .await
    }

    // ------------------------------------------------------------- accountant

    async fn accountant<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        name: &str,
        request: &Req,
    ) -> Result<Resp> {
        let body = Self::json_body(request)?;
        self.json_call(
            Method::POST,
            &["v1", "accountant", name],
            &[],
            body,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `POST /v1/accountant/rdp`: RDP of one sampled Gaussian step.
    pub async fn accountant_rdp(&self, request: &RdpRequest) -> Result<RdpResponse> {
        self.accountant("rdp", request).await
    }

    /// `POST /v1/accountant/epsilon`: worst-case epsilon of identical steps.
    pub async fn accountant_epsilon(&self, request: &EpsilonRequest) -> Result<EpsilonResponse> {
        self.accountant("epsilon", request).await
    }

    /// `POST /v1/accountant/noise`: the noise multiplier for a target epsilon.
    pub async fn accountant_noise(&self, request: &NoiseRequest) -> Result<NoiseResponse> {
        self.accountant("noise", request).await
    }

    /// `POST /v1/accountant/compare`: the same run under several accountants.
    pub async fn accountant_compare(&self, request: &CompareRequest) -> Result<CompareResponse> {
        self.accountant("compare", request).await
    }

    /// `POST /v1/accountant/schedule`: a noise schedule planned against a budget.
    pub async fn accountant_schedule(&self, request: &ScheduleRequest) -> Result<ScheduleResponse> {
        self.accountant("schedule", request).await
    }

    // ------------------------------------------------------------- operations

    /// `GET /healthz`.
    pub async fn health(&self) -> Result<Health> {
        self.json_call(
            Method::GET,
            &["healthz"],
            &[],
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `GET /v1/admin/storage` (admin token): the log's size, each dataset's
    /// memory and newest snapshot, the table cache. Loads no paged-out dataset.
    pub async fn storage(&self) -> Result<StorageReport> {
        self.json_call(
            Method::GET,
            &["v1", "admin", "storage"],
            &[],
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `GET /v1/cluster`: the nodes, their liveness, and who owns which dataset
    /// (the datasets this token holds a role on). Also replaces this client's
    /// routing map, so later requests go to the owners directly.
    pub async fn cluster(&self) -> Result<ClusterView> {
        let view: ClusterView = self
            .json_call(
                Method::GET,
                &["v1", "cluster"],
                &[],
                Body::None,
                Idempotency::Idempotent,
            )
            .await?;
        self.routes.install(Some(&view));
        Ok(view)
    }

    /// `POST /v1/cluster/nodes/{node}/drain` (admin): the node hands its datasets
    /// over one by one and exits when it holds none (a rolling upgrade).
    pub async fn drain(&self, node: &str) -> Result<DrainAnswer> {
        self.json_call(
            Method::POST,
            &["v1", "cluster", "nodes", node, "drain"],
            &[],
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `GET /readyz`: ready once the log has been recovered.
    pub async fn ready(&self) -> Result<Health> {
        self.json_call(
            Method::GET,
            &["readyz"],
            &[],
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }

    /// `GET /metrics`: the Prometheus text exposition (needs an admin or a
    /// `metrics` token on the main listener).
    pub async fn metrics(&self) -> Result<String> {
        let url = self.url(&["metrics"], &[])?;
        let answer = self
            .execute(Method::GET, url, Body::None, Idempotency::Idempotent)
            .await?;
        String::from_utf8(answer.bytes).map_err(|e| Error::Decode {
            endpoint: "GET /metrics".into(),
            status: answer.status,
            message: e.to_string(),
        })
    }

    /// `GET /openapi.json`: the service's OpenAPI document.
    pub async fn openapi(&self) -> Result<serde_json::Value> {
        self.json_call(
            Method::GET,
            &["openapi.json"],
            &[],
            Body::None,
            Idempotency::Idempotent,
        )
        .await
    }
}

/// The problem document of an error answer; a body that is not one (a proxy's
/// HTML page, say) becomes a problem carrying its text.
fn problem_from(status: u16, content_type: &str, bytes: &[u8]) -> Problem {
    if content_type.contains("json") {
        if let Ok(p) = serde_json::from_slice::<Problem>(bytes) {
            return p;
        }
    }
    let text = String::from_utf8_lossy(bytes);
    let detail: String = text.chars().take(500).collect();
    Problem {
        kind: "about:blank".into(),
        title: reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Error")
            .to_string(),
        status,
        detail: if detail.is_empty() {
            "(empty body)".into()
        } else {
            detail
        },
        field: None,
        budget: None,
        owner: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_a_base_path_and_encode_queries() {
        let c = Client::builder("http://h:1/prefix").build().unwrap();
        let u = c
            .url(
                &["v1", "datasets", "a.b-c_d", "worst-case"],
                &PrivacyQuery::at_delta(1e-5).pairs(),
            )
            .unwrap();
        assert_eq!(
            u.as_str(),
            "http://h:1/prefix/v1/datasets/a.b-c_d/worst-case?delta=1e-5"
        );
    }

    #[test]
    fn unaddressable_ids_are_refused() {
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_dataset_id(bad).is_err(), "{bad:?}");
        }
        assert!(check_dataset_id("run-1.v2_x").is_ok());
    }

    #[test]
    fn non_json_errors_become_problems() {
        let p = problem_from(502, "text/html", b"<h1>bad gateway</h1>");
        assert_eq!(p.status, 502);
        assert_eq!(p.title, "Bad Gateway");
        assert!(p.detail.contains("bad gateway"));
        let p = problem_from(
            409,
            "application/problem+json",
            br#"{"type":"urn:dpledger:problem:conflict","title":"Conflict","status":409,"detail":"nope"}"#,
        );
        assert_eq!(p.detail, "nope");
        assert_eq!(p.field, None);
    }

    #[test]
    fn a_refused_release_keeps_its_budget_extension() {
        let p = problem_from(
            409,
            "application/problem+json",
            br#"{"type":"urn:dpledger:problem:conflict","title":"Conflict","status":409,
                "detail":"over budget","budget":{"rho_spent":0.003,"rho_requested":0.009,"rho_budget":null}}"#,
        );
        let b = p.budget.as_deref().unwrap();
        assert_eq!(
            (b.rho_spent, b.rho_requested, b.rho_budget),
            (0.003, 0.009, None)
        );
        let e = Error::Api {
            problem: p,
            attempts: 1,
        };
        assert_eq!(e.budget().unwrap().rho_requested, 0.009);
        assert!(problem_from(502, "text/html", b"x").budget.is_none());
    }

    #[test]
    fn debug_never_shows_the_token() {
        let c = Client::new("http://h:1", "secret-token-value").unwrap();
        assert!(!format!("{c:?}").contains("secret-token-value"));
    }
}
