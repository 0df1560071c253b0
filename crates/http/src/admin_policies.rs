//! The admin API's shared access policies: the namespace's under `/admin/v1/policies`, an event
//! hub's under `/admin/v1/hubs/{hub}/policies`, managed as Event Hubs' authorization rules are.
//!
//! | Method | Path (below a scope) | Does |
//! |---|---|---|
//! | GET, POST | `…/policies` | list (names and rights, never keys); create one: `{"name", "rights": ["Listen" \| "Send" \| "Manage", …]}` → 201, with fresh primary and secondary keys |
//! | GET, DELETE | `…/policies/{policy}` | name and rights; delete it → 204 |
//! | POST | `…/policies/{policy}/keys` | its keys: `{"keyName", "primaryKey", "secondaryKey"}` (Azure's `listKeys`; a POST, so no cache or access log keeps them) |
//! | POST | `…/policies/{policy}/regenerate` | `{"keyType": "PrimaryKey" \| "SecondaryKey"}`: a new key in its place → its keys |
//!
//! A change is saved and in force on every door before the answer: from then on a token or
//! login with a regenerated or deleted policy's old key is refused. The routes authenticate
//! as the rest of the admin API (a SAS token with the Manage right over the namespace, a
//! request signature, or a dashboard session). A hub's policies go when the hub is deleted.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tributary_amqp::AmqpError;
use tributary_amqp::policies::{AccessPolicies, AccessPolicy, KeyType, Right, Scope};

use crate::error::ApiError;
use crate::oci::parse_json;
use crate::server::{AppState, Json};

pub(crate) fn routes() -> Router<AppState> {
    let scoped = |base: &str| {
        Router::new()
            .route(base, get(list).post(create))
            .route(&format!("{base}/{{policy}}"), get(show).delete(remove))
            .route(&format!("{base}/{{policy}}/keys"), post(keys))
            .route(&format!("{base}/{{policy}}/regenerate"), post(regenerate))
    };
    scoped("/admin/v1/policies").merge(scoped("/admin/v1/hubs/{stream}/policies"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreatePolicy {
    name: String,
    rights: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Regenerate {
    key_type: String,
}

/// The `{stream}` and `{policy}` path parameters, percent-decoded.
struct PolicyPath {
    hub: Option<String>,
    policy: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for PolicyPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let params = crate::oci::path_params(parts, state).await?;
        Ok(PolicyPath {
            hub: params.get("stream").cloned(),
            policy: params.get("policy").cloned(),
        })
    }
}

impl PolicyPath {
    /// The policies and the scope the path names (an event hub as the hub spells it).
    fn scope<'a>(&self, state: &'a AppState) -> Result<(&'a AccessPolicies, Scope), ApiError> {
        let policies = state
            .policies
            .as_ref()
            .ok_or_else(|| ApiError::not_found("this server manages no shared access policies"))?;
        let scope = match &self.hub {
            None => Scope::Namespace,
            Some(hub) => Scope::Hub(state.broker.describe_hub(hub)?.name),
        };
        Ok((policies, scope))
    }

    fn policy(&self) -> Result<&str, ApiError> {
        self.policy
            .as_deref()
            .ok_or_else(|| ApiError::invalid("no policy in the path"))
    }
}

fn policy_error(e: AmqpError) -> ApiError {
    let message = e.to_string();
    match e {
        AmqpError::PolicyNotFound { .. } => ApiError::not_found(message),
        AmqpError::PolicyExists { .. } => ApiError::new(StatusCode::CONFLICT, "Conflict", message),
        AmqpError::InvalidPolicy(_) => ApiError::invalid(message),
        _ => ApiError::internal(message),
    }
}

/// A policy without its keys.
fn policy_json(policy: &AccessPolicy, scope: &Scope) -> Value {
    json!({
        "name": policy.name,
        "rights": policy.rights.iter().map(Right::to_string).collect::<Vec<_>>(),
        "hub": scope.hub(),
    })
}

/// A policy's keys, as Azure's `listKeys` answers.
fn keys_json(policy: &AccessPolicy) -> Value {
    json!({
        "keyName": policy.name,
        "primaryKey": policy.key,
        "secondaryKey": policy.secondary_key,
    })
}

async fn list(State(state): State<AppState>, path: PolicyPath) -> Result<Response, ApiError> {
    let (policies, scope) = path.scope(&state)?;
    let listed: Vec<Value> = policies
        .list(&scope)
        .iter()
        .map(|p| policy_json(p, &scope))
        .collect();
    Ok(Json(json!({ "policies": listed })).into_response())
}

async fn create(
    State(state): State<AppState>,
    path: PolicyPath,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (policies, scope) = path.scope(&state)?;
    let request: CreatePolicy = parse_json(&body)?;
    let rights = request
        .rights
        .iter()
        .map(|r| r.parse::<Right>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(policy_error)?;
    let policy = policies
        .create(&scope, &request.name, rights)
        .map_err(policy_error)?;
    if let Some(hub) = scope.hub()
        && let Err(gone) = state.broker.describe_hub(hub)
    {
        // Deleted meanwhile, after its policies went with it: this one must not outlive it.
        let _ = policies.delete(&scope, &policy.name);
        return Err(gone.into());
    }
    tracing::info!(policy = %policy.name, scope = %scope, "shared access policy created");
    Ok((StatusCode::CREATED, Json(policy_json(&policy, &scope))).into_response())
}

async fn show(State(state): State<AppState>, path: PolicyPath) -> Result<Response, ApiError> {
    let (policies, scope) = path.scope(&state)?;
    let policy = policies
        .find(&scope, path.policy()?)
        .map_err(policy_error)?;
    Ok(Json(policy_json(&policy, &scope)).into_response())
}

async fn remove(State(state): State<AppState>, path: PolicyPath) -> Result<Response, ApiError> {
    let (policies, scope) = path.scope(&state)?;
    let name = path.policy()?;
    policies.delete(&scope, name).map_err(policy_error)?;
    tracing::info!(policy = %name, scope = %scope, "shared access policy deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn keys(State(state): State<AppState>, path: PolicyPath) -> Result<Response, ApiError> {
    let (policies, scope) = path.scope(&state)?;
    let policy = policies
        .find(&scope, path.policy()?)
        .map_err(policy_error)?;
    Ok(Json(keys_json(&policy)).into_response())
}

async fn regenerate(
    State(state): State<AppState>,
    path: PolicyPath,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (policies, scope) = path.scope(&state)?;
    let request: Regenerate = parse_json(&body)?;
    let which: KeyType = request.key_type.parse().map_err(policy_error)?;
    let policy = policies
        .rotate(&scope, path.policy()?, which)
        .map_err(policy_error)?;
    tracing::info!(policy = %policy.name, scope = %scope, key = %which, "shared access key regenerated");
    Ok(Json(keys_json(&policy)).into_response())
}
