//! What the server says about itself: its topology (`hello`), its default write concern
//! (`getDefaultRWConcern`), and its clock (`hello`'s `localTime`, for `fleet_time`).

use bson::{doc, Bson, Document};
use mongodb::options::{Acknowledgment, WriteConcern};

use super::durability::{assess, ServerDefault, ServerFacts, Topology, Verdict};
use crate::error::{Error, Result};
use crate::Store;
use disbatch_model::fleet_time::{self, Reading};

const ADMIN: &str = "admin";

impl Store {
    /// Whether the write concern in effect survives a failover of this server. Never fails:
    /// what the server will not tell is reported as unknown or assumed.
    pub async fn durability(&self) -> Verdict {
        let facts = self.server_facts().await;
        assess(&facts, self.client.write_concern())
    }

    /// `hello` (or `isMaster` on servers without it), then `getDefaultRWConcern`.
    pub async fn server_facts(&self) -> ServerFacts {
        let admin = self.client.database(ADMIN);
        let hello = match admin.run_command(doc! {"hello": 1}).await {
            Ok(reply) => Ok(reply),
            Err(e) => {
                tracing::debug!(error = %e, "hello failed; trying isMaster");
                admin.run_command(doc! {"isMaster": 1}).await
            }
        };
        let (topology, max_wire_version) = match hello {
            Ok(reply) => topology_from_hello(&reply),
            Err(e) => {
                tracing::debug!(error = %e, "isMaster failed");
                (Topology::Unknown(why_not(&e)), None)
            }
        };
        let default = if matches!(topology, Topology::Standalone | Topology::Unknown(_)) {
            // Nothing will be judged: spare the server a command.
            ServerDefault::Implicit
        } else {
            match admin.run_command(doc! {"getDefaultRWConcern": 1}).await {
                Ok(reply) => default_from_reply(&reply),
                Err(e) => {
                    tracing::debug!(error = %e, "getDefaultRWConcern failed");
                    ServerDefault::Unavailable(why_not(&e))
                }
            }
        };
        ServerFacts {
            topology,
            max_wire_version,
            default,
        }
    }
}

impl Store {
    /// Reads the server's clock again when the last reading is `max_age` old or more (or there
    /// is none), for every time this process writes or judges (`fleet_time`). One `hello`: it
    /// needs no privilege, and the server answers it without touching data.
    pub async fn keep_clock(&self, max_age: std::time::Duration) -> Result<()> {
        if !fleet_time::reading_due(max_age) {
            return Ok(());
        }
        match self.read_server_clock().await? {
            Some(reading) => fleet_time::observe(reading),
            None => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::warn!(
                        "the server's answer to hello has no localTime: this process takes times from its own host's clock, which must then agree with the other hosts'"
                    )
                });
            }
        }
        Ok(())
    }

    /// One reading of the server's clock, between two readings of this host's; None when the
    /// server does not say its time.
    pub async fn read_server_clock(&self) -> Result<Option<Reading>> {
        let sent_boot_ns = fleet_time::boot_ns();
        let reply = self
            .db
            .run_command(doc! {"hello": 1})
            .await
            .map_err(|e| Error::mongo("reading the server's clock (hello)", e))?;
        let received_boot_ns = fleet_time::boot_ns();
        // The host's own wall clock: what the offset measures, the one place it is read.
        let received_wall_ms = bson::DateTime::now().timestamp_millis();
        let Some(Bson::DateTime(server)) = reply.get("localTime") else {
            return Ok(None);
        };
        Ok(Some(Reading {
            sent_boot_ns,
            received_boot_ns,
            server: *server,
            received_wall_ms,
        }))
    }
}

/// Why a command about the server failed, short: its reply quotes the whole command, and a
/// refusal is expected (the `disbatchd` role grants no cluster privilege).
fn why_not(err: &mongodb::error::Error) -> String {
    use mongodb::error::ErrorKind;
    match err.kind.as_ref() {
        ErrorKind::Command(e) if e.code == 13 => "code 13, this user may not run it".into(),
        ErrorKind::Command(e) if e.code == 59 => "code 59, the server does not have it".into(),
        ErrorKind::Command(e) if !e.code_name.is_empty() => {
            let name: String = e
                .code_name
                .chars()
                .filter(|c| !c.is_control())
                .take(80)
                .collect();
            format!("code {}, {name}", e.code)
        }
        _ => crate::driver_error::server_message(err)
            .unwrap_or_else(|| crate::driver_error::unavailable_reason(err).to_string()),
    }
}

/// A `hello` reply's topology: `setName` makes a replica set member, `msg: "isdbgrid"` a
/// `mongos`, anything else a standalone server.
pub(crate) fn topology_from_hello(reply: &Document) -> (Topology, Option<i32>) {
    let wire = match reply.get("maxWireVersion") {
        Some(Bson::Int32(n)) => Some(*n),
        Some(Bson::Int64(n)) => i32::try_from(*n).ok(),
        _ => None,
    };
    let listed = |field: &str| reply.get_array(field).map_or(0, Vec::len);
    let topology = if let Ok(name) = reply.get_str("setName") {
        Topology::ReplicaSet {
            name: name.to_string(),
            // A member that answers holds data (or is an arbiter, which a client never
            // connects to): at least one.
            data_bearing: (listed("hosts") + listed("passives")).max(1),
            arbiters: listed("arbiters"),
        }
    } else if reply.get_str("msg") == Ok("isdbgrid") {
        Topology::Sharded
    } else {
        Topology::Standalone
    };
    (topology, wire)
}

/// A `getDefaultRWConcern` reply. From 5.0 on it names its source (`implicit`: the server's
/// own default, `global`: set by an operator); before, a `defaultWriteConcern` present was
/// set by an operator, and none means the implicit w: 1.
pub(crate) fn default_from_reply(reply: &Document) -> ServerDefault {
    let implicit = reply.get_str("defaultWriteConcernSource") == Ok("implicit");
    match reply.get_document("defaultWriteConcern") {
        Ok(wc) => ServerDefault::Reported {
            write_concern: write_concern(wc),
            implicit,
        },
        Err(_) => ServerDefault::Implicit,
    }
}

/// The `w` and `j` of a stored write concern; values that are neither are left unset.
fn write_concern(d: &Document) -> WriteConcern {
    let w = match d.get("w") {
        Some(Bson::Int32(n)) => u32::try_from(*n).ok().map(Acknowledgment::Nodes),
        Some(Bson::Int64(n)) => u32::try_from(*n).ok().map(Acknowledgment::Nodes),
        Some(Bson::Double(n)) if n.fract() == 0.0 && *n >= 0.0 && *n <= f64::from(u32::MAX) => {
            Some(Acknowledgment::Nodes(*n as u32))
        }
        Some(Bson::String(s)) => Some(Acknowledgment::from(s.as_str())),
        _ => None,
    };
    let mut wc = WriteConcern::default();
    wc.w = w;
    wc.journal = d.get_bool("j").ok();
    wc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_tells_the_three_topologies_apart() {
        let rs = doc! {
            "isWritablePrimary": true, "setName": "rs0", "maxWireVersion": 25,
            "hosts": ["a:1", "b:1"], "arbiters": ["c:1"],
        };
        assert_eq!(
            topology_from_hello(&rs),
            (
                Topology::ReplicaSet {
                    name: "rs0".into(),
                    data_bearing: 2,
                    arbiters: 1
                },
                Some(25)
            )
        );
        let mongos = doc! {"isWritablePrimary": true, "msg": "isdbgrid", "maxWireVersion": 21i64};
        assert_eq!(topology_from_hello(&mongos), (Topology::Sharded, Some(21)));
        let standalone = doc! {"isWritablePrimary": true, "maxWireVersion": "odd"};
        assert_eq!(
            topology_from_hello(&standalone),
            (Topology::Standalone, None)
        );
    }

    #[test]
    fn a_set_name_without_hosts_is_still_one_member() {
        let (t, _) = topology_from_hello(&doc! {"setName": "s", "hosts": "not an array"});
        assert!(matches!(
            t,
            Topology::ReplicaSet {
                data_bearing: 1,
                arbiters: 0,
                ..
            }
        ));
    }

    #[test]
    fn default_write_concern_replies() {
        let implicit = doc! {
            "defaultWriteConcern": {"w": "majority", "wtimeout": 0},
            "defaultWriteConcernSource": "implicit",
        };
        assert!(matches!(
            default_from_reply(&implicit),
            ServerDefault::Reported {
                write_concern: WriteConcern {
                    w: Some(Acknowledgment::Majority),
                    ..
                },
                implicit: true
            }
        ));
        let global = doc! {
            "defaultWriteConcern": {"w": 1, "j": false},
            "defaultWriteConcernSource": "global",
        };
        let ServerDefault::Reported {
            write_concern: wc,
            implicit: false,
        } = default_from_reply(&global)
        else {
            panic!("an operator's default")
        };
        assert_eq!(wc.w, Some(Acknowledgment::Nodes(1)));
        assert_eq!(wc.journal, Some(false));
        // 4.4 with none set.
        assert_eq!(default_from_reply(&doc! {"ok": 1}), ServerDefault::Implicit);
        let odd = doc! {"defaultWriteConcern": {"w": -3}};
        assert!(matches!(
            default_from_reply(&odd),
            ServerDefault::Reported {
                write_concern: WriteConcern { w: None, .. },
                ..
            }
        ));
    }
}
