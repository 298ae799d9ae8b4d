//! MongoDB users and roles for each component.

pub(in crate::store) mod users;
