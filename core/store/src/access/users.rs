//! MongoDB roles and users per component (`disbatch create-users`): the privileges and the commands.

use std::collections::{BTreeMap, BTreeSet};

use bson::{doc, Bson, Document};
use mongodb::options::Credential;
use mongodb::{Client, Database};
use serde_json::Value;

use crate::error::{Error, Result};
use disbatch_config::{Component, Config};
use disbatch_model::schema::{
    ATTEMPTS, BALANCE, BATCHES, CHUNKS, FILES, GRAPHS, LEASES, NODES, QUEUES, RATE_LIMITS,
    STATS_MINUTELY, TASKS, TASK_COUNTS,
};

/// Actions by collection; the collection `""` is every collection of the database.
pub type Perms = BTreeMap<String, BTreeSet<String>>;

/// The five Disbatch users, in Disbatch's order. Each gets a custom role of the same name.
pub const COMPONENTS: [Component; 5] = [
    Component::Den,
    Component::Web,
    Component::TaskRunner,
    Component::QueueBalance,
    Component::Plugin,
];

/// Where root users live.
const ADMIN_DB: &str = "admin";
const USER_NOT_FOUND: i32 = 11;
const ROLE_NOT_FOUND: i32 = 31;

/// One role to create, and the user of the same name that gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleSpec {
    pub name: &'static str,
    pub privileges: Perms,
}

impl RoleSpec {
    /// `collection: action, action; …` for printing what was created.
    pub fn describe(&self) -> String {
        if self.privileges.is_empty() {
            return "no privileges".into();
        }
        self.privileges
            .iter()
            .map(|(collection, actions)| {
                let actions: Vec<&str> = actions.iter().map(String::as_str).collect();
                format!("{collection:?}: {}", actions.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// What each component needs, by collection. Lines without a comment are Disbatch 4's table;
/// every addition says which of our code paths needs it.
fn builtin(component: Component) -> Vec<(&'static str, &'static [&'static str])> {
    match component {
        Component::Den => vec![
            // `changeStream` is ours: the maintenance leader's one stream watches the database
            // (queue changes, work signals and task inserts by any writer). `listIndexes` too:
            // the leader's workflows sweep learns from the tasks' indexes that graphs are in use.
            ("", &["find", "changeStream", "listIndexes"]),
            // Heartbeat is an upserting findAndModify.
            (NODES, &["insert", "update", "createIndex"]),
            // Ours besides Disbatch's: the continuous-unit turn (`next_continuous`), the
            // QueueBalance threads and the work signals the DEN writes; `changeStream`: a
            // stream on queues alone, what a role from before the database stream allows.
            (QUEUES, &["update", "createIndex", "changeStream"]),
            // `insert` is ours: continuous queues get their synthetic units from the DEN.
            // `remove` too: the maintenance leader prunes ended tasks past their retention,
            // with their output files and attempts.
            (TASKS, &["insert", "update", "remove", "createIndex"]),
            (CHUNKS, &["remove", "createIndex"]),
            (FILES, &["remove", "createIndex"]),
            // Ours: lease recovery writes the lost attempt's record (an upsert: the runner
            // may have died before writing it); the DEN creates the attempts index.
            (ATTEMPTS, &["insert", "update", "remove", "createIndex"]),
            // Ours: the QueueBalance singleton lease, taken by upsert.
            (LEASES, &["insert", "update"]),
            // Ours: QueueBalance runs inside the DEN and upserts its status.
            (BALANCE, &["insert", "update"]),
            // Ours: claims and results keep the task counts; the maintenance leader
            // creates and reconciles them.
            (TASK_COUNTS, &["insert", "update"]),
            // Ours: the maintenance leader upserts per-minute statistics and creates their
            // unique and TTL indexes.
            (STATS_MINUTELY, &["insert", "update", "createIndex"]),
            // Ours: rate-limit grants (upserts) and their refunds, the maintenance leader's
            // removal of quiet partitions' windows, and their index.
            (RATE_LIMITS, &["insert", "update", "remove", "createIndex"]),
            // Ours: a batch is marked done when its callback is released.
            (BATCHES, &["update"]),
        ],
        Component::Web => vec![
            ("", &["find", "listIndexes"]),
            // `createIndex` on every collection below is ours: the DCI runs ensure_indexes at
            // start so queue names stay unique before any DEN has run.
            (BALANCE, &["insert", "update"]),
            // `remove` is ours: DELETE /nodes/:node forgets a dead node.
            (NODES, &["update", "remove", "createIndex"]),
            (QUEUES, &["insert", "update", "remove", "createIndex"]),
            // Ours: cancel, retry and unit requeue update tasks; DELETE /tasks/:id removes one.
            (TASKS, &["insert", "update", "remove", "createIndex"]),
            // Ours: deleting a task deletes its GridFS output.
            (FILES, &["remove", "createIndex"]),
            (CHUNKS, &["remove", "createIndex"]),
            (ATTEMPTS, &["createIndex"]),
            // Ours: creating, cancelling, retrying and deleting tasks keep the task counts.
            (TASK_COUNTS, &["update"]),
            // Ours: ensure_indexes creates the statistics' indexes too (GET /stats only reads).
            (STATS_MINUTELY, &["createIndex"]),
            // Ours: ensure_indexes creates the rate-limit windows' index (the queue view only
            // reads them).
            (RATE_LIMITS, &["createIndex"]),
            // Ours: graphs and batches are stored (and taken back if their tasks cannot be)
            // and cancelled by the DCI.
            (GRAPHS, &["insert", "update", "remove"]),
            (BATCHES, &["insert", "update", "remove"]),
        ],
        Component::TaskRunner => vec![
            ("", &["find"]),
            // Disbatch's leftover, kept so a Perl runner can share the role.
            (QUEUES, &["update"]),
            // `insert` is ours: chained `then` units are inserted by the runner; and
            // `createIndex`: the first unit it chains to a queue with `unique` makes that
            // limit's index, which the units' unique keys rely on.
            (TASKS, &["insert", "update", "createIndex"]),
            // `remove` is ours: the chunks of a failed upload are deleted.
            (CHUNKS, &["insert", "remove"]),
            (FILES, &["insert"]),
            // Ours: one record per run, written when it ends (`update`: a discarded result).
            (ATTEMPTS, &["insert", "update"]),
            // Ours: a result the runner records itself, and chained units, keep the counts.
            (TASK_COUNTS, &["update"]),
        ],
        // Disbatch's separate queuebalanced; ours runs inside the DEN as `disbatchd`.
        Component::QueueBalance => vec![
            (BALANCE, &["find", "insert", "update"]),
            (QUEUES, &["find", "update"]),
            (TASKS, &["find"]),
        ],
        // Only what the plugin-perms file grants, as in Disbatch: our plugins get no connection.
        Component::Plugin => vec![],
    }
}

/// The five roles: the built-in privileges (the plugin role's from `plugin_perms`) with
/// `additional` (`{role: {collection: [actions]}}`) merged in.
pub fn roles(plugin_perms: &Perms, additional: &BTreeMap<String, Perms>) -> Result<Vec<RoleSpec>> {
    let known: Vec<&str> = COMPONENTS.iter().map(|c| c.user()).collect();
    if let Some(unknown) = additional.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(Error::Invalid(format!(
            "additional permissions name role {unknown:?}, which is not one of {}",
            known.join(", ")
        )));
    }
    let mut out = Vec::with_capacity(COMPONENTS.len());
    for component in COMPONENTS {
        let name = component.user();
        let mut privileges = Perms::new();
        for (collection, actions) in builtin(component) {
            privileges
                .entry(collection.to_string())
                .or_default()
                .extend(actions.iter().map(|a| a.to_string()));
        }
        let extra = (component == Component::Plugin).then_some(plugin_perms);
        for perms in extra.into_iter().chain(additional.get(name)) {
            for (collection, actions) in perms {
                privileges
                    .entry(collection.clone())
                    .or_default()
                    .extend(actions.iter().cloned());
            }
        }
        out.push(RoleSpec { name, privileges });
    }
    Ok(out)
}

/// The `createRole` command for `role` in `database`.
pub fn create_role_command(database: &str, role: &RoleSpec) -> Document {
    let privileges: Vec<Bson> = role
        .privileges
        .iter()
        .map(|(collection, actions)| {
            let actions: Vec<&str> = actions.iter().map(String::as_str).collect();
            Bson::Document(doc! {
                "resource": {"db": database, "collection": collection},
                "actions": actions,
            })
        })
        .collect();
    doc! {"createRole": role.name, "privileges": privileges, "roles": []}
}

/// Parses a plugin-perms file: `{collection: [actions]}` (comments and trailing commas allowed).
pub fn parse_perms(text: &str) -> Result<Perms> {
    perms_from(&parse_object(text)?, "")
}

/// Parses an additional-perms file: `{role: {collection: [actions]}}`.
pub fn parse_additional(text: &str) -> Result<BTreeMap<String, Perms>> {
    let mut out = BTreeMap::new();
    for (role, value) in &parse_object(text)? {
        let Value::Object(perms) = value else {
            return Err(Error::Invalid(format!(
                "role {role:?}: expected an object of collection: [actions]"
            )));
        };
        out.insert(
            role.clone(),
            perms_from(perms, &format!("role {role:?}, "))?,
        );
    }
    Ok(out)
}

fn parse_object(text: &str) -> Result<serde_json::Map<String, Value>> {
    let options = jsonc_parser::ParseOptions {
        allow_comments: true,
        allow_trailing_commas: true,
        allow_loose_object_property_names: false,
    };
    match jsonc_parser::parse_to_serde_value(text, &options) {
        Ok(Some(Value::Object(map))) => Ok(map),
        Ok(Some(_)) => Err(Error::Invalid("the top level must be a JSON object".into())),
        // Disbatch's shipped plugin-perms example is all comments: it grants nothing.
        Ok(None) => Ok(Default::default()),
        Err(e) => Err(Error::Invalid(format!("not valid JSON: {e}"))),
    }
}

fn perms_from(map: &serde_json::Map<String, Value>, at: &str) -> Result<Perms> {
    let mut perms = Perms::new();
    for (collection, actions) in map {
        let bad = || {
            Error::Invalid(format!(
                "{at}collection {collection:?}: expected an array of action names, e.g. [\"insert\"]"
            ))
        };
        let Value::Array(actions) = actions else {
            return Err(bad());
        };
        let entry = perms.entry(collection.clone()).or_default();
        for action in actions {
            match action.as_str() {
                Some(a) if !a.trim().is_empty() => entry.insert(a.to_string()),
                _ => return Err(bad()),
            };
        }
    }
    Ok(perms)
}

/// Each user's password from config `auth`, in `COMPONENTS` order; a missing one is an error
/// that names the user.
pub fn passwords(config: &Config) -> Result<Vec<(&'static str, String)>> {
    COMPONENTS
        .iter()
        .map(|c| match config.auth.get(c.user()) {
            Some(p) if !p.is_empty() => Ok((c.user(), p.clone())),
            _ => Err(Error::Invalid(format!(
                "config {}: `auth` has no password for MongoDB user {:?}; create-users needs all five ({})",
                config.path.display(),
                c.user(),
                COMPONENTS.map(|c| c.user()).join(", ")
            ))),
        })
        .collect()
}

/// A root connection that manages the Disbatch roles and users in the config's database.
pub struct UserAdmin {
    db: Database,
    root_user: String,
}

impl UserAdmin {
    /// Creates `user` with role `root` in `admin` without logging in: MongoDB's localhost
    /// exception, which the server allows only while it has no users.
    pub async fn create_root(config: &Config, user: &str, password: &str) -> Result<()> {
        let mut options = crate::client_options(config, "create-users").await?;
        // The exception is for unauthenticated connections only.
        options.credential = None;
        let client =
            Client::with_options(options).map_err(|e| Error::mongo("creating the client", e))?;
        let command = doc! {
            "createUser": user, "pwd": password, "roles": [{"role": "root", "db": ADMIN_DB}],
        };
        client
            .database(ADMIN_DB)
            .run_command(command)
            .await
            .map(|_| ())
            .map_err(|e| {
                refused(
                    format!(
                        "creating root user {user:?} in {ADMIN_DB} (--create-root works only \
                         from localhost while the server has no users)"
                    ),
                    e,
                )
            })
    }

    /// Logs in as `root_user` (auth database `admin`) and checks the login with a first command.
    pub async fn connect(config: &Config, root_user: &str, password: &str) -> Result<UserAdmin> {
        let mut options = crate::client_options(config, "create-users").await?;
        options.credential = Some(
            Credential::builder()
                .username(root_user.to_string())
                .password(password.to_string())
                .source(ADMIN_DB.to_string())
                .build(),
        );
        let client =
            Client::with_options(options).map_err(|e| Error::mongo("creating the client", e))?;
        let admin = UserAdmin {
            db: client.database(&config.database),
            root_user: root_user.to_string(),
        };
        admin
            .db
            .run_command(doc! {"usersInfo": 1})
            .await
            .map_err(|e| {
                refused(
                    format!("logging in as {root_user:?} (auth database {ADMIN_DB})"),
                    e,
                )
            })?;
        Ok(admin)
    }

    pub fn database_name(&self) -> &str {
        self.db.name()
    }

    /// Which of the five roles and users already exist, as `role NAME` / `user NAME`.
    pub async fn existing(&self) -> Result<Vec<String>> {
        let mut found = Vec::new();
        for (command, list, field, kind) in [
            ("rolesInfo", "roles", "role", "role"),
            ("usersInfo", "users", "user", "user"),
        ] {
            let reply = self
                .db
                .run_command(doc! {command: 1})
                .await
                .map_err(|e| refused(format!("{command} as {:?}", self.root_user), e))?;
            let names: BTreeSet<&str> = reply
                .get_array(list)
                .map(|a| {
                    a.iter()
                        .filter_map(|d| d.as_document()?.get_str(field).ok())
                        .collect()
                })
                .unwrap_or_default();
            for c in COMPONENTS {
                if names.contains(c.user()) {
                    found.push(format!("{kind} {}", c.user()));
                }
            }
        }
        Ok(found)
    }

    /// Drops the five users and roles, ignoring those that do not exist. Returns what it dropped.
    pub async fn drop_all(&self) -> Result<Vec<String>> {
        let mut dropped = Vec::new();
        for (command, kind, not_found) in [
            ("dropUser", "user", USER_NOT_FOUND),
            ("dropRole", "role", ROLE_NOT_FOUND),
        ] {
            for c in COMPONENTS {
                match self.db.run_command(doc! {command: c.user()}).await {
                    Ok(_) => dropped.push(format!("{kind} {}", c.user())),
                    Err(e) if command_code(&e) == Some(not_found) => {}
                    Err(e) => return Err(refused(format!("dropping {kind} {:?}", c.user()), e)),
                }
            }
        }
        Ok(dropped)
    }

    /// Creates `role` and a user of the same name that has it, with `password`.
    pub async fn create(&self, role: &RoleSpec, password: &str) -> Result<()> {
        let database = self.db.name().to_string();
        self.db
            .run_command(create_role_command(&database, role))
            .await
            .map_err(|e| refused(format!("creating role {:?}", role.name), e))?;
        let user = doc! {
            "createUser": role.name, "pwd": password,
            "roles": [{"role": role.name, "db": &database}],
        };
        self.db
            .run_command(user)
            .await
            .map(|_| ())
            .map_err(|e| refused(format!("creating user {:?}", role.name), e))
    }
}

/// The server's own words for a refusal (a wrong password, a missing privilege, an existing
/// user) instead of the driver's whole error chain; other failures keep their detail.
fn refused(context: String, err: mongodb::error::Error) -> Error {
    use mongodb::error::ErrorKind;
    match err.kind.as_ref() {
        ErrorKind::Command(c) => Error::Invalid(format!(
            "{context}: the server refused: {} ({})",
            c.message, c.code_name
        )),
        ErrorKind::Authentication { message, .. } => Error::Invalid(format!(
            "{context}: authentication failed ({message}): check the user and password"
        )),
        _ => Error::mongo(context, err),
    }
}

fn command_code(err: &mongodb::error::Error) -> Option<i32> {
    match err.kind.as_ref() {
        mongodb::error::ErrorKind::Command(e) => Some(e.code),
        _ => None,
    }
}

#[cfg(test)]
#[path = "users_tests.rs"]
mod tests;
