//! Running a fleet: health, metrics, access, reloads, packaging, outages, chaos, database users.

mod bench_smoke;
mod chaos;
mod check_config;
mod clock_skew;
mod config_files;
mod credentials;
mod dci_access;
mod dci_https;
mod durability;
mod health;
mod json_logs;
mod metrics;
mod mongo_users;
mod mongo_users_old_role;
mod mongo_users_refused;
mod outage;
mod package;
mod reload;
mod stats;
