//! The client: submissions (absolute or delayed, with idempotency keys and safe retries),
//! reads, cancel, replay, wait, definitions, cron jobs ([`cron`]) and administration.

use std::time::Duration;

use kairos_proto::v1::admin_service_client::AdminServiceClient;
use kairos_proto::v1::definition_service_client::DefinitionServiceClient;
use kairos_proto::v1::execution_service_client::ExecutionServiceClient;
use kairos_proto::v1::worker_service_client::WorkerServiceClient;
use kairos_proto::v1::*;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::limits::DECODE_BYTES_MAX;

mod access;
mod cron;

pub use crate::error::Error;
use crate::error::causes;
pub use crate::tls::Tls;

/// The `authorization` value of a client's calls (none: nothing is added).
#[derive(Clone, Default)]
pub struct ApiKeyHeader(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for ApiKeyHeader {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            r.metadata_mut().insert("authorization", v.clone());
        }
        Ok(r)
    }
}

/// A client's channel, each call carrying its API key.
pub type Service = InterceptedService<Channel, ApiKeyHeader>;

/// A connected client. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    /// `Bearer <API key>`, sent as `authorization` on every call.
    api_key: ApiKeyHeader,
    namespace: String,
    timeout: Duration,
    retries: u32,
}

/// What a submit returned.
pub type Submitted = SubmitResponse;

impl Client {
    /// Connects to a node's gRPC endpoint (`http://host:port` — `host:port` alone means the
    /// same —, or `https://host:port` verified against the webpki roots): a 5 s time-out per try, 3 tries with back-off.
    /// Later calls reconnect by themselves if the node restarts.
    pub async fn connect(endpoint: &str) -> Result<Client, Error> {
        Client::connect_tls(endpoint, &Tls::default()).await
    }

    /// [`connect`](Self::connect) with TLS options (a CA of your own, a client certificate),
    /// which need an `https://` endpoint.
    pub async fn connect_tls(endpoint: &str, tls: &Tls) -> Result<Client, Error> {
        // `host:port` without a scheme is plain `http://host:port` (TLS needs `https://`).
        let endpoint = &match endpoint.contains("://") {
            true => endpoint.to_string(),
            false => format!("http://{endpoint}"),
        };
        let mut ep = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| Error::Invalid(format!("endpoint {endpoint:?}: {e}")))?;
        match ep.uri().scheme_str() {
            Some("https") => {
                ep = ep.tls_config(tls.client_config()?).map_err(|e| {
                    Error::Invalid(format!("TLS towards {endpoint}: {}", causes(&e)))
                })?;
            }
            _ if tls.is_set() => {
                return Err(Error::Invalid(format!(
                    "TLS options (a CA or client certificate) need an https:// endpoint, not \
                     {endpoint}"
                )));
            }
            _ => {}
        }
        let ep = ep
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            // A half-open connection (its peer gone without a reset, packets dropped) would
            // time every call out forever: pings find it dead and the channel reconnects.
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        let mut tries = 0;
        loop {
            match ep.connect().await {
                Ok(channel) => return Ok(Client::from_channel(channel)),
                Err(_) if tries < 2 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200 << tries)).await;
                }
                Err(e) => {
                    let reason = causes(&e);
                    return Err(Error::Connect { endpoint: endpoint.to_string(), reason });
                }
            }
        }
    }

    /// A client over a channel the caller built (e.g. over a simulated network).
    pub fn from_channel(channel: Channel) -> Client {
        Client {
            channel,
            api_key: ApiKeyHeader::default(),
            namespace: "default".into(),
            timeout: Duration::from_secs(30),
            retries: 3,
        }
    }

    /// The same client sending an API key (`kai_…`, from `kairosctl keys create`) with every
    /// call; nodes that require keys refuse calls without one (UNAUTHENTICATED).
    pub fn with_api_key(mut self, key: &str) -> Result<Self, Error> {
        let key = key.trim();
        let value = tonic::metadata::MetadataValue::try_from(format!("Bearer {key}"))
            .map_err(|_| Error::Invalid("API key: must be printable ASCII".into()))?;
        self.api_key = ApiKeyHeader(Some(value));
        Ok(self)
    }

    /// The same client in another namespace.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The same client with another per-call time-out (default 30 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Runs one call with the client's time-out (a client-side time-out: `grpc-timeout` alone
    /// does not stop waiting for a server that vanished).
    pub(crate) async fn call<T, F>(&self, timeout: Duration, f: F) -> Result<T, Error>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(timeout, f).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(Error::Status(s)),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }

    /// The channel with the API key (if any) added to each call.
    pub(crate) fn service(&self) -> Service {
        InterceptedService::new(self.channel.clone(), self.api_key.clone())
    }

    pub(crate) fn executions(&self) -> ExecutionServiceClient<Service> {
        ExecutionServiceClient::new(self.service()).max_decoding_message_size(DECODE_BYTES_MAX)
    }

    pub(crate) fn workers(&self) -> WorkerServiceClient<Service> {
        WorkerServiceClient::new(self.service()).max_decoding_message_size(DECODE_BYTES_MAX)
    }

    fn definitions(&self) -> DefinitionServiceClient<Service> {
        DefinitionServiceClient::new(self.service())
    }

    pub(crate) fn admin(&self) -> AdminServiceClient<Service> {
        AdminServiceClient::new(self.service())
    }

    /// Starts a submission of `definition_uri` (`registry://jobs/<name>`) at `version`, due now
    /// (by the node's clock) unless `at` or `after` says otherwise.
    pub fn submit(&self, definition_uri: &str, version: u32) -> SubmitBuilder {
        SubmitBuilder {
            client: self.clone(),
            req: SubmitRequest {
                namespace: self.namespace.clone(),
                definition_uri: definition_uri.to_string(),
                definition_version: version,
                inputs_json: "{}".into(),
                when: Some(submit_request::When::DelayMs(0)),
                idempotency_key: String::new(),
                return_execution: false,
                traceparent: String::new(),
            },
        }
    }

    /// Submits up to 1,000 requests in one call (one transaction on the node); each gets its
    /// own result, in order. Requests without an idempotency key are not retried on an unknown
    /// outcome: give keys to make the call safe to repeat.
    pub async fn submit_batch(
        &self,
        requests: Vec<SubmitRequest>,
    ) -> Result<Vec<submit_batch_item::Result>, Error> {
        let n = requests.len();
        let req = SubmitBatchRequest { requests };
        let r = self.call(self.timeout, self.executions().submit_batch(req)).await?;
        if r.items.len() != n {
            return Err(Error::Invalid(format!("{} results for {n} requests", r.items.len())));
        }
        Ok(r.items
            .into_iter()
            .map(|i| {
                i.result.unwrap_or(submit_batch_item::Result::Error(ItemError {
                    code: tonic::Code::Internal as i32,
                    message: "empty result".into(),
                }))
            })
            .collect())
    }

    /// An execution and its attempts (the first page: up to 100; see
    /// [`attempts_page`](Self::attempts_page)).
    pub async fn get(&self, id: &str) -> Result<(Execution, Vec<Attempt>), Error> {
        let req = GetExecutionRequest {
            namespace: self.namespace.clone(),
            execution_id: id.to_string(),
            ..GetExecutionRequest::default()
        };
        let r = self.call(self.timeout, self.executions().get(req)).await?;
        Ok((r.execution.unwrap_or_default(), r.attempts))
    }

    /// A page of an execution's attempts after `cursor` (empty: from the first), and the
    /// cursor of the next page (empty: none).
    pub async fn attempts_page(
        &self,
        id: &str,
        cursor: &str,
    ) -> Result<(Vec<Attempt>, String), Error> {
        let req = GetExecutionRequest {
            namespace: self.namespace.clone(),
            execution_id: id.to_string(),
            attempts_cursor: cursor.to_string(),
            ..GetExecutionRequest::default()
        };
        let r = self.call(self.timeout, self.executions().get(req)).await?;
        Ok((r.attempts, r.attempts_next_cursor))
    }

    /// The execution submitted with `key` (for a client that lost the reply), and its attempts.
    pub async fn get_by_idempotency_key(
        &self,
        key: &str,
    ) -> Result<(Execution, Vec<Attempt>), Error> {
        let req = GetExecutionRequest {
            namespace: self.namespace.clone(),
            idempotency_key: key.to_string(),
            ..GetExecutionRequest::default()
        };
        let r = self.call(self.timeout, self.executions().get(req)).await?;
        Ok((r.execution.unwrap_or_default(), r.attempts))
    }

    /// Cancels an execution: a pending one at once (`cancelled` true); a running one by asking
    /// its worker to stop (`cancelled` false; it ends CANCELLED when the attempt ends).
    pub async fn cancel(&self, id: &str) -> Result<CancelResponse, Error> {
        let req = ExecutionRef { namespace: self.namespace.clone(), execution_id: id.to_string() };
        self.call(self.timeout, self.executions().cancel(req)).await
    }

    /// Replays a failed execution.
    pub async fn replay(&self, id: &str) -> Result<Execution, Error> {
        let req = ExecutionRef { namespace: self.namespace.clone(), execution_id: id.to_string() };
        Ok(self
            .call(self.timeout, self.executions().replay(req))
            .await?
            .execution
            .unwrap_or_default())
    }

    /// One page of executions.
    pub async fn list(
        &self,
        mut req: ListExecutionsRequest,
    ) -> Result<ListExecutionsResponse, Error> {
        req.namespace = self.namespace.clone();
        self.call(self.timeout, self.executions().list(req)).await
    }

    /// Waits until the execution reaches SUCCEEDED, FAILED or CANCELLED (polling with
    /// back-off up to 1 s), or `timeout` passes.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<Execution, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            let (e, _) = self.get(id).await?;
            let done = matches!(
                e.status(),
                ExecutionStatus::Succeeded | ExecutionStatus::Failed | ExecutionStatus::Cancelled
            );
            if done {
                return Ok(e);
            }
            if tokio::time::Instant::now() + pause > deadline {
                return Err(Error::Timeout(timeout));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Registers a definition file's text (YAML or JSON); returns it and whether it is new.
    pub async fn register_definition(&self, source: &str) -> Result<(Definition, bool), Error> {
        let req = RegisterDefinitionRequest {
            namespace: self.namespace.clone(),
            source: source.to_string(),
        };
        let r = self.call(self.timeout, self.definitions().register(req)).await?;
        Ok((r.definition.unwrap_or_default(), r.created))
    }

    /// A definition version (`None` = latest).
    pub async fn get_definition(
        &self,
        name: &str,
        version: Option<u32>,
    ) -> Result<Definition, Error> {
        let req = GetDefinitionRequest {
            namespace: self.namespace.clone(),
            name: name.to_string(),
            version: version.unwrap_or(0),
        };
        Ok(self
            .call(self.timeout, self.definitions().get(req))
            .await?
            .definition
            .unwrap_or_default())
    }

    /// Every definition version of the namespace.
    pub async fn list_definitions(&self) -> Result<Vec<Definition>, Error> {
        let req = ListDefinitionsRequest { namespace: self.namespace.clone() };
        Ok(self.call(self.timeout, self.definitions().list(req)).await?.definitions)
    }

    /// The cluster's nodes.
    pub async fn nodes(&self) -> Result<Vec<Node>, Error> {
        Ok(self.call(self.timeout, self.admin().nodes(Empty {})).await?.nodes)
    }

    /// The leases of a partitioned space (`executions` or `cron`) and its partition count.
    pub async fn shards(&self, space: &str) -> Result<(Vec<PartitionLease>, u32), Error> {
        let req = ShardsRequest { space: space.to_string() };
        let r = self.call(self.timeout, self.admin().shards(req)).await?;
        Ok((r.leases, r.shard_count))
    }

    /// Executions by status (this namespace; `all` for every namespace).
    pub async fn stats(&self, all: bool) -> Result<Vec<(ExecutionStatus, i64)>, Error> {
        let ns = if all { String::new() } else { self.namespace.clone() };
        let r = self.call(self.timeout, self.admin().stats(StatsRequest { namespace: ns })).await?;
        Ok(r.executions.iter().map(|c| (c.status(), c.count)).collect())
    }

    /// Records put aside as unprocessable.
    pub async fn quarantined(&self, limit: u32) -> Result<Vec<QuarantinedRecord>, Error> {
        let r =
            self.call(self.timeout, self.admin().quarantined(QuarantinedRequest { limit })).await?;
        Ok(r.records)
    }
}

/// A submission being built.
pub struct SubmitBuilder {
    client: Client,
    req: SubmitRequest,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl SubmitBuilder {
    /// The inputs (a JSON object).
    pub fn inputs(mut self, inputs: serde_json::Value) -> Self {
        self.req.inputs_json = inputs.to_string();
        self
    }

    /// Run at this time (milliseconds since the epoch).
    pub fn at(mut self, execute_at_ms: i64) -> Self {
        self.req.when = Some(submit_request::When::ExecuteAtMs(execute_at_ms));
        self
    }

    /// Run after this delay, counted by the node's clock when it receives the request (a
    /// retry with the same idempotency key returns the same execution).
    pub fn after(mut self, delay: Duration) -> Self {
        self.req.when = Some(submit_request::When::DelayMs(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        ));
        self
    }

    /// Ask for the whole execution in the reply (by default it carries the id, status, whether
    /// it was created, and `execute_at`).
    pub fn return_execution(mut self, yes: bool) -> Self {
        self.req.return_execution = yes;
        self
    }

    /// The W3C trace context (`traceparent`) of the caller's span: each attempt's worker gets
    /// it (`Task::traceparent`, the http executor's `traceparent` header, the command
    /// executor's `TRACEPARENT` variable), so the handler continues the submitter's trace.
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.req.traceparent = traceparent.into();
        self
    }

    /// The idempotency key: the same key with the same request returns the same execution.
    /// Without one, the SDK makes one up so its own retries stay safe.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.req.idempotency_key = key.into();
        self
    }

    /// Sends it. A time-out or an unreachable node means "outcome unknown": the SDK retries
    /// with the same idempotency key (up to 3 times), so at most one execution results.
    pub async fn send(mut self) -> Result<Submitted, Error> {
        if self.req.idempotency_key.is_empty() {
            let nonce: u64 = std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                now_ms(),
            );
            self.req.idempotency_key = format!("sdk:{:x}:{nonce:016x}", now_ms());
        }
        let mut attempt = 0;
        loop {
            let r = self
                .client
                .call(self.client.timeout, self.client.executions().submit(self.req.clone()))
                .await;
            match r {
                Err(e) if e.is_transient() && attempt < self.client.retries => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                other => return other,
            }
        }
    }
}
