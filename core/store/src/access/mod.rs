//! MongoDB users and roles for each component.

pub(crate) mod users;
