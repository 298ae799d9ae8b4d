//! disbatch-store: the one place that talks to MongoDB (connection, indexes and every query of
//! the schema), its errors (`error`, `driver_error`), and the only crate that links mongodb.
//! Above disbatch-config and disbatch-model.
//!
//! A `Store` is the connection (connect, ping, indexes, the server's clock and facts, the skip
//! ledger); each domain's queries hang off its handle: `store.tasks()`, `.claims()`,
//! `.limits()`, `.results()`, `.recovery()`, `.queues()`, `.nodes()`, `.workflows()` and
//! `.stats()`, one per folder of this crate.

/// Declares a domain handle: a borrow of the store, copied freely, whose methods are one
/// domain's queries (`store.tasks().get_task(..)`), so the surface reads by domain as River's
/// driver does. It derefs to the store for the helpers every domain shares.
macro_rules! domain_handle {
    ($(#[$doc:meta])* $handle:ident, $accessor:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug)]
        pub struct $handle<'s> {
            store: &'s crate::Store,
        }

        impl crate::Store {
            $(#[$doc])*
            pub fn $accessor(&self) -> $handle<'_> {
                $handle { store: self }
            }
        }

        impl std::ops::Deref for $handle<'_> {
            type Target = crate::Store;

            fn deref(&self) -> &crate::Store {
                self.store
            }
        }
    };
}

pub mod driver_error;
pub mod error;

mod access;
mod claims;
mod conn;
pub mod failures;
mod limits;
mod nodes;
mod queues;
mod recovery;
mod results;
mod state;
mod stats;
mod tasks;
mod workflows;

pub use claims::ClaimStore;
pub use conn::durability;
pub use limits::LimitStore;
pub use nodes::NodeStore;
pub use queues::QueueStore;
pub use recovery::RecoveryStore;
pub use results::ResultStore;
pub use stats::StatsStore;
pub use tasks::TaskStore;
pub use workflows::WorkflowStore;

pub use conn::driver_options::mongohost_problem;
pub use error::{Error, Result};

use std::sync::atomic::Ordering;
use std::time::Duration;

use bson::Document;
use mongodb::options::{ClientOptions, Credential, Tls, TlsOptions};
use mongodb::{Client, Collection, Database};

pub use access::users::{
    create_role_command, parse_additional, parse_perms, passwords, roles, Perms, RoleSpec,
    UserAdmin, COMPONENTS,
};
pub use claims::batch::{claim_key, Candidates, ClaimWindow, Pick, PickHolds, PickOutcome};
pub use claims::candidates::Exclusions;
pub use claims::running::{QueueRunning, RunningSnapshot};
pub use conn::by_id::{conditional_by_id, WHEN as BY_ID_WHEN};
pub use conn::decode::{DocumentStream, SkipHook, SkipLedger, SkipReason};
pub use disbatch_model::queue::{
    check_queue_fields, parse_queue, retry_document, retry_policy, runs_persistent,
};
pub use disbatch_model::task::{
    AttemptEnd, AttemptRecord, LiveOutput, LiveStream, OutputValue, ResultOutput, StoredOutput,
    TaskEnd, Unit, LIVE_TAIL,
};
pub use limits::flow_view::{KeyBudget, PartitionUse, QueueFlow, RateBudget, HELD_SCAN};
pub use limits::key_slots::{key_text, HeldKeys, LimitIndex};
pub use limits::rate_limits::Grant;
pub use nodes::views::{NodeView, LIVE_INTERVALS};
pub use nodes::{Heartbeat, HeartbeatReply, LiveFleet, LiveNode, NodeLimit};
pub use queues::signals::{last_signal, CreatedSince, Queued, SIGNAL_SPACING};
pub use queues::views::QueueCounts;
pub use queues::watch::{InsertedTask, QueueEvent, WorkEvent, WorkSignal, WorkStream};
pub use recovery::leases::{deadline, ExpiredTask, LeaseState, Recovery};
pub use recovery::lost_records::LostAttempt;
pub use results::attempts::result_output;
pub use results::finish::FinishOutcome;
pub use results::gridfs::OutputFileInfo;
pub use results::gridfs::OutputStream;
pub use results::live_output::{live_stream, terse_live_output, LiveWrite};
pub use stats::metrics::{CountsReading, FleetMetrics, QueueMetrics, StatusGroup};
pub use stats::stored::{StoredBucket, StoredNode};
pub use stats::{add_depths, bucket_attempts, p95, Bucket, EndedAttempt, NodeCounts, Outcomes};
pub use tasks::control::{is_retryable, ControlOutcome};
pub use tasks::counts::{
    group_of, is_kept, GroupCounts, Moved, ReconcileReport, DEFERRED_COUNTS_MAX_AGE,
};
pub use tasks::create::Created;
pub use tasks::create::Template;
pub use tasks::create::Timing;
pub use tasks::query::{
    build_filter, search_filter, IndexSets, QueryError, SearchTerms, TaskQuery, TaskStream,
};
pub use tasks::retention::{Pruned, RETENTION_INDEX};
pub use tasks::summary::StateCounts;
pub use workflows::dependencies::{is_waited_for, Settled, Waits};
pub use workflows::graphs::{
    BatchTask, GraphTask, NewBatch, StatusCounts, WholeCancel, WorkflowSummary, WorkflowTask,
    BATCH_MEMBERS_SHOWN,
};
pub use workflows::units::{OnConflict, UnitsOutcome};
pub use workflows::views::WorkflowTaskStream;

use crate::driver_error::{bulk_write_missing, warn_write_concern_error};
use disbatch_config::{Component, Config};
use disbatch_model::schema;

/// A connection to the Disbatch database, shared by all tasks of one process.
#[derive(Clone, Debug)]
pub struct Store {
    client: Client,
    db: Database,
    state: state::State,
}

const BULK_WRITE_UNKNOWN: u8 = 0;
const BULK_WRITE_WORKS: u8 = 1;
const BULK_WRITE_MISSING: u8 = 2;

impl Store {
    /// Connects as `component`'s MongoDB user (from `auth`), with TLS from `attributes`.
    /// The driver connects lazily; the first operation reports an unreachable server.
    pub async fn connect(config: &Config, component: Component) -> Result<Store> {
        let mut options = client_options(config, component.user()).await?;
        if let Some(password) = config.auth.get(component.user()) {
            options.credential = Some(
                Credential::builder()
                    .username(component.user().to_string())
                    .password(password.clone())
                    .source(config.database.clone())
                    // `auth` names user and password; a mechanism from `attributes` still
                    // applies, as Disbatch passed both to the Perl driver.
                    .mechanism(
                        conn::driver_options::auth_mechanism(&config.driver)
                            .map_err(|message| config_error(config, message))?,
                    )
                    .build(),
            );
        }
        let client =
            Client::with_options(options).map_err(|e| Error::mongo("creating the client", e))?;
        let db = client.database(&config.database);
        Ok(Store {
            client,
            db,
            state: state::State::default(),
        })
    }

    /// A store on another database of the same server (tests use one database each).
    pub fn with_database(&self, name: &str) -> Store {
        Store {
            client: self.client.clone(),
            db: self.client.database(name),
            state: self.state.for_another_database(),
        }
    }

    /// Writes the count changes still noted, then ends the client's sessions and closes its
    /// connections, for a process about to exit: a client merely dropped as the runtime stops
    /// makes the driver panic in a worker thread. It does not wait for cursors still open
    /// elsewhere (a change stream's task may never drop its own), and gives up after 5 s.
    pub async fn shutdown(self) {
        if let Err(e) = self.tasks().flush_counts().await {
            tracing::warn!(error = %e, "could not write the last task counts; the maintenance leader's reconcile will repair them");
        }
        let closing = self.client.shutdown().immediate(true);
        if tokio::time::timeout(std::time::Duration::from_secs(5), closing)
            .await
            .is_err()
        {
            tracing::warn!("the database client did not close within 5 s");
        }
    }

    pub fn database_name(&self) -> &str {
        self.db.name()
    }

    /// Creates Disbatch's indexes and ours. Existing identical indexes are left as they are.
    pub async fn ensure_indexes(&self) -> Result<()> {
        for (collection, model) in crate::conn::indexes::disbatch_indexes()
            .into_iter()
            .chain(crate::conn::indexes::our_indexes())
            .chain(crate::conn::indexes::stats_indexes())
        {
            let keys = model.keys.clone();
            self.collection(collection)
                .create_index(model)
                .await
                .map_err(|e| Error::mongo(format!("creating index {keys} on {collection}"), e))?;
        }
        Ok(())
    }

    /// Round trip to the server: used at start to fail fast with a clear message.
    pub async fn ping(&self) -> Result<()> {
        self.db
            .run_command(bson::doc! {"ping": 1})
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo("ping", e))
    }

    /// Runs a `bulkWrite` command (MongoDB 8.0+) and returns its per-operation results in
    /// order of report; None when this server has none, which is remembered (said once).
    async fn run_bulk_write(
        &self,
        command: Document,
        context: &'static str,
    ) -> Result<Option<Vec<Document>>> {
        let command = self.with_write_concern(command);
        let reply = match self.client.database("admin").run_command(command).await {
            Ok(reply) => reply,
            Err(e) if bulk_write_missing(&e) => {
                if self
                    .state
                    .bulk_write
                    .swap(BULK_WRITE_MISSING, Ordering::Relaxed)
                    != BULK_WRITE_MISSING
                {
                    tracing::info!(error = %e, "no bulkWrite on this server: claims and results use older commands");
                }
                return Ok(None);
            }
            Err(e) => return Err(Error::mongo(context, e)),
        };
        self.state
            .bulk_write
            .store(BULK_WRITE_WORKS, Ordering::Relaxed);
        warn_write_concern_error(&reply, context);
        Ok(Some(
            reply
                .get_document("cursor")
                .and_then(|c| c.get_array("firstBatch"))
                .map(|b| {
                    b.iter()
                        .filter_map(bson::Bson::as_document)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
        ))
    }

    /// A write command sent whole, with the client's write concern: `run_command` adds none,
    /// and batched claims and results must be as durable as every other write.
    fn with_write_concern(&self, mut command: Document) -> Document {
        let concern = self
            .client
            .write_concern()
            .and_then(|wc| bson::to_document(wc).ok())
            .filter(|d| !d.is_empty());
        if let Some(concern) = concern {
            command.insert("writeConcern", concern);
        }
        command
    }

    /// A collection for writes; reads go through `raw` and decode one document at a time.
    fn collection(&self, name: &str) -> Collection<Document> {
        self.db.collection(name)
    }
}

/// Driver options from `mongohost` and `attributes`, before the `auth` credential: shared by
/// the components and by `create-users`, which logs in as the root user instead.
pub(crate) async fn client_options(config: &Config, user: &str) -> Result<ClientOptions> {
    let mut options = ClientOptions::parse(&config.mongohost)
        .await
        .map_err(|e| mongohost_error(config, e))?;
    conn::driver_options::apply(&config.driver, &mut options)
        .map_err(|message| config_error(config, message))?;
    if options.app_name.is_none() {
        options.app_name = Some(format!("disbatch-rs/{user}"));
    }
    if options.server_selection_timeout.is_none() {
        // Fail an operation within a pass or two rather than the driver's 30 s default,
        // so loops log the outage and retry instead of stalling silently.
        options.server_selection_timeout = Some(Duration::from_secs(10));
    }
    if config.tls.enabled {
        // The URI's own TLS options win here too; `tls=false` in it turns `attributes.ssl` off.
        let mut tls = match options.tls.take() {
            Some(Tls::Disabled) => {
                options.tls = Some(Tls::Disabled);
                return Ok(options);
            }
            Some(Tls::Enabled(tls)) => tls,
            None => TlsOptions::default(),
        };
        if tls.ca_file_path.is_none() {
            tls.ca_file_path.clone_from(&config.tls.ca_file);
        }
        if tls.cert_key_file_path.is_none() {
            tls.cert_key_file_path.clone_from(&config.tls.cert_key_file);
        }
        if tls.allow_invalid_certificates.is_none() {
            tls.allow_invalid_certificates = config.tls.allow_invalid_certificates.then_some(true);
        }
        options.tls = Some(Tls::Enabled(tls));
    }
    Ok(options)
}

/// A URI the driver cannot read is a config error, not an outage to retry: it names the file
/// and the key, with the driver's text redacted (it may quote the URI). A failed DNS lookup
/// of a `mongodb+srv://` URI stays a database error, which callers retry.
fn mongohost_error(config: &Config, e: mongodb::error::Error) -> Error {
    use mongodb::error::ErrorKind;
    match e.kind.as_ref() {
        ErrorKind::InvalidArgument { .. } => config_error(
            config,
            disbatch_config::mongohost_unusable(&config.mongohost, &e.kind.to_string()),
        ),
        _ => Error::mongo("parsing `mongohost`", e),
    }
}

/// A problem with the config file that only the driver found.
fn config_error(config: &Config, message: String) -> Error {
    Error::Config {
        path: config.path.clone(),
        message,
    }
}

/// What a write matched and changed, for the API's result envelopes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteCounts {
    pub matched: u64,
    pub modified: u64,
    pub deleted: u64,
    pub upserted_id: Option<bson::Bson>,
}

impl From<mongodb::results::UpdateResult> for WriteCounts {
    fn from(r: mongodb::results::UpdateResult) -> Self {
        WriteCounts {
            matched: r.matched_count,
            modified: r.modified_count,
            deleted: 0,
            upserted_id: r.upserted_id,
        }
    }
}

impl From<mongodb::results::DeleteResult> for WriteCounts {
    fn from(r: mongodb::results::DeleteResult) -> Self {
        WriteCounts {
            deleted: r.deleted_count,
            ..Default::default()
        }
    }
}

/// A count from an aggregation (`$sum` gives Int32, Int64 or Double); absent or negative is 0.
/// The attempts a task's retry policy and `max_retries` count: those started since an
/// operator last retried it (`attempts_before_retry`), this one included, at least 1.
pub fn attempts_counted(task: &bson::Document) -> i64 {
    let started = count_value(task.get(schema::task::ATTEMPTS)).max(1);
    let before = count_value(task.get(schema::task::ATTEMPTS_BEFORE_RETRY));
    i64::try_from(started.saturating_sub(before).max(1)).unwrap_or(i64::MAX)
}

pub(crate) fn count_value(value: Option<&bson::Bson>) -> u64 {
    match value {
        Some(bson::Bson::Int32(n)) => (*n).max(0) as u64,
        Some(bson::Bson::Int64(n)) => (*n).max(0) as u64,
        Some(bson::Bson::Double(d)) if d.is_finite() => d.max(0.0) as u64,
        _ => 0,
    }
}
