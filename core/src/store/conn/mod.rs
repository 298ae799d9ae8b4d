//! The connection underneath every domain: conditional writes by `_id`, per-document decoding, lookups and the server's topology and clock.

pub(in crate::store) mod by_id;
pub(in crate::store) mod decode;
pub mod durability;
pub(crate) mod indexes;
pub(in crate::store) mod lookup;
pub(in crate::store) mod topology;
