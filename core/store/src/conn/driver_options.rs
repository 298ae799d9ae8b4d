//! The config's driver settings laid onto the driver's options, and `mongohost` as the driver
//! judges it: the half of `attributes` and `mongohost` that needs the driver (the config reads
//! and checks the values, `disbatch_config::DriverOptions`).

use disbatch_config::{Config, DriverOptions, ReadMode, ReadPreference as ReadSetting, WriteAck};
use mongodb::options::{
    Acknowledgment, AuthMechanism, ClientOptions, ConnectionString, Credential, ReadConcern,
    ReadPreference, ReadPreferenceOptions, SelectionCriteria,
};

/// Why the driver cannot use `mongohost`, in the words a config check gives (the key, the URI
/// with its password masked, the driver's reason redacted); None when it can. Parsed as the
/// driver parses it, without a DNS lookup.
pub fn mongohost_problem(config: &Config) -> Option<String> {
    ConnectionString::parse(&config.mongohost)
        .err()
        .map(|e| disbatch_config::mongohost_unusable(&config.mongohost, &e.kind.to_string()))
}

/// Lays `o` onto what `mongohost` gave: an option the URI sets wins, as with the Perl driver.
pub fn apply(o: &DriverOptions, options: &mut ClientOptions) -> Result<(), String> {
    fn fill<T: Clone>(slot: &mut Option<T>, from: &Option<T>) {
        if slot.is_none() {
            slot.clone_from(from);
        }
    }
    fill(&mut options.app_name, &o.app_name);
    fill(&mut options.connect_timeout, &o.connect_timeout);
    fill(
        &mut options.server_selection_timeout,
        &o.server_selection_timeout,
    );
    fill(&mut options.heartbeat_freq, &o.heartbeat_freq);
    fill(&mut options.local_threshold, &o.local_threshold);
    fill(
        &mut options.read_concern,
        &o.read_concern.clone().map(ReadConcern::custom),
    );
    fill(&mut options.repl_set_name, &o.repl_set_name);
    fill(&mut options.retry_reads, &o.retry_reads);
    fill(&mut options.retry_writes, &o.retry_writes);
    if options.selection_criteria.is_none() {
        options.selection_criteria = o
            .read_preference
            .as_ref()
            .map(read_preference)
            .map(SelectionCriteria::ReadPreference);
    }
    if o.has_write_concern() {
        let mut wc = options.write_concern.take().unwrap_or_default();
        fill(&mut wc.w, &o.w.as_ref().map(acknowledgment));
        fill(&mut wc.journal, &o.journal);
        fill(&mut wc.w_timeout, &o.w_timeout);
        options.write_concern = Some(wc);
    }
    if options.credential.is_none() && (o.username.is_some() || o.auth_mechanism.is_some()) {
        options.credential = Some(
            Credential::builder()
                .username(o.username.clone())
                .password(o.password().map(str::to_string))
                .source(o.auth_source.clone())
                .mechanism(auth_mechanism(o)?)
                .mechanism_properties(o.auth_mechanism_properties.clone())
                .build(),
        );
    }
    Ok(())
}

/// The mechanism `attributes.auth_mechanism` names, as the driver has it.
pub fn auth_mechanism(o: &DriverOptions) -> Result<Option<AuthMechanism>, String> {
    o.auth_mechanism
        .as_deref()
        .map(|name| {
            name.parse::<AuthMechanism>().map_err(|e| {
                format!(
                    "key `attributes.auth_mechanism`: {name:?} is not a mechanism the driver has ({})",
                    e.kind
                )
            })
        })
        .transpose()
}

fn acknowledgment(w: &WriteAck) -> Acknowledgment {
    match w {
        WriteAck::Nodes(n) => Acknowledgment::Nodes(*n),
        WriteAck::Named(name) => Acknowledgment::from(name.as_str()),
    }
}

fn read_preference(p: &ReadSetting) -> ReadPreference {
    let options = p.options.as_ref().map(|o| {
        ReadPreferenceOptions::builder()
            .tag_sets(o.tag_sets.clone())
            .max_staleness(o.max_staleness)
            .build()
    });
    match p.mode {
        ReadMode::Primary => ReadPreference::Primary,
        ReadMode::PrimaryPreferred => ReadPreference::PrimaryPreferred { options },
        ReadMode::Secondary => ReadPreference::Secondary { options },
        ReadMode::SecondaryPreferred => ReadPreference::SecondaryPreferred { options },
        ReadMode::Nearest => ReadPreference::Nearest { options },
    }
}

#[cfg(test)]
#[path = "driver_options_tests.rs"]
mod tests;
