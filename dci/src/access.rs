//! Access control: bearer tokens from `web.tokens`, checked against each route's role.

use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use disbatch_config::{Role, WebToken};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{ApiError, ApiResult};

/// The configured tokens, kept only as digests: equal-length values to compare in constant time.
/// A config reload replaces them whole; a request checks against one set or the other.
pub struct Access {
    tokens: RwLock<Arc<Tokens>>,
}

struct Tokens {
    known: Vec<Known>,
    /// No tokens were configured. Tokens all revoked leave the API closed, not open.
    open: bool,
}

impl Tokens {
    fn configured(tokens: &[WebToken]) -> Tokens {
        Tokens {
            known: known(tokens),
            open: tokens.is_empty(),
        }
    }
}

struct Known {
    name: Arc<str>,
    role: Role,
    digest: [u8; 32],
}

/// Who is calling, put into each request's extensions for handlers that check more finely.
#[derive(Debug, Clone)]
pub enum Caller {
    /// No tokens are configured: the API is open, as Disbatch 4's was.
    Open,
    Token {
        name: Arc<str>,
        role: Role,
    },
}

impl Caller {
    /// A handler's own check, for a request whose body asks for more than its route needs.
    pub fn require(&self, role: Role, what: &str) -> ApiResult<()> {
        match self {
            Caller::Open => Ok(()),
            Caller::Token { role: has, .. } if *has >= role => Ok(()),
            Caller::Token { name, role: has } => Err(forbidden(what, role, name, *has)),
        }
    }
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

impl Access {
    pub fn new(tokens: &[WebToken]) -> Self {
        Access {
            tokens: RwLock::new(Arc::new(Tokens::configured(tokens))),
        }
    }

    /// Takes the tokens of a reloaded config; requests from now on are checked against them.
    pub fn replace(&self, tokens: &[WebToken]) {
        let new = Arc::new(Tokens::configured(tokens));
        // A poisoned lock still holds a whole Vec: a panic cannot leave it half written.
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = new;
    }

    /// Stops accepting the tokens named; the others stay. With none left the API is closed
    /// to all, never open.
    pub fn revoke(&self, names: &[&str]) {
        let mut tokens = self.tokens.write().unwrap_or_else(|p| p.into_inner());
        let known = tokens
            .known
            .iter()
            .filter(|k| !names.contains(&&*k.name))
            .map(|k| Known {
                name: k.name.clone(),
                role: k.role,
                digest: k.digest,
            })
            .collect();
        *tokens = Arc::new(Tokens {
            known,
            open: tokens.open,
        });
    }

    fn current(&self) -> Arc<Tokens> {
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The caller a request's `Authorization` header names, or why there is none.
    fn identify(&self, headers: &HeaderMap) -> Result<Caller, Refusal> {
        let tokens = self.current();
        if tokens.open {
            return Ok(Caller::Open);
        }
        let Some(header) = headers.get(AUTHORIZATION) else {
            return Err(Refusal::Missing);
        };
        let presented = header
            .to_str()
            .ok()
            .and_then(|h| h.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let Some(presented) = presented else {
            return Err(Refusal::NotBearer);
        };
        let presented = digest(presented);
        // Every entry is compared, so the time taken does not tell which one (if any) matched.
        let mut found = None;
        for known in tokens.known.iter() {
            if bool::from(known.digest.ct_eq(&presented)) {
                found = Some(known);
            }
        }
        match found {
            Some(k) => Ok(Caller::Token {
                name: k.name.clone(),
                role: k.role,
            }),
            None => Err(Refusal::Invalid),
        }
    }
}

fn known(tokens: &[WebToken]) -> Vec<Known> {
    tokens
        .iter()
        .map(|t| Known {
            name: Arc::from(t.name.as_str()),
            role: t.role,
            digest: digest(t.secret()),
        })
        .collect()
}

/// Why a request has no caller: each is a 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Missing,
    NotBearer,
    Invalid,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let message = match self {
            Refusal::Missing => "authentication required: send Authorization: Bearer <token>",
            Refusal::NotBearer => {
                "authentication required: the Authorization header must be Bearer <token>"
            }
            Refusal::Invalid => "invalid token",
        };
        // RFC 6750: a presented but unusable token is `invalid_token`; a missing one gets no code.
        let challenge = if self == Refusal::Missing {
            "Bearer realm=\"disbatch\""
        } else {
            "Bearer realm=\"disbatch\", error=\"invalid_token\""
        };
        (
            [(WWW_AUTHENTICATE, HeaderValue::from_static(challenge))],
            ApiError::with(StatusCode::UNAUTHORIZED, message),
        )
            .into_response()
    }
}

/// What the middleware of one route knows: the tokens and the role the route needs.
#[derive(Clone)]
pub struct Gate {
    pub access: Arc<Access>,
    pub role: Role,
}

/// Route middleware: 401 without a valid token, 403 when its role is too low; otherwise the
/// request goes on with its [`Caller`]. Only the token's name is ever logged: the caller is
/// also put on the answer, for the access log.
pub async fn gate(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    let caller = match gate.access.identify(req.headers()) {
        Ok(caller) => caller,
        Err(refusal) => {
            tracing::debug!(method = %req.method(), path = %req.uri().path(), ?refusal, "refused: no valid token");
            return refusal.into_response();
        }
    };
    if let Caller::Token { name, role } = &caller {
        let what = format!("{} {}", req.method(), req.uri().path());
        if *role < gate.role {
            tracing::debug!(token = %name, role = %role, request = %what, "refused: role too low");
            let mut refused = forbidden(&what, gate.role, name, *role).into_response();
            refused.extensions_mut().insert(caller);
            return refused;
        }
        tracing::debug!(token = %name, method = %req.method(), path = %req.uri().path(), "authorized");
    }
    req.extensions_mut().insert(caller.clone());
    let mut response = next.run(req).await;
    response.extensions_mut().insert(caller);
    response
}

fn forbidden(what: &str, needs: Role, name: &str, has: Role) -> ApiError {
    ApiError::with(
        StatusCode::FORBIDDEN,
        format!("forbidden: {what} needs role {needs}; token {name:?} has role {has}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access() -> Access {
        Access::new(&[
            WebToken::new("viewer", Role::Read, "read-token-0123456789"),
            WebToken::new("ops", Role::Operate, "operate-token-0123456789"),
        ])
    }

    fn auth(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(value).expect("header"));
        h
    }

    fn name_of(c: &Caller) -> Option<&str> {
        match c {
            Caller::Open => None,
            Caller::Token { name, .. } => Some(name),
        }
    }

    #[test]
    fn tokens_identify_their_caller_and_anything_else_is_401() {
        let a = access();
        let ops = a.identify(&auth("Bearer operate-token-0123456789")).ok();
        assert_eq!(ops.as_ref().and_then(name_of), Some("ops"));
        let viewer = a.identify(&auth("bearer  read-token-0123456789 ")).ok();
        assert_eq!(viewer.as_ref().and_then(name_of), Some("viewer"));
        for (bad, why) in [
            ("Bearer operate-token-012345678", Refusal::Invalid),
            ("Bearer operate-token-01234567890", Refusal::Invalid),
            ("Bearer ", Refusal::Invalid),
            ("Basic b3BzOnNlY3JldA==", Refusal::NotBearer),
            ("operate-token-0123456789", Refusal::NotBearer),
        ] {
            assert_eq!(a.identify(&auth(bad)).err(), Some(why), "{bad}");
        }
        let missing = a.identify(&HeaderMap::new()).expect_err("refused");
        assert_eq!(missing, Refusal::Missing);
        let r = missing.into_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            r.headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok()),
            Some("Bearer realm=\"disbatch\"")
        );
    }

    #[test]
    fn no_tokens_means_open_and_roles_include_lower_ones() {
        let open = Access::new(&[]);
        assert!(matches!(open.identify(&HeaderMap::new()), Ok(Caller::Open)));
        assert!(Caller::Open.require(Role::Admin, "x").is_ok());
        let ops = Caller::Token {
            name: Arc::from("ops"),
            role: Role::Operate,
        };
        assert!(ops.require(Role::Read, "x").is_ok());
        assert!(ops.require(Role::Operate, "x").is_ok());
        let e = ops.require(Role::Admin, "renaming").expect_err("refused");
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        assert_eq!(
            e.body["error"],
            "forbidden: renaming needs role admin; token \"ops\" has role operate"
        );
    }
}
