//! What list results say about caching (2026-07-28,
//! `server/utilities/caching`: `ttlMs`, how long a client may treat the
//! result as fresh, and `cacheScope`, `"public"` or `"private"`), for peers on
//! 2026-07-28 or later; older peers get the results as their version shapes
//! them. Lists come in one fixed order: the catalogue's for tools, the
//! source's for resources, templates and prompts.
//!
//! - `tools/list`, `resources/list`, `resources/templates/list`: `0`,
//!   `private`. They change when a human grants, revokes or answers an
//!   approval, and a stateless client is not told; they describe this
//!   instance (its profile, its grants), which another token's caller must
//!   not be served from a shared cache.
//! - `resources/read`: `0`, `private`: live terminal content.
//! - `prompts/list`: one hour, `public`: fixed text built into this binary.

use rmcp::model::{
    CacheScope, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, ProtocolVersion, ReadResourceResult,
};
use rmcp::service::RequestContext;
use rmcp::RoleServer;

/// How long `prompts/list` may be treated as fresh, in milliseconds.
pub(crate) const PROMPTS_TTL_MS: u64 = 3_600_000;

/// A result that carries the 2026-07-28 caching fields.
pub(super) trait Cacheable: Sized {
    fn hinted(self, ttl_ms: u64, scope: CacheScope) -> Self;

    /// With `ttl_ms` and `scope` for a peer on 2026-07-28 or later.
    fn cached(self, cx: &RequestContext<RoleServer>, ttl_ms: u64, scope: CacheScope) -> Self {
        let modern = cx
            .protocol_version()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        if modern {
            self.hinted(ttl_ms, scope)
        } else {
            self
        }
    }
}

macro_rules! cacheable {
    ($($t:ty),*) => {$(
        impl Cacheable for $t {
            fn hinted(mut self, ttl_ms: u64, scope: CacheScope) -> Self {
                self.ttl_ms = Some(ttl_ms);
                self.cache_scope = Some(scope);
                self
            }
        }
    )*};
}

cacheable!(
    ListToolsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListPromptsResult,
    ReadResourceResult
);
