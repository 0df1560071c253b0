//! The routes the front door serves.
//!
//! # OCI Streaming message API (signed; JSON in and out)
//! | Method | Path | OCI operation | Answer |
//! |---|---|---|---|
//! | POST | `/20180418/streams/{streamId}/messages` | PutMessages | 200 `PutMessagesResult` |
//! | GET | `/20180418/streams/{streamId}/messages?cursor=…&limit=…` | GetMessages | 200 `[Message]`, header `opc-next-cursor` |
//! | POST | `/20180418/streams/{streamId}/cursors` | CreateCursor | 200 `Cursor` |
//! | POST | `/20180418/streams/{streamId}/groupCursors` | CreateGroupCursor | 200 `Cursor` |
//! | GET | `/20180418/streams/{streamId}/groups/{groupName}` | GetGroup | 200 `Group` |
//! | PUT | `/20180418/streams/{streamId}/groups/{groupName}` | UpdateGroup | 200, no body |
//! | POST | `/20180418/streams/{streamId}/commit?cursor=…` | ConsumerCommit | 200 `Cursor` |
//! | POST | `/20180418/streams/{streamId}/heartbeat?cursor=…` | ConsumerHeartbeat | 200 `Cursor` |
//!
//! # OCI Streaming stream administration (signed; JSON)
//! | Method | Path | OCI operation | Answer |
//! |---|---|---|---|
//! | POST | `/20180418/streams` | CreateStream | 200 `Stream` (`ACTIVE` at once; its id is the hub name) |
//! | GET | `/20180418/streams?compartmentId=…&name=…&limit=…&page=…&sortBy=…&sortOrder=…` | ListStreams | 200 `[StreamSummary]`, header `opc-next-page` while more remain |
//! | GET | `/20180418/streams/{streamId}` | GetStream | 200 `Stream` |
//! | DELETE | `/20180418/streams/{streamId}` | DeleteStream | 202, no body |
//!
//! # Admin API (signed; JSON)
//! | Method | Path | Does |
//! |---|---|---|
//! | GET, POST | `/admin/v1/hubs` | list hubs; create one: `{"name", "partitionCount", "retentionMs"?, "retentionForever"?, "retentionBytesMax"?}` → 201 |
//! | GET, DELETE | `/admin/v1/hubs/{hub}` | describe a hub with its partitions; delete it → 204 |
//! | GET, POST | `/admin/v1/hubs/{hub}/consumergroups` | list the hub's (Event Hubs) consumer groups; create one: `{"name"}` → 201 |
//! | DELETE | `/admin/v1/hubs/{hub}/consumergroups/{group}` | delete one → 204 |
//! | GET | `/admin/v1/hubs/{hub}/consumergroups/{group}/partitions` | its processors' owners, checkpoints and lag (hub-hosted store) |
//! | POST | `/admin/v1/hubs/{hub}/consumergroups/{group}/reset` | move its checkpoints: `{"type": "TRIM_HORIZON" \| "LATEST" \| "AT_TIME", "time"?}`; 409 while a processor of it runs |
//! | GET | `/admin/v1/hubs/{hub}/groups` | list the server-side (OCI) groups: committed offsets, instances |
//! | DELETE | `/admin/v1/hubs/{hub}/groups/{group}` | delete a server-side group → 204 |
//! | GET, POST | `/admin/v1/policies`, `/admin/v1/hubs/{hub}/policies` | list shared access policies (no keys); create one: `{"name", "rights"}` → 201 |
//! | GET, DELETE | `…/policies/{policy}` | a policy's name and rights; delete it → 204 |
//! | POST | `…/policies/{policy}/keys` | its primary and secondary keys |
//! | POST | `…/policies/{policy}/regenerate` | `{"keyType": "PrimaryKey" \| "SecondaryKey"}`: a new key, in force at once → its keys |
//!
//! # Web dashboard (a login with a Manage credential; see the `dashboard` module)
//! | Method | Path | Answer |
//! |---|---|---|
//! | GET | `/` | the dashboard; without a session 401 and the login form |
//! | POST | `/dashboard/login`, `/dashboard/logout` | form posts; 303 to `/` (login sets an `HttpOnly`, `SameSite=Strict` session cookie) |
//! | GET | `/dashboard/events` | server-sent events (`tick`, about every second) |
//! | GET | `/dashboard/app.js`, `/dashboard/app.css` | the page's script and style sheet |
//!
//! With a session cookie and its `X-Tributary-CSRF` header, the admin API and UpdateGroup
//! accept a request without a signature (the page's operator actions).
//!
//! # Unauthenticated
//! | Method | Path | Answer |
//! |---|---|---|
//! | GET | `/health` | 200 `{"status": "ok", "hubs": n}` |
//! | GET | `/metrics` | Prometheus text format |
//!
//! # Errors
//! Every error is `{"code": "...", "message": "..."}`: 400 `InvalidParameter`, `MissingParameter`,
//! `CannotParseRequest`, `LimitExceeded`; 401 `NotAuthenticated`; 404 `NotAuthorizedOrNotFound`
//! (unknown stream, group or hub) or `NotFound` (no such route); 405 `MethodNotAllowed`; 409
//! `Conflict` (a fenced group instance, an existing hub); 413 `RequestEntityTooLarge`; 429
//! `TooManyRequests`; 500 `InternalServerError`; 503 `ServiceUnavailable`.

/// The OCI API's base path.
pub const OCI_BASE_PATH: &str = "/20180418";

/// The admin API's base path.
pub const ADMIN_BASE_PATH: &str = "/admin/v1";
