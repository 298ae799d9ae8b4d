//! Whether the write concern in effect lets claims, leases and results survive a failover:
//! the decision alone, from what the server said about itself (`store::topology` asks it).
//!
//! Fencing compares a stored task's `attempt`, `mtime`, `status` and a lease's `until`. That
//! is only sound if a write the server acknowledged stays written: a write acknowledged by one
//! member only (w: 1) can be rolled back when another member becomes primary, and then two
//! nodes may both believe they hold one task or lease, or a stored result disappears.

use mongodb::options::{Acknowledgment, WriteConcern};

/// MongoDB 5.0's wire version: from it on, the implicit default write concern is majority
/// (unless arbiters make it w: 1); before it, w: 1.
pub const WIRE_VERSION_5_0: i32 = 13;

/// What the server is, as `hello` described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// Neither a replica set member nor a router: there is no other member to fail over to.
    Standalone,
    /// A replica set member. `data_bearing` counts the members `hello` lists that hold data
    /// (`hosts` and `passives`; hidden members are not listed), `arbiters` its arbiters.
    ReplicaSet {
        name: String,
        data_bearing: usize,
        arbiters: usize,
    },
    /// A `mongos`: each shard is a replica set, whose size cannot be seen from here.
    Sharded,
    /// `hello` could not be run or read; why.
    Unknown(String),
}

/// The deployment's default write concern, as `getDefaultRWConcern` reported it.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerDefault {
    /// Reported: set by an operator (`setDefaultRWConcern`), or (5.0+) the implicit default
    /// the server worked out for itself.
    Reported {
        write_concern: WriteConcern,
        implicit: bool,
    },
    /// None reported (4.4 with none set): the implicit default applies, worked out here.
    Implicit,
    /// The command failed (not supported, or the user may not run it); why.
    Unavailable(String),
}

/// What the server told about itself at start.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerFacts {
    pub topology: Topology,
    /// `hello`'s `maxWireVersion`, which tells pre-5.0 servers apart.
    pub max_wire_version: Option<i32>,
    pub default: ServerDefault,
}

/// The decision, with the words for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A standalone server: nothing to fail over to, so nothing to check.
    NoFailover(String),
    /// The write concern in effect keeps acknowledged writes across a failover (or is a tag
    /// set we cannot judge); what it is and where it comes from.
    Durable(String),
    /// An acknowledged write can be rolled back by a failover; what to set instead.
    Warning(String),
    /// The topology could not be told; nothing was checked.
    Unknown(String),
}

impl Verdict {
    /// The warning to log, if any.
    pub fn warning(&self) -> Option<&str> {
        match self {
            Verdict::Warning(text) => Some(text),
            _ => None,
        }
    }

    pub fn text(&self) -> &str {
        match self {
            Verdict::NoFailover(t) | Verdict::Durable(t) | Verdict::Warning(t) => t,
            Verdict::Unknown(t) => t,
        }
    }
}

/// What to tell the operator about the write concern in effect: `configured` is the client's
/// (from `attributes` or the `mongohost` URI), which wins over the server's default.
pub fn assess(facts: &ServerFacts, configured: Option<&WriteConcern>) -> Verdict {
    let (place, majority) = match &facts.topology {
        Topology::Standalone => {
            return Verdict::NoFailover(
                "standalone server: there is no failover to survive, so the write concern is not checked"
                    .into(),
            )
        }
        Topology::Unknown(why) => {
            return Verdict::Unknown(format!(
                "could not tell the server's topology ({why}): the write concern is not checked"
            ))
        }
        Topology::ReplicaSet {
            name,
            data_bearing,
            arbiters,
        } => (
            format!("replica set `{name}`"),
            Some(majority_of(data_bearing + arbiters)),
        ),
        Topology::Sharded => ("this sharded cluster".to_string(), None),
    };
    let (w, from) = match configured.and_then(|wc| wc.w.clone()) {
        Some(w) => (w, "configured".to_string()),
        None => server_w(facts),
    };
    let journal = configured
        .and_then(|wc| wc.journal)
        .or(match &facts.default {
            ServerDefault::Reported { write_concern, .. } => write_concern.journal,
            _ => None,
        });
    let shown = describe(&w, journal);
    let fix = "set `attributes.w` to \"majority\", or `w=majority` in `mongohost` (which wins over `attributes`)";
    let lost = "a claim, lease or result the old primary acknowledged can be rolled back, and two nodes may then both hold one task or lease, or a stored result may vanish";
    let too_few = match &w {
        Acknowledgment::Nodes(0) => Some("unacknowledged, and the driver refuses such writes"),
        // Even on a one-member set: it stops being a majority once members are added, and
        // the number in the config does not grow with the set.
        Acknowledgment::Nodes(1) => Some("acknowledged by one member"),
        Acknowledgment::Nodes(n)
            if majority.is_some_and(|m| usize::try_from(*n).is_ok_and(|n| n < m)) =>
        {
            Some("fewer members than a majority")
        }
        _ => None,
    };
    if let Some(why) = too_few {
        return Verdict::Warning(format!(
            "write concern {shown} ({from}; {why}) does not survive a failover of {place}: {lost}; {fix}"
        ));
    }
    if journal == Some(false) {
        return Verdict::Warning(format!(
            "write concern {shown} ({from}) lets members acknowledge writes not yet in their journal: a crash of {place}'s members may lose them; do not set j to false (`attributes.j`, `journal=` in `mongohost`, or the server's default)"
        ));
    }
    let caveat = match (&w, majority) {
        (Acknowledgment::Custom(_), _) => {
            "; a tag set survives a failover only if it requires a majority of voting members"
        }
        (Acknowledgment::Nodes(_), None) => {
            "; it survives a failover only if it is a majority of each shard's voting members"
        }
        _ => "",
    };
    Verdict::Durable(format!(
        "write concern {shown} ({from}) on {place}: acknowledged claims, leases and results survive a failover{caveat}"
    ))
}

/// The server's default w and where it comes from, when the client sets none.
fn server_w(facts: &ServerFacts) -> (Acknowledgment, String) {
    match &facts.default {
        ServerDefault::Reported {
            write_concern: WriteConcern { w: Some(w), .. },
            implicit,
        } => {
            let from = if *implicit {
                "the server's implicit default"
            } else {
                "the server's default, set by setDefaultRWConcern"
            };
            (w.clone(), from.into())
        }
        ServerDefault::Reported { .. } | ServerDefault::Implicit => {
            let (w, why) = implicit_w(facts);
            (w, format!("the server's implicit default: {why}"))
        }
        ServerDefault::Unavailable(reason) => {
            let (w, why) = implicit_w(facts);
            (
                w,
                format!(
                    "assumed: getDefaultRWConcern failed: {reason}; the implicit default is {why}"
                ),
            )
        }
    }
}

/// MongoDB's implicit default write concern for what `hello` showed.
fn implicit_w(facts: &ServerFacts) -> (Acknowledgment, &'static str) {
    if facts.max_wire_version.is_some_and(|v| v < WIRE_VERSION_5_0) {
        return (Acknowledgment::Nodes(1), "w: 1 before MongoDB 5.0");
    }
    if let Topology::ReplicaSet {
        data_bearing,
        arbiters,
        ..
    } = &facts.topology
    {
        // MongoDB's rule: with arbiters, w: 1 unless the data-bearing members outnumber a
        // voting majority (every listed member is taken to vote).
        if *arbiters > 0 && *data_bearing <= majority_of(data_bearing + arbiters) {
            return (
                Acknowledgment::Nodes(1),
                "w: 1 with arbiters and too few data-bearing members",
            );
        }
    }
    (Acknowledgment::Majority, "majority since MongoDB 5.0")
}

fn majority_of(voting: usize) -> usize {
    voting / 2 + 1
}

fn describe(w: &Acknowledgment, journal: Option<bool>) -> String {
    let w = match w {
        Acknowledgment::Nodes(n) => format!("w: {n}"),
        Acknowledgment::Majority => "w: \"majority\"".to_string(),
        Acknowledgment::Custom(tag) => format!("w: {tag:?}"),
        // The enum is non-exhaustive: a future variant is shown as the driver prints it.
        other => format!("w: {other:?}"),
    };
    match journal {
        Some(j) => format!("{w}, j: {j}"),
        None => w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica_set() -> Topology {
        Topology::ReplicaSet {
            name: "rs0".into(),
            data_bearing: 3,
            arbiters: 0,
        }
    }

    fn facts(topology: Topology, default: ServerDefault) -> ServerFacts {
        ServerFacts {
            topology,
            max_wire_version: Some(25),
            default,
        }
    }

    fn w(ack: Acknowledgment) -> WriteConcern {
        WriteConcern::builder().w(ack).build()
    }

    fn reported(ack: Acknowledgment, implicit: bool) -> ServerDefault {
        ServerDefault::Reported {
            write_concern: w(ack),
            implicit,
        }
    }

    #[test]
    fn replica_set_with_w_1_warns_and_says_what_to_set() {
        let v = assess(
            &facts(replica_set(), ServerDefault::Implicit),
            Some(&w(Acknowledgment::Nodes(1))),
        );
        let text = v.warning().expect("a warning");
        assert!(text.contains("w: 1 (configured"), "{text}");
        assert!(text.contains("`attributes.w` to \"majority\""), "{text}");
        assert!(text.contains("replica set `rs0`"), "{text}");
    }

    #[test]
    fn replica_set_with_w_majority_does_not_warn() {
        let v = assess(
            &facts(replica_set(), ServerDefault::Implicit),
            Some(&w(Acknowledgment::Majority)),
        );
        assert!(matches!(v, Verdict::Durable(_)), "{v:?}");
    }

    #[test]
    fn unset_w_with_a_majority_server_default_does_not_warn() {
        let implicit = assess(
            &facts(replica_set(), reported(Acknowledgment::Majority, true)),
            None,
        );
        assert!(matches!(&implicit, Verdict::Durable(t) if t.contains("implicit default")));
        let worked_out = assess(&facts(replica_set(), ServerDefault::Implicit), None);
        assert_eq!(worked_out.warning(), None);
        let global = assess(
            &facts(replica_set(), reported(Acknowledgment::Majority, false)),
            None,
        );
        assert!(matches!(&global, Verdict::Durable(t) if t.contains("setDefaultRWConcern")));
    }

    #[test]
    fn unset_w_with_the_default_unreadable_assumes_majority_and_says_so() {
        let v = assess(
            &facts(
                replica_set(),
                ServerDefault::Unavailable("code 13, this user may not run it".into()),
            ),
            None,
        );
        assert_eq!(v.warning(), None);
        assert!(v.text().contains("assumed"), "{v:?}");
        assert!(v.text().contains("may not run it"), "{v:?}");
    }

    #[test]
    fn a_server_default_of_w_1_warns() {
        let v = assess(
            &facts(replica_set(), reported(Acknowledgment::Nodes(1), false)),
            None,
        );
        assert!(
            v.warning()
                .is_some_and(|t| t.contains("setDefaultRWConcern")),
            "{v:?}"
        );
    }

    #[test]
    fn mongos_with_w_0_warns() {
        let v = assess(
            &facts(Topology::Sharded, ServerDefault::Implicit),
            Some(&w(Acknowledgment::Nodes(0))),
        );
        assert!(v.warning().is_some_and(|t| t.contains("w: 0")), "{v:?}");
    }

    #[test]
    fn standalone_is_never_checked() {
        for configured in [None, Some(w(Acknowledgment::Nodes(1)))] {
            let v = assess(
                &facts(Topology::Standalone, ServerDefault::Implicit),
                configured.as_ref(),
            );
            assert!(
                matches!(&v, Verdict::NoFailover(t) if t.contains("no failover")),
                "{v:?}"
            );
        }
    }

    #[test]
    fn numbers_are_weighed_against_the_set_majority() {
        let five = Topology::ReplicaSet {
            name: "rs0".into(),
            data_bearing: 5,
            arbiters: 0,
        };
        let two = assess(
            &facts(five.clone(), ServerDefault::Implicit),
            Some(&w(Acknowledgment::Nodes(2))),
        );
        assert!(two.warning().is_some(), "{two:?}");
        let three = assess(
            &facts(five, ServerDefault::Implicit),
            Some(&w(Acknowledgment::Nodes(3))),
        );
        assert_eq!(three.warning(), None);
    }

    #[test]
    fn w_1_warns_on_a_one_member_set_too() {
        let one = Topology::ReplicaSet {
            name: "solo".into(),
            data_bearing: 1,
            arbiters: 0,
        };
        let v = assess(
            &facts(one, ServerDefault::Implicit),
            Some(&w(Acknowledgment::Nodes(1))),
        );
        assert!(v.warning().is_some(), "{v:?}");
    }

    #[test]
    fn journal_off_warns_even_with_majority() {
        let wc = WriteConcern::builder()
            .w(Acknowledgment::Majority)
            .journal(false)
            .build();
        let v = assess(&facts(replica_set(), ServerDefault::Implicit), Some(&wc));
        assert!(v.warning().is_some_and(|t| t.contains("j: false")), "{v:?}");
    }

    #[test]
    fn implicit_default_is_w_1_before_5_0_and_with_arbiters() {
        let mut old = facts(replica_set(), ServerDefault::Implicit);
        old.max_wire_version = Some(9);
        assert!(assess(&old, None).warning().is_some());
        let psa = Topology::ReplicaSet {
            name: "psa".into(),
            data_bearing: 2,
            arbiters: 1,
        };
        let v = assess(&facts(psa, ServerDefault::Implicit), None);
        assert!(v.warning().is_some_and(|t| t.contains("arbiters")), "{v:?}");
    }

    #[test]
    fn unknown_topology_checks_nothing() {
        let v = assess(
            &facts(
                Topology::Unknown("hello failed".into()),
                ServerDefault::Implicit,
            ),
            Some(&w(Acknowledgment::Nodes(1))),
        );
        assert!(matches!(v, Verdict::Unknown(_)), "{v:?}");
    }
}
