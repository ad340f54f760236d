//! Request bodies in the API server's protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! decoded to the JSON the rest of the sim works on (sans IO).
//!
//! client-go's typed clients send protobuf for built-in kinds, so `kubectl create namespace`,
//! `kubectl create configmap`, `kubectl create secret`, `kubectl create serviceaccount` and
//! `kubectl create service` write in this encoding, and client-go does not retry in JSON when refused (its 415 fallback is for
//! CBOR only). The body is the four bytes `k8s\0` followed by a `runtime.Unknown` message: the
//! object's `apiVersion` and `kind`, and the object's own message in `raw`.
//!
//! Only the kinds kubectl's generators write are described here ([`descriptor`]); another kind
//! gets 415 naming the kinds that are understood. Like Go's JSON encoding (`omitempty`) the
//! decoded object leaves out empty strings and zero timestamps, which Go's protobuf encoding
//! always writes for non-pointer fields, and a zero `generation`; other numbers and booleans are
//! kept as sent, since the fields that carry them here are pointers, written only when set.

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::api_error::{ApiError, ApiResult};

/// The media type.
pub(crate) const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// What precedes the `runtime.Unknown` envelope.
const MAGIC: &[u8] = b"k8s\0";

/// How a field's value is decoded.
#[derive(Clone, Copy, Debug)]
enum Kind {
    String,
    /// Bytes, shown base64-encoded as JSON shows `[]byte`.
    Bytes,
    /// A pointer integer: written only when set, so kept as sent.
    Int,
    /// A non-pointer integer, always written: zero is left out, as `omitempty` does.
    Count,
    /// A pointer boolean: kept as sent.
    Bool,
    /// A non-pointer boolean, always written: false is left out, as `omitempty` does.
    Flag,
    /// `intstr.IntOrString`: a number or a string, by its `type`.
    IntOrString,
    /// Read and dropped (a status the API server discards on create anyway).
    Ignore,
    /// `meta/v1.Time`: a message of seconds and nanoseconds, shown as RFC 3339.
    Time,
    /// Bytes holding JSON (`FieldsV1`'s `Raw`).
    Json,
    Message(&'static [Field]),
    StringMap,
    BytesMap,
}

/// One field of a message.
#[derive(Clone, Copy, Debug)]
struct Field {
    number: u64,
    name: &'static str,
    kind: Kind,
    repeated: bool,
}

const fn one(number: u64, name: &'static str, kind: Kind) -> Field {
    Field {
        number,
        name,
        kind,
        repeated: false,
    }
}

const fn many(number: u64, name: &'static str, kind: Kind) -> Field {
    Field {
        number,
        name,
        kind,
        repeated: true,
    }
}

// Field numbers from k8s.io/apimachinery and k8s.io/api `generated.proto`.
const TYPE_META: &[Field] = &[
    one(1, "apiVersion", Kind::String),
    one(2, "kind", Kind::String),
];
const UNKNOWN: &[Field] = &[
    one(1, "typeMeta", Kind::Message(TYPE_META)),
    one(2, "raw", Kind::Bytes),
    one(3, "contentEncoding", Kind::String),
    one(4, "contentType", Kind::String),
];
const OWNER_REFERENCE: &[Field] = &[
    one(5, "apiVersion", Kind::String),
    one(1, "kind", Kind::String),
    one(3, "name", Kind::String),
    one(4, "uid", Kind::String),
    one(6, "controller", Kind::Bool),
    one(7, "blockOwnerDeletion", Kind::Bool),
];
const FIELDS_V1: &[Field] = &[one(1, "raw", Kind::Json)];
const MANAGED_FIELDS_ENTRY: &[Field] = &[
    one(1, "manager", Kind::String),
    one(2, "operation", Kind::String),
    one(3, "apiVersion", Kind::String),
    one(4, "time", Kind::Time),
    one(6, "fieldsType", Kind::String),
    one(7, "fieldsV1", Kind::Message(FIELDS_V1)),
    one(8, "subresource", Kind::String),
];
const OBJECT_META: &[Field] = &[
    one(1, "name", Kind::String),
    one(2, "generateName", Kind::String),
    one(3, "namespace", Kind::String),
    one(4, "selfLink", Kind::String),
    one(5, "uid", Kind::String),
    one(6, "resourceVersion", Kind::String),
    one(7, "generation", Kind::Count),
    one(8, "creationTimestamp", Kind::Time),
    one(9, "deletionTimestamp", Kind::Time),
    one(10, "deletionGracePeriodSeconds", Kind::Int),
    one(11, "labels", Kind::StringMap),
    one(12, "annotations", Kind::StringMap),
    many(13, "ownerReferences", Kind::Message(OWNER_REFERENCE)),
    many(14, "finalizers", Kind::String),
    many(17, "managedFields", Kind::Message(MANAGED_FIELDS_ENTRY)),
];
const NAMESPACE_CONDITION: &[Field] = &[
    one(1, "type", Kind::String),
    one(2, "status", Kind::String),
    one(4, "lastTransitionTime", Kind::Time),
    one(5, "reason", Kind::String),
    one(6, "message", Kind::String),
];
const NAMESPACE: &[Field] = &[
    one(1, "metadata", Kind::Message(OBJECT_META)),
    one(
        2,
        "spec",
        Kind::Message(&[many(1, "finalizers", Kind::String)]),
    ),
    one(
        3,
        "status",
        Kind::Message(&[
            one(1, "phase", Kind::String),
            many(2, "conditions", Kind::Message(NAMESPACE_CONDITION)),
        ]),
    ),
];
const CONFIG_MAP: &[Field] = &[
    one(1, "metadata", Kind::Message(OBJECT_META)),
    one(4, "immutable", Kind::Bool),
    one(2, "data", Kind::StringMap),
    one(3, "binaryData", Kind::BytesMap),
];
const SECRET: &[Field] = &[
    one(1, "metadata", Kind::Message(OBJECT_META)),
    one(5, "immutable", Kind::Bool),
    one(2, "data", Kind::BytesMap),
    one(4, "stringData", Kind::StringMap),
    one(3, "type", Kind::String),
];
const OBJECT_REFERENCE: &[Field] = &[
    one(1, "kind", Kind::String),
    one(2, "namespace", Kind::String),
    one(3, "name", Kind::String),
    one(4, "uid", Kind::String),
    one(5, "apiVersion", Kind::String),
    one(6, "resourceVersion", Kind::String),
    one(7, "fieldPath", Kind::String),
];
const SERVICE_ACCOUNT: &[Field] = &[
    one(1, "metadata", Kind::Message(OBJECT_META)),
    many(2, "secrets", Kind::Message(OBJECT_REFERENCE)),
    many(
        3,
        "imagePullSecrets",
        Kind::Message(&[one(1, "name", Kind::String)]),
    ),
    one(4, "automountServiceAccountToken", Kind::Bool),
];

const SERVICE_PORT: &[Field] = &[
    one(1, "name", Kind::String),
    one(2, "protocol", Kind::String),
    one(6, "appProtocol", Kind::String),
    one(3, "port", Kind::Count),
    one(4, "targetPort", Kind::IntOrString),
    one(5, "nodePort", Kind::Count),
];
const SERVICE_SPEC: &[Field] = &[
    many(1, "ports", Kind::Message(SERVICE_PORT)),
    one(2, "selector", Kind::StringMap),
    one(3, "clusterIP", Kind::String),
    many(18, "clusterIPs", Kind::String),
    one(4, "type", Kind::String),
    many(5, "externalIPs", Kind::String),
    one(7, "sessionAffinity", Kind::String),
    one(8, "loadBalancerIP", Kind::String),
    many(9, "loadBalancerSourceRanges", Kind::String),
    one(10, "externalName", Kind::String),
    one(11, "externalTrafficPolicy", Kind::String),
    one(12, "healthCheckNodePort", Kind::Count),
    one(13, "publishNotReadyAddresses", Kind::Flag),
    one(
        14,
        "sessionAffinityConfig",
        Kind::Message(&[one(
            1,
            "clientIP",
            Kind::Message(&[one(1, "timeoutSeconds", Kind::Int)]),
        )]),
    ),
    many(19, "ipFamilies", Kind::String),
    one(17, "ipFamilyPolicy", Kind::String),
    one(20, "allocateLoadBalancerNodePorts", Kind::Bool),
    one(21, "loadBalancerClass", Kind::String),
    one(22, "internalTrafficPolicy", Kind::String),
    one(23, "trafficDistribution", Kind::String),
];
const CONDITION: &[Field] = &[
    one(1, "type", Kind::String),
    one(2, "status", Kind::String),
    one(3, "observedGeneration", Kind::Count),
    one(4, "lastTransitionTime", Kind::Time),
    one(5, "reason", Kind::String),
    one(6, "message", Kind::String),
];
const LOAD_BALANCER_INGRESS: &[Field] = &[
    one(1, "ip", Kind::String),
    one(2, "hostname", Kind::String),
    one(3, "ipMode", Kind::String),
    many(
        4,
        "ports",
        Kind::Message(&[
            one(1, "port", Kind::Count),
            one(2, "protocol", Kind::String),
            one(3, "error", Kind::String),
        ]),
    ),
];
const SERVICE: &[Field] = &[
    one(1, "metadata", Kind::Message(OBJECT_META)),
    one(2, "spec", Kind::Message(SERVICE_SPEC)),
    one(
        3,
        "status",
        Kind::Message(&[
            one(
                1,
                "loadBalancer",
                Kind::Message(&[many(1, "ingress", Kind::Message(LOAD_BALANCER_INGRESS))]),
            ),
            many(2, "conditions", Kind::Message(CONDITION)),
        ]),
    ),
];

const LABEL_SELECTOR: &[Field] = &[
    one(1, "matchLabels", Kind::StringMap),
    many(
        2,
        "matchExpressions",
        Kind::Message(&[
            one(1, "key", Kind::String),
            one(2, "operator", Kind::String),
            many(3, "values", Kind::String),
        ]),
    ),
];
/// The part of a container `kubectl create deployment` writes; a body setting anything else
/// is refused (see [`message`]).
const CONTAINER: &[Field] = &[
    one(1, "name", Kind::String),
    one(2, "image", Kind::String),
    many(3, "command", Kind::String),
    many(4, "args", Kind::String),
    one(5, "workingDir", Kind::String),
    many(
        6,
        "ports",
        Kind::Message(&[
            one(1, "name", Kind::String),
            one(2, "hostPort", Kind::Count),
            one(3, "containerPort", Kind::Count),
            one(4, "protocol", Kind::String),
            one(5, "hostIP", Kind::String),
        ]),
    ),
    many(
        7,
        "env",
        Kind::Message(&[one(1, "name", Kind::String), one(2, "value", Kind::String)]),
    ),
    one(13, "terminationMessagePath", Kind::String),
    one(20, "terminationMessagePolicy", Kind::String),
    one(14, "imagePullPolicy", Kind::String),
];
/// Likewise the part of a pod spec.
const POD_SPEC: &[Field] = &[
    many(2, "containers", Kind::Message(CONTAINER)),
    many(20, "initContainers", Kind::Message(CONTAINER)),
    one(3, "restartPolicy", Kind::String),
    one(4, "terminationGracePeriodSeconds", Kind::Int),
    one(6, "dnsPolicy", Kind::String),
    one(7, "nodeSelector", Kind::StringMap),
    one(8, "serviceAccountName", Kind::String),
    one(19, "schedulerName", Kind::String),
];
const DEPLOYMENT: &[Field] = &[
    one(1, "metadata", Kind::Message(OBJECT_META)),
    one(
        2,
        "spec",
        Kind::Message(&[
            one(1, "replicas", Kind::Int),
            one(2, "selector", Kind::Message(LABEL_SELECTOR)),
            one(
                3,
                "template",
                Kind::Message(&[
                    one(1, "metadata", Kind::Message(OBJECT_META)),
                    one(2, "spec", Kind::Message(POD_SPEC)),
                ]),
            ),
            one(
                4,
                "strategy",
                Kind::Message(&[
                    one(1, "type", Kind::String),
                    one(
                        2,
                        "rollingUpdate",
                        Kind::Message(&[
                            one(1, "maxUnavailable", Kind::IntOrString),
                            one(2, "maxSurge", Kind::IntOrString),
                        ]),
                    ),
                ]),
            ),
            one(5, "minReadySeconds", Kind::Count),
            one(6, "revisionHistoryLimit", Kind::Int),
            one(7, "paused", Kind::Flag),
            one(9, "progressDeadlineSeconds", Kind::Int),
        ]),
    ),
    one(3, "status", Kind::Ignore),
];

/// `authentication.k8s.io/v1` TokenRequest, as `kubectl create token` sends it.
const TOKEN_REQUEST: &[Field] = &[
    one(1, "metadata", Kind::Message(OBJECT_META)),
    one(
        2,
        "spec",
        Kind::Message(&[
            many(1, "audiences", Kind::String),
            one(4, "expirationSeconds", Kind::Int),
            one(
                3,
                "boundObjectRef",
                Kind::Message(&[
                    one(1, "kind", Kind::String),
                    one(2, "apiVersion", Kind::String),
                    one(3, "name", Kind::String),
                    one(4, "uid", Kind::String),
                ]),
            ),
        ]),
    ),
    one(3, "status", Kind::Ignore),
];

/// The kinds whose messages are described, by `apiVersion` and `kind`.
fn descriptor(api_version: &str, kind: &str) -> Option<&'static [Field]> {
    Some(match (api_version, kind) {
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "Service") => SERVICE,
        ("apps/v1", "Deployment") => DEPLOYMENT,
        ("authentication.k8s.io/v1", "TokenRequest") => TOKEN_REQUEST,
        _ => return None,
    })
}

fn malformed(why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "the protobuf request body cannot be decoded: {why}"
    ))
}

/// A reader of protobuf wire format.
struct Reader<'a> {
    bytes: &'a [u8],
}

/// A field as it appears on the wire.
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> ApiResult<u64> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let (&byte, rest) = self
                .bytes
                .split_first()
                .ok_or_else(|| malformed("a varint runs past the end"))?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(malformed("a varint is longer than ten bytes"))
    }

    fn take(&mut self, len: usize) -> ApiResult<&'a [u8]> {
        if len > self.bytes.len() {
            return Err(malformed("a field runs past the end"));
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    /// The next field's number and value, or `None` at the end.
    fn field(&mut self) -> ApiResult<Option<(u64, Wire<'a>)>> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let wire = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(self.varint()?)
                    .map_err(|_| malformed("a length does not fit"))?;
                Wire::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Wire::Fixed
            }
            other => return Err(malformed(&format!("wire type {other} is not supported"))),
        };
        Ok(Some((key >> 3, wire)))
    }
}

fn text(bytes: &[u8]) -> ApiResult<String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| malformed("a string is not UTF-8"))
}

/// A map entry's key and value (fields 1 and 2).
fn map_entry(bytes: &[u8]) -> ApiResult<(String, &[u8])> {
    let mut reader = Reader { bytes };
    let (mut key, mut value) = (String::new(), &[][..]);
    while let Some((number, wire)) = reader.field()? {
        match (number, wire) {
            (1, Wire::Bytes(b)) => key = text(b)?,
            (2, Wire::Bytes(b)) => value = b,
            _ => {}
        }
    }
    Ok((key, value))
}

fn time(bytes: &[u8]) -> ApiResult<Option<String>> {
    let mut reader = Reader { bytes };
    let (mut seconds, mut nanos) = (0i64, 0i64);
    while let Some((number, wire)) = reader.field()? {
        // Varints carry two's-complement int64 values.
        #[allow(clippy::cast_possible_wrap)]
        match (number, wire) {
            (1, Wire::Varint(v)) => seconds = v as i64,
            (2, Wire::Varint(v)) => nanos = v as i64,
            _ => {}
        }
    }
    if bytes.is_empty() {
        return Ok(None);
    }
    let stamp = k8s_openapi::jiff::Timestamp::new(seconds, i32::try_from(nanos).unwrap_or(0))
        .map_err(|_| malformed("a timestamp is out of range"))?;
    Ok(Some(crate::meta::format_time(stamp)))
}

fn int_or_string(bytes: &[u8]) -> ApiResult<Value> {
    let mut reader = Reader { bytes };
    let (mut is_string, mut number, mut text_value) = (false, 0i64, String::new());
    while let Some((field, wire)) = reader.field()? {
        // Varints carry two's-complement int32 values.
        #[allow(clippy::cast_possible_wrap)]
        match (field, wire) {
            (1, Wire::Varint(kind)) => is_string = kind == 1,
            (2, Wire::Varint(v)) => number = i64::from(v as i32),
            (3, Wire::Bytes(b)) => text_value = text(b)?,
            _ => {}
        }
    }
    Ok(if is_string {
        json!(text_value)
    } else {
        json!(number)
    })
}

/// One value of `kind`, or `None` when it is the zero value JSON leaves out.
fn value(kind: Kind, wire: Wire<'_>) -> ApiResult<Option<Value>> {
    fn bytes(wire: Wire<'_>) -> ApiResult<&[u8]> {
        match wire {
            Wire::Bytes(bytes) => Ok(bytes),
            _ => Err(malformed("a length-delimited field has another wire type")),
        }
    }
    let base64 = |b: &[u8]| json!(base64::engine::general_purpose::STANDARD.encode(b));
    Ok(match kind {
        Kind::String => Some(text(bytes(wire)?)?)
            .filter(|s| !s.is_empty())
            .map(Value::from),
        Kind::Bytes => Some(base64(bytes(wire)?)),
        Kind::Json => Some(
            serde_json::from_slice(bytes(wire)?)
                .map_err(|_| malformed("a FieldsV1 does not hold JSON"))?,
        ),
        Kind::Time => time(bytes(wire)?)?.map(Value::from),
        // Varints carry two's-complement int64 values.
        #[allow(clippy::cast_possible_wrap)]
        Kind::Int => match wire {
            Wire::Varint(v) => Some(json!(v as i64)),
            _ => return Err(malformed("an integer field has another wire type")),
        },
        #[allow(clippy::cast_possible_wrap)]
        Kind::Count => match wire {
            Wire::Varint(0) => None,
            Wire::Varint(v) => Some(json!(v as i64)),
            _ => return Err(malformed("an integer field has another wire type")),
        },
        Kind::Flag => match wire {
            Wire::Varint(0) => None,
            Wire::Varint(_) => Some(json!(true)),
            _ => return Err(malformed("a boolean field has another wire type")),
        },
        Kind::IntOrString => Some(int_or_string(bytes(wire)?)?),
        Kind::Ignore => None,
        Kind::Bool => match wire {
            Wire::Varint(v) => Some(json!(v != 0)),
            _ => return Err(malformed("a boolean field has another wire type")),
        },
        Kind::Message(fields) => Some(message(fields, bytes(wire)?)?),
        // Maps are decoded entry by entry in `message`, never as one value.
        Kind::StringMap | Kind::BytesMap => None,
    })
}

/// Whether a field holds its type's zero value: 0, an empty string or message, or a message
/// of zero values only.
fn is_zero(wire: &Wire<'_>) -> bool {
    match wire {
        Wire::Varint(v) => *v == 0,
        Wire::Fixed => false,
        Wire::Bytes(bytes) => {
            let mut reader = Reader { bytes };
            loop {
                match reader.field() {
                    Ok(None) => return true,
                    Ok(Some((_, inner))) if is_zero(&inner) => {}
                    _ => return false,
                }
            }
        }
    }
}

/// Decodes a message with `fields` (unknown field numbers are skipped, as protobuf does).
fn message(fields: &[Field], bytes: &[u8]) -> ApiResult<Value> {
    let mut out = Map::new();
    let mut reader = Reader { bytes };
    while let Some((number, wire)) = reader.field()? {
        let Some(field) = fields.iter().find(|f| f.number == number) else {
            // Go's encoding writes every non-pointer field, set or not: an unknown field that
            // holds its zero value says nothing; one that holds more would be lost.
            if is_zero(&wire) {
                continue;
            }
            return Err(ApiError::unsupported_media_type(format!(
                "the sim's {CONTENT_TYPE} decoder does not know field {number} of a message in this body, which is set - send it as application/json"
            )));
        };
        match field.kind {
            Kind::StringMap | Kind::BytesMap => {
                let Wire::Bytes(entry) = wire else {
                    return Err(malformed("a map entry has another wire type"));
                };
                let (key, raw) = map_entry(entry)?;
                let value = if matches!(field.kind, Kind::StringMap) {
                    json!(text(raw)?)
                } else {
                    json!(base64::engine::general_purpose::STANDARD.encode(raw))
                };
                let map = out
                    .entry(field.name)
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(map) = map.as_object_mut() {
                    map.insert(key, value);
                }
            }
            kind => {
                let Some(decoded) = value(kind, wire)? else {
                    continue;
                };
                if field.repeated {
                    let list = out.entry(field.name).or_insert_with(|| json!([]));
                    if let Some(list) = list.as_array_mut() {
                        list.push(decoded);
                    }
                } else {
                    out.insert(field.name.to_owned(), decoded);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// Whether a `Content-Type` names the protobuf encoding.
pub(crate) fn is_protobuf(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|media| media.trim() == CONTENT_TYPE)
}

/// The object in a protobuf request body, as JSON with its `apiVersion` and `kind`.
pub(crate) fn decode(body: &[u8]) -> ApiResult<Value> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| malformed("it does not start with the \"k8s\\x00\" prefix"))?;
    let unknown = message(UNKNOWN, envelope)?;
    let api_version = unknown
        .pointer("/typeMeta/apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = unknown
        .pointer("/typeMeta/kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if unknown
        .get("contentEncoding")
        .is_some_and(|e| e.as_str() != Some(""))
    {
        return Err(malformed("content encodings are not supported"));
    }
    let fields = descriptor(api_version, kind).ok_or_else(|| {
        ApiError::unsupported_media_type(format!(
            "the sim decodes {CONTENT_TYPE} bodies of v1 Namespace, ConfigMap, Secret, ServiceAccount and Service, apps/v1 Deployment and authentication.k8s.io/v1 TokenRequest only, not {api_version} {kind} - accepted media types include: application/json, application/yaml"
        ))
    })?;
    // `raw` was decoded as base64 text like any bytes field; take it from the wire again.
    let raw = raw_bytes(envelope)?;
    let mut object = message(fields, raw)?;
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), json!(api_version));
        map.insert("kind".into(), json!(kind));
    }
    Ok(object)
}

/// Field 2 (`raw`) of the envelope.
fn raw_bytes(envelope: &[u8]) -> ApiResult<&[u8]> {
    let mut reader = Reader { bytes: envelope };
    while let Some((number, wire)) = reader.field()? {
        if let (2, Wire::Bytes(raw)) = (number, wire) {
            return Ok(raw);
        }
    }
    Ok(&[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text
            .bytes()
            .filter(u8::is_ascii_hexdigit)
            .map(|d| u8::from_str_radix(std::str::from_utf8(&[d]).unwrap(), 16).unwrap())
            .collect();
        digits
            .chunks(2)
            .map(|pair| pair[0] << 4 | pair[1])
            .collect()
    }

    /// The body kubectl 1.37.2 sends for `kubectl create namespace team-a`.
    const CREATE_NAMESPACE: &str = "6b3873000a0f0a02763112094e616d657370616365121e0a160a06746561
        6d2d6112001a0022002a0032003800420012001a020a001a002200";

    /// The body kubectl 1.37.2 sends for `kubectl create configmap cm -n x --from-literal=a=b`.
    const CREATE_CONFIG_MAP: &str = "6b3873000a0f0a0276311209436f6e6669674d6170121d0a130a02636d12
        001a017822002a0032003800420012060a01611201621a002200";

    #[test]
    fn kubectls_create_namespace_body_decodes_to_the_namespace() {
        let object = decode(&hex(CREATE_NAMESPACE)).unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"},
                   "spec": {}, "status": {}})
        );
    }

    /// The body kubectl 1.37.2 sends for
    /// `kubectl create service clusterip web -n x --tcp=8080:http --tcp=9090`.
    const CREATE_SERVICE: &str = "6b3873000a0d0a027631120753657276696365128b010a200a0377656212
        001a017822002a003200380042005a0a0a03617070120377656212630a21
        0a09383038302d68747470120354435018903f220a080110001a04687474
        7028000a190a04393039301203544350188247220708001082471a002800
        120a0a0361707012037765621a002209436c757374657249503a00420052
        005a00600068001a020a001a002200";

    #[test]
    fn kubectls_create_service_body_decodes_with_ports_and_target_ports() {
        let object = decode(&hex(CREATE_SERVICE)).unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": "web", "namespace": "x", "labels": {"app": "web"}},
                   "spec": {"ports": [
                                {"name": "8080-http", "protocol": "TCP", "port": 8080, "targetPort": "http"},
                                {"name": "9090", "protocol": "TCP", "port": 9090, "targetPort": 9090}],
                            "selector": {"app": "web"}, "type": "ClusterIP"},
                   "status": {"loadBalancer": {}}})
        );
    }

    /// The body kubectl 1.37.2 sends for
    /// `kubectl create deployment web -n x --image=busybox --replicas=2 --port=8080 -- sleep 100`.
    const CREATE_DEPLOYMENT: &str = "6b3873000a150a07617070732f7631120a4465706c6f796d656e7412ca01
        0a200a0377656212001a017822002a003200380042005a0a0a0361707012
        037765621297010802120c0a0a0a0361707012037765621a7d0a1c0a0012
        001a0022002a003200380042005a0a0a036170701203776562125d123f0a
        0762757379626f78120762757379626f781a05736c6565701a033130302a
        00320b0a00100018903f22002a0042006a007200800100880100900100a2
        01001a00320042004a0052005800600068008201008a01009a0100c20100
        22020a00280038001a0c0800100018002000280038001a002200";

    #[test]
    fn kubectls_create_deployment_body_decodes_to_its_template() {
        let object = decode(&hex(CREATE_DEPLOYMENT)).unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "web", "namespace": "x", "labels": {"app": "web"}},
                   "spec": {"replicas": 2,
                            "selector": {"matchLabels": {"app": "web"}},
                            "template": {"metadata": {"labels": {"app": "web"}},
                                         "spec": {"containers": [{
                                             "name": "busybox", "image": "busybox",
                                             "command": ["sleep", "100"],
                                             "ports": [{"containerPort": 8080}]}]}},
                            "strategy": {}}})
        );
    }

    #[test]
    fn a_set_field_the_decoder_does_not_know_is_refused() {
        // The Deployment body with its container's `stdin` (field 16) set to true.
        let mut body = hex(CREATE_DEPLOYMENT);
        let at = body
            .windows(3)
            .position(|w| w == [0x80, 0x01, 0x00])
            .unwrap();
        body[at + 2] = 1;
        let error = decode(&body).unwrap_err();
        assert_eq!(error.code, 415, "{}", error.message);
        assert!(error.message.contains("field 16"), "{}", error.message);
    }

    #[test]
    fn kubectls_create_configmap_body_decodes_with_its_data() {
        let object = decode(&hex(CREATE_CONFIG_MAP)).unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cm", "namespace": "x"}, "data": {"a": "b"}})
        );
    }

    #[test]
    fn labels_times_owner_references_and_secret_bytes_decode() {
        fn bytes_field(number: u8, payload: &[u8]) -> Vec<u8> {
            let mut out = vec![number << 3 | 2, u8::try_from(payload.len()).unwrap()];
            out.extend_from_slice(payload);
            out
        }
        let entry = [bytes_field(1, b"app"), bytes_field(2, b"web")].concat();
        let mut time = vec![0x08];
        // 2024-01-02T03:04:05Z as a varint.
        let mut seconds: u64 = 1_704_164_645;
        while seconds >= 0x80 {
            time.push(u8::try_from(seconds & 0x7f).unwrap() | 0x80);
            seconds >>= 7;
        }
        time.push(u8::try_from(seconds).unwrap());
        let owner = [
            bytes_field(1, b"Deployment"),
            bytes_field(3, b"d"),
            vec![6 << 3, 1],
        ]
        .concat();
        let meta = [
            bytes_field(1, b"s"),
            bytes_field(8, &time),
            bytes_field(11, &entry),
            bytes_field(13, &owner),
            bytes_field(14, b"example.com/f"),
        ]
        .concat();
        let data = [bytes_field(1, b"k"), bytes_field(2, &[0, 255])].concat();
        let secret = [
            bytes_field(1, &meta),
            bytes_field(2, &data),
            bytes_field(3, b"Opaque"),
        ]
        .concat();
        let type_meta = [bytes_field(1, b"v1"), bytes_field(2, b"Secret")].concat();
        let envelope = [bytes_field(1, &type_meta), bytes_field(2, &secret)].concat();
        let body = [MAGIC, &envelope].concat();
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                   "metadata": {"name": "s", "creationTimestamp": "2024-01-02T03:04:05Z",
                                "labels": {"app": "web"},
                                "ownerReferences": [{"kind": "Deployment", "name": "d", "controller": true}],
                                "finalizers": ["example.com/f"]},
                   "data": {"k": "AP8="}})
        );
    }

    #[test]
    fn other_kinds_are_unsupported_media_and_garbage_is_a_bad_request() {
        let mut body = hex(CREATE_NAMESPACE);
        // "Namespace" → "Namespacf": a kind without a description.
        let at = body.iter().position(|&b| b == b'N').unwrap() + 8;
        body[at] = b'f';
        let error = decode(&body).unwrap_err();
        assert_eq!(error.code, 415, "{}", error.message);
        assert_eq!(decode(b"{}").unwrap_err().code, 400);
        let truncated = &hex(CREATE_NAMESPACE)[..20];
        assert_eq!(decode(truncated).unwrap_err().code, 400);
    }
}
