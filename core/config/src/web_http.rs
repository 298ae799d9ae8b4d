//! The DCI's connection limits and the hosts and origins it answers (`web.max_connections`,
//! `web.header_timeout_ms`, `web.idle_timeout_ms`, `web.allowed_hosts`, `web.allowed_origins`).

use std::time::Duration;

pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The keys as written, before validation.
#[derive(Debug, Default)]
pub(super) struct RawHttp {
    pub max_connections: Option<u64>,
    pub header_timeout_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub allowed_hosts: Option<Vec<String>>,
    pub allowed_origins: Option<Vec<String>>,
}

/// The validated values, for `WebSettings`.
pub(super) struct Http {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub allowed_hosts: Vec<String>,
    pub allowed_origins: Vec<WebOrigin>,
}

pub(super) fn validate(raw: RawHttp) -> Result<Http, String> {
    // Bounds keep a typo from disabling a protection: 0 would refuse every connection or cut
    // every request, and hours-long timeouts would let idle connections pile up again.
    let max_connections = within(
        "web.max_connections",
        raw.max_connections,
        DEFAULT_MAX_CONNECTIONS as u64,
        (1, 65_536),
        "",
    )? as usize;
    let header_timeout = within(
        "web.header_timeout_ms",
        raw.header_timeout_ms,
        DEFAULT_HEADER_TIMEOUT.as_millis() as u64,
        (100, 600_000),
        " ms",
    )?;
    let idle_timeout = within(
        "web.idle_timeout_ms",
        raw.idle_timeout_ms,
        DEFAULT_IDLE_TIMEOUT.as_millis() as u64,
        (100, 3_600_000),
        " ms",
    )?;
    let allowed_hosts = raw
        .allowed_hosts
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, h)| allowed_host(h).map_err(|e| format!("key `web.allowed_hosts[{i}]`: {e}")))
        .collect::<Result<_, _>>()?;
    let allowed_origins = raw
        .allowed_origins
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, o)| {
            WebOrigin::parse(o.trim()).map_err(|e| {
                format!("key `web.allowed_origins[{i}]`: {o:?} {e}; write it as a browser sends it, e.g. \"https://dash.example.com\"")
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Http {
        max_connections,
        header_timeout: Duration::from_millis(header_timeout),
        idle_timeout: Duration::from_millis(idle_timeout),
        allowed_hosts,
        allowed_origins,
    })
}

fn within(
    key: &str,
    value: Option<u64>,
    default: u64,
    (min, max): (u64, u64),
    unit: &str,
) -> Result<u64, String> {
    match value {
        None => Ok(default),
        Some(v) if (min..=max).contains(&v) => Ok(v),
        Some(v) => Err(format!(
            "key `{key}`: {v} is out of range; use {min} to {max}{unit} (default {default}{unit})"
        )),
    }
}

/// An `allowed_hosts` entry: a host name (`*.` before it: any one label more), an IP, or `*`.
fn allowed_host(entry: &str) -> Result<String, String> {
    let host = normal_host(entry.trim());
    if host == "*" {
        return Ok(host);
    }
    if host.contains("://") || host.contains('/') {
        return Err(format!(
            "{entry:?} is not a host name: give the name alone (origins go in web.allowed_origins)"
        ));
    }
    if split_host_port(&host).is_some_and(|(_, port)| port.is_some()) {
        return Err(format!(
            "{entry:?} has a port: give the name alone, any port is allowed"
        ));
    }
    let name = host.strip_prefix("*.").unwrap_or(&host);
    if is_host_name(name) || is_ip_literal(name) {
        Ok(host)
    } else {
        Err(format!(
            "{entry:?} is not a host name (letters, digits, '-', '_' and '.'), an IP address or \"*\""
        ))
    }
}

/// Host names compare case-insensitively, and `name.` is the same host as `name`.
pub fn normal_host(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|label| !label.is_empty() && label.len() <= 63)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// An IPv4 address, or an IPv6 one in brackets (as it appears in `Host` and URLs) or bare.
pub fn is_ip_literal(host: &str) -> bool {
    let inner = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    inner.parse::<std::net::IpAddr>().is_ok()
}

/// `host[:port]` → (host, port); IPv6 hosts keep their brackets. None: not an authority.
pub fn split_host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    if authority.is_empty() {
        return None;
    }
    if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, rest) = authority.split_at(end + 1);
        return match rest {
            "" => Some((host, None)),
            _ => Some((host, Some(port(rest.strip_prefix(':')?)?))),
        };
    }
    match authority.rsplit_once(':') {
        // More than one ':' without brackets: a bare IPv6 address, no port.
        Some((host, _)) if host.contains(':') => Some((authority, None)),
        Some((host, p)) if !host.is_empty() => Some((host, Some(port(p)?))),
        Some(_) => None,
        None => Some((authority, None)),
    }
}

fn port(text: &str) -> Option<u16> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A web origin as browsers send it in `Origin`: scheme, host and port, nothing else.
/// Equal origins compare equal whether or not the default port was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebOrigin {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl WebOrigin {
    /// Parses `http://host[:port]` or `https://…`; the error says what is wrong (the caller
    /// names the key or header).
    pub fn parse(text: &str) -> Result<WebOrigin, String> {
        let (scheme, rest) = text
            .split_once("://")
            .ok_or("is not an origin: it has no scheme://")?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err(format!("has scheme {scheme:?}: use http or https")),
        };
        // A trailing slash is what a copied URL carries; anything after it is a path.
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#', '@']) {
            return Err("is not an origin: an origin has no path, query or user".into());
        }
        let (host, port) = split_host_port(authority).ok_or("has no valid host[:port]")?;
        let host = normal_host(host);
        if !(is_host_name(&host) || is_ip_literal(&host)) {
            return Err(format!("has an invalid host {host:?}"));
        }
        if port == Some(0) {
            return Err("has port 0".into());
        }
        Ok(WebOrigin {
            scheme,
            host,
            port: port.unwrap_or(default_port),
        })
    }

    fn default_port(&self) -> u16 {
        if self.scheme == "https" {
            443
        } else {
            80
        }
    }
}

impl std::fmt::Display for WebOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", self.scheme, self.host)?;
        if self.port != self.default_port() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(
            split_host_port("a.example:8080"),
            Some(("a.example", Some(8080)))
        );
        assert_eq!(split_host_port("a.example"), Some(("a.example", None)));
        assert_eq!(split_host_port("[::1]:80"), Some(("[::1]", Some(80))));
        assert_eq!(split_host_port("[::1]"), Some(("[::1]", None)));
        assert_eq!(split_host_port("::1"), Some(("::1", None)));
        for bad in ["", ":80", "h:", "h:x", "h:99999", "[::1", "[::1]x", "h:+1"] {
            assert_eq!(split_host_port(bad), None, "{bad}");
        }
    }

    #[test]
    fn origins_parse_with_default_ports_and_print_as_browsers_send_them() {
        let o = WebOrigin::parse("HTTPS://Dash.Example.com/").expect("origin");
        assert_eq!(
            (o.scheme.as_str(), o.host.as_str(), o.port),
            ("https", "dash.example.com", 443)
        );
        assert_eq!(o.to_string(), "https://dash.example.com");
        assert_eq!(
            o,
            WebOrigin::parse("https://dash.example.com:443").expect("origin")
        );
        let o = WebOrigin::parse("http://[::1]:8080").expect("origin");
        assert_eq!((o.host.as_str(), o.port), ("[::1]", 8080));
        assert_eq!(o.to_string(), "http://[::1]:8080");
        for bad in [
            "null",
            "dash.example.com",
            "ftp://x",
            "https://x/path",
            "https://u@x",
            "https://x:0",
            "https://x:99999",
            "https://",
            "https://bad host",
        ] {
            assert!(WebOrigin::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn allowed_hosts_are_names_ips_or_star() {
        assert_eq!(
            allowed_host(" DCI.Example.com. ").as_deref(),
            Ok("dci.example.com")
        );
        assert_eq!(allowed_host("*").as_deref(), Ok("*"));
        assert_eq!(
            allowed_host("*.example.com").as_deref(),
            Ok("*.example.com")
        );
        assert_eq!(allowed_host("10.0.0.1").as_deref(), Ok("10.0.0.1"));
        assert_eq!(allowed_host("[::1]").as_deref(), Ok("[::1]"));
        for (bad, says) in [
            ("https://dci.example.com", "not a host name"),
            ("dci.example.com:8080", "has a port"),
            ("", "not a host name"),
            ("a b", "not a host name"),
            ("a..b", "not a host name"),
        ] {
            let e = allowed_host(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
