//! The connection underneath every domain: conditional writes by `_id`, per-document decoding, lookups and the server's topology and clock.

pub(crate) mod by_id;
pub(crate) mod decode;
pub mod driver_options;
pub mod durability;
pub(crate) mod indexes;
pub(crate) mod lookup;
pub(crate) mod topology;
