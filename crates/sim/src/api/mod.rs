//! The HTTP API server: routes Kubernetes API paths to the object semantics in [`crate::ops`],
//! negotiates JSON, `Table` and `PartialObjectMetadata` output, streams watches and pod logs,
//! upgrades port-forward requests, and counts every request.

mod discovery;
mod openapi;
pub(crate) mod path;
pub(crate) mod table;
pub(crate) mod watch;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use crate::admission::FieldValidation;
use crate::api_error::{ApiError, ApiResult};
use crate::auth::{Credentials, Identity};
use crate::meta;
use crate::metrics::Metrics;
use crate::ops::{ApiObjects, DeleteOptions, PatchType, Propagation, Subresource, WriteOptions};
use crate::rbac;
use crate::resources::{Builtin, ResourceInfo, StorageKey};
use crate::selector::{FieldSelector, LabelSelector, Selectors};
use path::{ResourcePath, Route};
use table::IncludeObject;
use watch::Format;

/// Largest request body accepted: the API server's limit for writes (3 MiB, twice etcd's 1.5
/// MiB, for JSON that is stored more compactly).
pub(crate) const MAX_BODY: usize = 3 * 1024 * 1024;

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct ApiState {
    pub(crate) objects: Arc<ApiObjects>,
    pub(crate) metrics: Arc<Metrics>,
    /// The node's kubelet, which serves pod logs and port-forward.
    pub(crate) kubelet: Arc<agent_sandbox_kubelet::Kubelet>,
    /// `host:port` the server answers on.
    pub(crate) server: String,
    pub(crate) bookmark_interval: Duration,
    /// Connection tasks (port-forward relays), aborted when the sim stops.
    pub(crate) tasks: std::sync::Mutex<tokio::task::JoinSet<()>>,
    /// Bumped to end every open watch (what an API server restart does).
    pub(crate) watch_epoch: tokio::sync::watch::Sender<u64>,
    /// The credentials requests are authenticated with, and the key of the tokens it issues.
    pub(crate) credentials: Arc<Credentials>,
    /// The node's name (its kubelet's requests are not counted).
    pub(crate) node: String,
}

impl ApiState {
    /// Runs a connection task owned by the server.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }

    /// Aborts every connection task.
    pub(crate) fn abort_tasks(&self) {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .abort_all();
    }
}

/// The router.
pub(crate) fn router(state: Arc<ApiState>) -> Router {
    Router::new().fallback(handle).with_state(state)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(code, &self.to_status(), &[])
    }
}

fn json_response(code: StatusCode, body: &Value, warnings: &[String]) -> Response {
    let mut response = (code, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for warning in warnings {
        let text = format!("299 - \"{}\"", warning.replace('"', "\\\""));
        if let Ok(value) = HeaderValue::from_str(&text) {
            headers.append(header::WARNING, value);
        }
    }
    response
}

type Query = HashMap<String, String>;

fn parse_query(query: Option<&str>) -> Query {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

fn flag(query: &Query, name: &str) -> Option<bool> {
    query.get(name).map(|v| v == "true" || v == "1")
}

/// The verb a resource request is authorized as (RBAC's: `get`, `list`, `watch`, `create`,
/// ...). Port-forward needs `create` whatever the method (a WebSocket upgrade is a GET).
fn resource_verb(method: &Method, target: &ResourcePath, query: &Query) -> String {
    if target.subresource.as_deref() == Some("portforward") {
        return "create".to_owned();
    }
    match *method {
        Method::GET | Method::HEAD => match &target.name {
            Some(_) => "get",
            None if target.watch || flag(query, "watch") == Some(true) => "watch",
            None => "list",
        }
        .to_owned(),
        Method::POST => "create".to_owned(),
        Method::PUT => "update".to_owned(),
        Method::PATCH => "patch".to_owned(),
        Method::DELETE if target.name.is_some() => "delete".to_owned(),
        Method::DELETE => "deletecollection".to_owned(),
        ref other => other.as_str().to_ascii_lowercase(),
    }
}

/// The RBAC objects that decide a request in `namespace`.
fn policy(objects: &ApiObjects, namespace: &str) -> rbac::Policy {
    let list = |plural: &str, namespace: Option<&str>| {
        objects
            .store
            .list(&StorageKey::new(rbac::GROUP, plural), namespace)
            .0
    };
    rbac::Policy {
        cluster_roles: list("clusterroles", None),
        cluster_bindings: list("clusterrolebindings", None),
        roles: if namespace.is_empty() {
            Vec::new()
        } else {
            list("roles", Some(namespace))
        },
        bindings: if namespace.is_empty() {
            Vec::new()
        } else {
            list("rolebindings", Some(namespace))
        },
    }
}

/// Authenticates and authorizes a request: 401 without a credential the server accepts (but
/// for the version and health checks, which a real API server leaves open to anonymous
/// users), 403 when the user may not do what it asks.
fn admit(
    state: &ApiState,
    headers: &HeaderMap,
    method: &Method,
    route: &Route,
    path: &str,
    query: &Query,
) -> ApiResult<Option<Identity>> {
    let identity = state
        .credentials
        .authenticate(headers, &state.objects.store)?;
    let Some(identity) = identity else {
        return if matches!(route, Route::Version | Route::Health) {
            Ok(None)
        } else {
            Err(ApiError::unauthorized())
        };
    };
    if rbac::unrestricted(&identity) {
        return Ok(Some(identity));
    }
    match route {
        Route::Resource(target) => {
            let verb = resource_verb(method, target, query);
            let resource = match &target.subresource {
                Some(sub) => format!("{}/{sub}", target.plural),
                None => target.plural.clone(),
            };
            // A namespace's own requests are in that namespace, as RBAC sees them.
            let namespace = match (&target.namespace, target.plural.as_str(), &target.name) {
                (Some(namespace), _, _) => namespace.as_str(),
                (None, "namespaces", Some(name)) => name.as_str(),
                _ => "",
            };
            let name = target.name.as_deref().unwrap_or_default();
            let request = rbac::Request::Resource {
                verb: &verb,
                group: &target.group,
                resource: &resource,
                namespace,
                name,
            };
            if !rbac::allows(&identity, &request, &policy(&state.objects, namespace)) {
                return Err(ApiError::not_allowed(
                    &identity.user,
                    &verb,
                    &target.group,
                    &resource,
                    namespace,
                    name,
                ));
            }
        }
        _ => {
            let verb = method.as_str().to_ascii_lowercase();
            let request = rbac::Request::Path { verb: &verb, path };
            if !rbac::allows(&identity, &request, &policy(&state.objects, "")) {
                return Err(ApiError::path_not_allowed(&identity.user, &verb, path));
            }
        }
    }
    Ok(Some(identity))
}

async fn handle(State(state): State<Arc<ApiState>>, mut request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let query = parse_query(request.uri().query());
    let route = path::parse(&path);
    let identity = match admit(
        &state,
        request.headers(),
        request.method(),
        &route,
        &path,
        &query,
    ) {
        Ok(identity) => identity,
        Err(error) => return error.into_response(),
    };
    let from_node = identity
        .as_ref()
        .is_some_and(|identity| *identity == Identity::node(&state.node));
    let result = match route {
        Route::Version => Ok(json_response(StatusCode::OK, &discovery::version(), &[])),
        Route::Health => Ok((StatusCode::OK, "ok").into_response()),
        Route::Metrics => Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            state.metrics.render(),
        )
            .into_response()),
        Route::CoreVersions => Ok(json_response(
            StatusCode::OK,
            &discovery::core_versions(&state.server),
            &[],
        )),
        Route::Groups => Ok(json_response(
            StatusCode::OK,
            &discovery::groups(&state.objects.store.registry()),
            &[],
        )),
        Route::Group(group) => discovery::group(&state.objects.store.registry(), &group)
            .map(|doc| json_response(StatusCode::OK, &doc, &[]))
            .ok_or_else(|| ApiError::no_route(&path)),
        Route::Resources { group, version } => {
            discovery::resources(&state.objects.store.registry(), &group, &version)
                .map(|doc| json_response(StatusCode::OK, &doc, &[]))
                .ok_or_else(|| ApiError::no_route(&path))
        }
        // kubectl asks for the protobuf form, which the sim does not produce.
        Route::OpenApiV2 => Err(ApiError::no_route(&path)),
        Route::OpenApiV3 => Ok(json_response(
            StatusCode::OK,
            &openapi::v3_root(&state.objects.store.registry()),
            &[],
        )),
        Route::OpenApiV3GroupVersion { group, version } => {
            openapi::v3_group_version(&state.objects.store.registry(), &group, &version)
                .map(|doc| json_response(StatusCode::OK, &doc, &[]))
                .ok_or_else(|| ApiError::no_route(&path))
        }
        Route::Resource(target) => {
            let upgrade = if target.subresource.as_deref() == Some("portforward") {
                Some(hyper::upgrade::on(&mut request))
            } else {
                None
            };
            resource(&state, request, target, query, upgrade, from_node).await
        }
        Route::NotFound => Err(ApiError::no_route(&path)),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

/// How the client wants objects: `Table`, `PartialObjectMetadata` or plain JSON.
fn output_format(headers: &HeaderMap, query: &Query) -> Format {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let first_supported = accept.split(',').map(str::trim).find(|part| {
        part.starts_with("application/json") || part.starts_with("*/*") || part.is_empty()
    });
    match first_supported {
        Some(part) if part.contains("as=Table") => Format::Table(IncludeObject::parse(
            query.get("includeObject").map(String::as_str),
        )),
        Some(part) if part.contains("as=PartialObjectMetadata") => Format::PartialMetadata,
        _ => Format::Object,
    }
}

/// The user agent of the sim's own kubelet (field manager `kubelet`, as a real kubelet's).
/// Its requests, authenticated with the node's credential, are not counted: the counters show
/// what the product's components and tests ask of the API, as they did when the kubelet wrote
/// to the store directly.
pub(crate) const NODE_USER_AGENT: &str = "kubelet/v1.35.0-sim (kube-sim node)";

fn user_agent_manager(headers: &HeaderMap) -> String {
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let prefix = agent.split('/').next().unwrap_or_default().trim();
    if prefix.is_empty() {
        "unknown".to_owned()
    } else {
        prefix.to_owned()
    }
}

fn write_options(headers: &HeaderMap, query: &Query, apply: bool) -> WriteOptions {
    let manager = query
        .get("fieldManager")
        .cloned()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| {
            if apply {
                String::new()
            } else {
                user_agent_manager(headers)
            }
        });
    WriteOptions {
        manager,
        validation: FieldValidation::parse(query.get("fieldValidation").map(String::as_str)),
        dry_run: query.get("dryRun").is_some_and(|v| v == "All"),
        force: flag(query, "force").unwrap_or(false),
    }
}

/// The object in a create or update body: JSON, YAML, or (from client-go's typed clients) the
/// protobuf encoding.
fn parse_object_body(headers: &HeaderMap, bytes: &[u8]) -> ApiResult<Value> {
    let content_type = body_media_type(headers)?;
    if crate::protobuf::is_protobuf(&content_type) {
        return crate::protobuf::decode(bytes);
    }
    parse_body(bytes, true)
}

/// The media type of a create, update or delete body, which must be one the API server
/// decodes (JSON when none is given); anything else, `text/plain` or a form included, is 415
/// as on a real API server.
fn body_media_type(headers: &HeaderMap) -> ApiResult<String> {
    let given = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("?"))
        .unwrap_or_default();
    let media_type = given
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match media_type.as_str() {
        "" | "application/json" | "application/yaml" => Ok(media_type),
        other if crate::protobuf::is_protobuf(other) => Ok(media_type),
        _ => Err(ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf",
        )),
    }
}

fn parse_body(bytes: &[u8], yaml_allowed: bool) -> ApiResult<Value> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => Ok(value),
        Err(json_error) if yaml_allowed => {
            let text = std::str::from_utf8(bytes)
                .map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
            serde_saphyr::from_str::<Value>(text).map_err(|error| {
                ApiError::bad_request(format!(
                    "error decoding YAML: {error} (and as JSON: {json_error})"
                ))
            })
        }
        Err(error) => Err(ApiError::bad_request(format!(
            "the request body is not valid JSON: {error}"
        ))),
    }
}

fn resource_label(info: &ResourceInfo, sub: Option<&str>) -> String {
    match sub {
        Some(sub) => format!("{}/{sub}", info.plural),
        None => info.plural.clone(),
    }
}

fn subresource(info: &ResourceInfo, sub: Option<&str>) -> ApiResult<Subresource> {
    match sub {
        None => Ok(Subresource::Main),
        Some("status") if info.status => Ok(Subresource::Status),
        Some("scale") if info.scale.is_some() => Ok(Subresource::Scale),
        Some("finalize") if info.builtin == Builtin::Namespace => Ok(Subresource::Finalize),
        Some(other) => Err(ApiError::no_route(&format!("{}/{other}", info.plural))),
    }
}

fn list_kind(info: &ResourceInfo) -> String {
    format!("{}List", info.kind)
}

/// What a `continue` token carries: the list's version and the last object returned.
#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    rv: String,
    namespace: String,
    name: String,
}

async fn resource(
    state: &Arc<ApiState>,
    request: Request,
    target: ResourcePath,
    query: Query,
    upgrade: Option<hyper::upgrade::OnUpgrade>,
    from_node: bool,
) -> ApiResult<Response> {
    let info = state
        .objects
        .resource(&target.group, &target.version, &target.plural)
        .ok_or_else(|| ApiError::no_route(request.uri().path()))?;
    if target.namespace.is_some() && !info.namespaced {
        return Err(ApiError::no_route(request.uri().path()));
    }
    let namespace = target.namespace.clone().unwrap_or_default();
    let method = request.method().clone();
    let headers = request.headers().clone();
    let sub = target.subresource.as_deref();
    let label = resource_label(&info, sub);
    let count = |verb: &str| {
        if !from_node {
            state.metrics.count(verb, &info.group, &label);
        }
    };

    // Pod subresources served by the kubelet side.
    if info.builtin == Builtin::Pod
        && let (Some(name), Some(kind @ ("log" | "portforward"))) = (target.name.as_deref(), sub)
    {
        if kind == "log" {
            count("get");
            return crate::logs::serve(state, &state.kubelet, &info, &namespace, name, &query)
                .await;
        }
        count("connect");
        return crate::portforward::serve(state, &namespace, name, &headers, &query, upgrade).await;
    }

    let Some(name) = target.name.clone() else {
        return collection(state, request, &info, target, query, &method, from_node).await;
    };
    if info.namespaced && target.namespace.is_none() {
        return Err(ApiError::no_route(request.uri().path()));
    }
    if info.builtin == Builtin::ServiceAccount && sub == Some("token") {
        if method != Method::POST {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method})"
            )));
        }
        count("create");
        let body = read_body(request).await?;
        let value = parse_object_body(&headers, &body)?;
        let answer =
            state
                .credentials
                .token_request(&state.objects.store, &namespace, &name, &value)?;
        return Ok(json_response(StatusCode::CREATED, &answer, &[]));
    }
    let subresource = subresource(&info, sub)?;
    let format = output_format(&headers, &query);
    match method {
        Method::GET => {
            count("get");
            let object = if subresource == Subresource::Scale {
                state.objects.get_scale(&info, &namespace, &name)?
            } else {
                state.objects.get(&info, &namespace, &name)?
            };
            Ok(render_one(&info, object, format))
        }
        Method::PUT => {
            count("update");
            let body = read_body(request).await?;
            let value = parse_object_body(&headers, &body)?;
            let options = write_options(&headers, &query, false);
            let written =
                state
                    .objects
                    .update(&info, &namespace, &name, value, subresource, &options)?;
            let object = state
                .objects
                .present_for(&info, subresource, written.object);
            Ok(json_response(StatusCode::OK, &object, &written.warnings))
        }
        Method::PATCH => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned();
            let patch_type = match content_type.as_str() {
                "application/merge-patch+json" => PatchType::Merge,
                "application/json-patch+json" => PatchType::Json,
                "application/strategic-merge-patch+json" => PatchType::Strategic,
                "application/apply-patch+yaml" | "application/apply-patch+json" => PatchType::Apply,
                other => {
                    count("patch");
                    return Err(ApiError::unsupported_media_type(format!(
                        "the body of the request was in an unknown format ({other}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                    )));
                }
            };
            count(if patch_type == PatchType::Apply {
                "apply"
            } else {
                "patch"
            });
            let body = read_body(request).await?;
            let value = parse_body(&body, patch_type == PatchType::Apply)?;
            let options = write_options(&headers, &query, patch_type == PatchType::Apply);
            let written = state.objects.patch(
                &info,
                &namespace,
                &name,
                patch_type,
                &value,
                subresource,
                &options,
            )?;
            let object = state
                .objects
                .present_for(&info, subresource, written.object);
            let code = if written.created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(code, &object, &written.warnings))
        }
        Method::DELETE => {
            count("delete");
            let body = read_body(request).await?;
            let options = delete_options(&headers, &body, &query)?;
            let (object, _) = state.objects.delete(&info, &namespace, &name, &options)?;
            Ok(json_response(StatusCode::OK, &object, &[]))
        }
        other => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({other})"
        ))),
    }
}

fn render_one(info: &ResourceInfo, object: Value, format: Format) -> Response {
    let rendered = match format {
        Format::Table(include) => {
            let rv = meta::resource_version(&object).to_owned();
            table::render(info, &[object], &rv, include)
        }
        other => watch::render_object(info, &object, other),
    };
    json_response(StatusCode::OK, &rendered, &[])
}

async fn read_body(request: Request) -> ApiResult<bytes::Bytes> {
    use http_body_util::BodyExt as _;
    match http_body_util::Limited::new(request.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::body_too_large(MAX_BODY))
        }
        Err(error) => Err(ApiError::bad_request(format!(
            "cannot read the request body: {error}"
        ))),
    }
}

fn delete_options(headers: &HeaderMap, body: &[u8], query: &Query) -> ApiResult<DeleteOptions> {
    let parsed = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        body_media_type(headers)?;
        parse_body(body, false)?
    };
    let text = |field: &str| {
        parsed
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| query.get(field).cloned())
    };
    let propagation = match text("propagationPolicy").as_deref() {
        Some("Orphan") => Propagation::Orphan,
        Some("Foreground") => Propagation::Foreground,
        Some("Background") | None => {
            if parsed.get("orphanDependents").and_then(Value::as_bool) == Some(true)
                || flag(query, "orphanDependents") == Some(true)
            {
                Propagation::Orphan
            } else {
                Propagation::Background
            }
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unsupported propagationPolicy {other:?}"
            )));
        }
    };
    let grace_period = parsed
        .get("gracePeriodSeconds")
        .and_then(Value::as_i64)
        .or_else(|| query.get("gracePeriodSeconds").and_then(|v| v.parse().ok()));
    let dry_run = parsed
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|items| items.iter().any(|v| v == "All"))
        || query.get("dryRun").is_some_and(|v| v == "All");
    Ok(DeleteOptions {
        propagation,
        grace_period,
        uid: parsed
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_owned),
        resource_version: parsed
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_owned),
        dry_run,
    })
}

fn selectors(query: &Query) -> ApiResult<Selectors> {
    Ok(Selectors {
        labels: LabelSelector::parse(
            query
                .get("labelSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )
        .map_err(|why| ApiError::bad_request(format!("unable to parse requirement: {why}")))?,
        fields: FieldSelector::parse(
            query
                .get("fieldSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )
        .map_err(|why| ApiError::bad_request(format!("invalid field selector: {why}")))?,
    })
}

async fn collection(
    state: &Arc<ApiState>,
    request: Request,
    info: &Arc<ResourceInfo>,
    target: ResourcePath,
    query: Query,
    method: &Method,
    from_node: bool,
) -> ApiResult<Response> {
    let namespace = target.namespace.clone();
    let headers = &request.headers().clone();
    let count = |verb: &str| {
        if !from_node {
            state.metrics.count(verb, &info.group, &info.plural);
        }
    };
    if target.subresource.is_some() {
        return Err(ApiError::no_route(request.uri().path()));
    }
    let format = output_format(headers, &query);
    match *method {
        Method::GET => {
            let selectors = selectors(&query)?;
            if target.watch || flag(&query, "watch") == Some(true) {
                count("watch");
                let timeout = query
                    .get("timeoutSeconds")
                    .and_then(|v| v.parse::<u64>().ok())
                    .map_or(Duration::from_secs(1800), Duration::from_secs);
                let watch_request = watch::WatchRequest {
                    info: info.clone(),
                    namespace,
                    selectors,
                    resource_version: query.get("resourceVersion").cloned(),
                    send_initial_events: flag(&query, "sendInitialEvents"),
                    bookmarks: flag(&query, "allowWatchBookmarks").unwrap_or(false),
                    timeout,
                    format,
                };
                let stream = watch::start(
                    state.objects.clone(),
                    watch_request,
                    state.bookmark_interval,
                    state.watch_epoch.subscribe(),
                )?;
                let mut response = Response::new(Body::from_stream(stream));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                return Ok(response);
            }
            count("list");
            list(
                state,
                info,
                namespace.as_deref(),
                &selectors,
                &query,
                format,
            )
        }
        Method::POST => {
            count("create");
            let Some(namespace) = namespace.or_else(|| (!info.namespaced).then(String::new)) else {
                return Err(ApiError::no_route(request.uri().path()));
            };
            let body = read_body(request).await?;
            let value = parse_object_body(headers, &body)?;
            let options = write_options(headers, &query, false);
            let written = state.objects.create(info, &namespace, value, &options)?;
            Ok(json_response(
                StatusCode::CREATED,
                &written.object,
                &written.warnings,
            ))
        }
        Method::DELETE => {
            count("deletecollection");
            let selectors = selectors(&query)?;
            let body = read_body(request).await?;
            let options = delete_options(headers, &body, &query)?;
            let (items, _) = state.objects.list(info, namespace.as_deref(), &selectors);
            let mut deleted = Vec::new();
            for item in items {
                if let Ok((object, _)) =
                    state
                        .objects
                        .delete(info, meta::namespace(&item), meta::name(&item), &options)
                {
                    deleted.push(object);
                }
            }
            let list = json!({"kind": list_kind(info), "apiVersion": info.api_version(),
                              "metadata": {"resourceVersion": state.objects.store.current_rv().to_string()},
                              "items": deleted});
            Ok(json_response(StatusCode::OK, &list, &[]))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method})"
        ))),
    }
}

fn list(
    state: &Arc<ApiState>,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    selectors: &Selectors,
    query: &Query,
    format: Format,
) -> ApiResult<Response> {
    let (mut items, rv) = state.objects.list(info, namespace, selectors);
    let mut rv = rv.to_string();
    if let Some(token) = query.get("continue").filter(|t| !t.is_empty()) {
        let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<ContinueToken>(&bytes).ok())
            .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
        let after = (decoded.namespace.as_str(), decoded.name.as_str());
        items.retain(|item| (meta::namespace(item), meta::name(item)) > after);
        rv = decoded.rv;
    }
    let limit = query
        .get("limit")
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let mut continue_token = None;
    let mut remaining = None;
    if let Some(limit) = limit
        && items.len() > limit
    {
        remaining = Some(items.len() - limit);
        items.truncate(limit);
        if let Some(last) = items.last() {
            let token = ContinueToken {
                rv: rv.clone(),
                namespace: meta::namespace(last).to_owned(),
                name: meta::name(last).to_owned(),
            };
            let bytes = serde_json::to_vec(&token).unwrap_or_default();
            continue_token = Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes));
        }
    }
    let mut body = match format {
        Format::Table(include) => table::render(info, &items, &rv, include),
        other => {
            let (kind, api_version) = if other == Format::PartialMetadata {
                (
                    "PartialObjectMetadataList".to_owned(),
                    "meta.k8s.io/v1".to_owned(),
                )
            } else {
                (list_kind(info), info.api_version())
            };
            let items: Vec<Value> = items
                .iter()
                .map(|item| watch::render_object(info, item, other))
                .collect();
            json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": rv}, "items": items})
        }
    };
    // Tables page like lists: `kubectl get` follows `continue` in chunks of 500.
    if let Some(token) = continue_token {
        body["metadata"]["continue"] = json!(token);
        body["metadata"]["remainingItemCount"] = json!(remaining);
    }
    Ok(json_response(StatusCode::OK, &body, &[]))
}
