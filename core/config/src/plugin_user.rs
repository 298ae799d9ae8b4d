//! `plugin_user` and `plugin_group`: the account plugins run as (the node running as root),
//! resolved against this host's user database when the config is read.

use std::ffi::CString;
use std::fmt;
use std::path::PathBuf;

use nix::unistd::{getgrouplist, Gid, Group, Uid, User};
use serde_json::Value;

/// The account plugins run as, resolved once so that starting a plugin looks nothing up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups as `initgroups` would set them (the primary group included).
    pub groups: Vec<u32>,
    /// Its home directory, the plugin's `HOME`.
    pub home: PathBuf,
}

/// A user or group as written: a name, or a numeric id (a JSON number or a string of digits).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Account {
    Name(String),
    Id(u32),
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Account::Name(n) => write!(f, "{n:?}"),
            Account::Id(id) => write!(f, "{id}"),
        }
    }
}

/// Reads `plugin_user` (and `plugin_group`) from the config and resolves them; None when
/// `plugin_user` is absent, as plugins then run as the node's own user.
pub(super) fn from_config(
    user: Option<&Value>,
    group: Option<&Value>,
) -> Result<Option<PluginUser>, String> {
    let group = group.filter(|g| !g.is_null());
    let user = match user.filter(|u| !u.is_null()) {
        Some(u) => account("plugin_user", u)?,
        None if group.is_some() => {
            return Err("key `plugin_group` needs `plugin_user`: it is that user's group".into())
        }
        None => return Ok(None),
    };
    let group = group.map(|g| account("plugin_group", g)).transpose()?;
    resolve(&user, group.as_ref()).map(Some)
}

/// Checks the form only; whether the account exists is `resolve`'s question.
fn account(key: &str, value: &Value) -> Result<Account, String> {
    // u32::MAX is (uid_t)-1, which setuid reads as "leave unchanged".
    let id = |n: Option<u64>| {
        n.and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n != u32::MAX)
            .map(Account::Id)
    };
    match value {
        Value::Number(n) => {
            id(n.as_u64()).ok_or_else(|| format!("key `{key}`: {n} is not a valid numeric id"))
        }
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            id(s.parse().ok()).ok_or_else(|| format!("key `{key}`: {s} is not a valid numeric id"))
        }
        Value::String(s) if is_account_name(s) => Ok(Account::Name(s.clone())),
        Value::String(s) => Err(format!(
            "key `{key}`: {s:?} is not an account name (printable, without ':' or spaces, at most 255 bytes)"
        )),
        _ => Err(format!("key `{key}` must be an account name or a numeric id")),
    }
}

fn is_account_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 255 && s.chars().all(|c| c.is_ascii_graphic() && c != ':')
}

fn resolve(user: &Account, group: Option<&Account>) -> Result<PluginUser, String> {
    let found = match user {
        Account::Name(n) => User::from_name(n),
        Account::Id(id) => User::from_uid(Uid::from_raw(*id)),
    }
    .map_err(|e| format!("key `plugin_user`: cannot look up user {user}: {e}"))?
    .ok_or_else(|| format!("key `plugin_user`: there is no user {user} on this host"))?;
    if found.uid.is_root() {
        return Err(format!(
            "key `plugin_user`: {user} is root, which isolates nothing; leave `plugin_user` out to run plugins as the node's user"
        ));
    }
    let gid = match group {
        None => found.gid,
        Some(g) => {
            match g {
                Account::Name(n) => Group::from_name(n),
                Account::Id(id) => Group::from_gid(Gid::from_raw(*id)),
            }
            .map_err(|e| format!("key `plugin_group`: cannot look up group {g}: {e}"))?
            .ok_or_else(|| format!("key `plugin_group`: there is no group {g} on this host"))?
            .gid
        }
    };
    if gid.as_raw() == 0 {
        let key = if group.is_some() {
            "plugin_group"
        } else {
            "plugin_user"
        };
        return Err(format!(
            "key `{key}`: plugins would run with group 0 (root), which can read root's group-readable files; name another group in `plugin_group`"
        ));
    }
    let name = CString::new(found.name.as_str())
        .map_err(|_| format!("key `plugin_user`: user {user} has a name with a NUL byte"))?;
    let groups = getgrouplist(&name, gid)
        .map_err(|e| format!("key `plugin_user`: cannot read the groups of user {user}: {e}"))?;
    Ok(PluginUser {
        name: found.name,
        uid: found.uid.as_raw(),
        gid: gid.as_raw(),
        groups: groups.into_iter().map(Gid::as_raw).collect(),
        home: found.dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An ordinary account every Linux host has.
    fn ordinary_user() -> User {
        ["nobody", "daemon", "bin"]
            .iter()
            .find_map(|n| User::from_name(n).ok().flatten())
            .expect("a host with none of nobody, daemon, bin")
    }

    #[test]
    fn names_and_numeric_ids_are_read_and_nonsense_is_refused() {
        assert_eq!(
            account("plugin_user", &json!("nobody")),
            Ok(Account::Name("nobody".into()))
        );
        assert_eq!(
            account("plugin_user", &json!(65534)),
            Ok(Account::Id(65534))
        );
        assert_eq!(
            account("plugin_user", &json!("65534")),
            Ok(Account::Id(65534))
        );
        for bad in [
            json!(-1),
            json!(4294967295u64),
            json!(4294967296u64),
            json!(1.5),
            json!(""),
            json!("a b"),
            json!("a:b"),
            json!("nul\u{0}"),
            json!(true),
            json!(["nobody"]),
            json!("9".repeat(30)),
        ] {
            let e = account("plugin_user", &bad).expect_err(&bad.to_string());
            assert!(e.contains("`plugin_user`"), "{bad}: {e}");
        }
    }

    #[test]
    fn absent_means_plugins_run_as_the_node_and_a_group_needs_a_user() {
        assert_eq!(from_config(None, None), Ok(None));
        assert_eq!(from_config(Some(&Value::Null), None), Ok(None));
        let e = from_config(None, Some(&json!("nogroup"))).unwrap_err();
        assert!(
            e.contains("`plugin_group`") && e.contains("`plugin_user`"),
            "{e}"
        );
    }

    #[test]
    fn an_existing_user_resolves_with_its_primary_group_and_home() {
        let expected = ordinary_user();
        for given in [json!(expected.name), json!(expected.uid.as_raw())] {
            let user = from_config(Some(&given), None)
                .expect("resolves")
                .expect("set");
            assert_eq!(user.name, expected.name);
            assert_eq!(user.uid, expected.uid.as_raw());
            assert_eq!(user.gid, expected.gid.as_raw());
            assert!(user.groups.contains(&user.gid), "{user:?}");
            assert_eq!(user.home, expected.dir);
        }
    }

    #[test]
    fn unknown_accounts_and_root_are_refused_naming_the_key() {
        let e = from_config(Some(&json!("no-such-user-disbatch")), None).unwrap_err();
        assert!(
            e.contains("`plugin_user`") && e.contains("no-such-user-disbatch"),
            "{e}"
        );
        for root in [json!("root"), json!(0)] {
            let e = from_config(Some(&root), None).unwrap_err();
            assert!(e.contains("`plugin_user`") && e.contains("root"), "{e}");
        }
        let user = json!(ordinary_user().name);
        let e = from_config(Some(&user), Some(&json!("no-such-group-disbatch"))).unwrap_err();
        assert!(e.contains("`plugin_group`"), "{e}");
        let e = from_config(Some(&user), Some(&json!(0))).unwrap_err();
        assert!(e.contains("`plugin_group`") && e.contains("root"), "{e}");
    }
}
