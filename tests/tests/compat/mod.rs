//! Disbatch 4 beside us: its Perl DEN and CLI, its config file and its lease-less claims.

mod beside_perl_claims;
mod dead_nodes;
mod disbatch4_config;
mod mixed_fleet;
mod mixed_fleet_workflows;
mod perl_cli;
