//! Faults injected from outside: proxies that cut or corrupt the server's replies; the chaos run.

pub mod chaos;
pub mod corrupting_proxy;
pub mod cutting_proxy;
