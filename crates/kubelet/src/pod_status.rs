//! Pod status from what the kubelet knows about its processes (sans IO): phase, conditions,
//! container statuses, pod IPs.

use serde_json::{Value, json};

/// How a container ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Terminated {
    pub(crate) exit_code: i32,
    pub(crate) signal: Option<i32>,
    pub(crate) reason: String,
    pub(crate) message: Option<String>,
    pub(crate) started_at: String,
    pub(crate) finished_at: String,
    pub(crate) container_id: String,
}

/// The state of one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: String,
    },
    Terminated(Terminated),
}

/// What the kubelet knows about one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ContainerInfo {
    pub(crate) name: String,
    pub(crate) image: String,
    pub(crate) state: State,
    pub(crate) last: Option<Terminated>,
    pub(crate) ready: bool,
    pub(crate) restart_count: u32,
    pub(crate) container_id: Option<String>,
}

impl ContainerInfo {
    /// A container not started yet.
    pub(crate) fn waiting(name: &str, image: &str, reason: &str, message: Option<String>) -> Self {
        Self {
            name: name.to_owned(),
            image: image.to_owned(),
            state: State::Waiting {
                reason: reason.to_owned(),
                message,
            },
            last: None,
            ready: false,
            restart_count: 0,
            container_id: None,
        }
    }

    fn to_json(&self) -> Value {
        let mut status = json!({
            "name": self.name,
            "image": self.image,
            "imageID": format!("sim://{}", self.image),
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": matches!(self.state, State::Running { .. }),
            "state": state_json(&self.state),
            "lastState": self.last.as_ref().map_or(json!({}), |t| json!({"terminated": terminated_json(t)})),
        });
        if let Some(id) = &self.container_id {
            status["containerID"] = json!(id);
        }
        status
    }
}

fn terminated_json(t: &Terminated) -> Value {
    let mut value = json!({
        "exitCode": t.exit_code,
        "reason": t.reason,
        "startedAt": t.started_at,
        "finishedAt": t.finished_at,
        "containerID": t.container_id,
    });
    if let Some(signal) = t.signal {
        value["signal"] = json!(signal);
    }
    if let Some(message) = &t.message {
        value["message"] = json!(message);
    }
    value
}

fn state_json(state: &State) -> Value {
    match state {
        State::Waiting { reason, message } => {
            let mut waiting = json!({"reason": reason});
            if let Some(message) = message {
                waiting["message"] = json!(message);
            }
            json!({"waiting": waiting})
        }
        State::Running { started_at } => json!({"running": {"startedAt": started_at}}),
        State::Terminated(t) => json!({"terminated": terminated_json(t)}),
    }
}

/// What the kubelet knows about a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PodInfo {
    pub(crate) pod_ip: Option<String>,
    pub(crate) start_time: Option<String>,
    pub(crate) init: Vec<ContainerInfo>,
    pub(crate) containers: Vec<ContainerInfo>,
    /// All init containers completed.
    pub(crate) initialized: bool,
    /// Terminal phase decided by the kubelet (`Succeeded`/`Failed`).
    pub(crate) terminal: Option<String>,
    /// Why the kubelet refused the pod (`status.message`, with `status.reason`
    /// `InvalidPodSpec`), as a node reports a pod it rejects.
    pub(crate) message: Option<String>,
}

/// The pod's phase.
pub(crate) fn phase(info: &PodInfo) -> &str {
    if let Some(terminal) = &info.terminal {
        return terminal;
    }
    if info.initialized
        && info
            .containers
            .iter()
            .any(|c| matches!(c.state, State::Running { .. }) || c.restart_count > 0)
    {
        return "Running";
    }
    "Pending"
}

fn condition(previous: &Value, type_: &str, ok: bool, reason: Option<&str>, now: &str) -> Value {
    let status = if ok { "True" } else { "False" };
    let earlier = previous
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|list| {
            list.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
        });
    let since = earlier
        .filter(|c| c.get("status").and_then(Value::as_str) == Some(status))
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(now));
    let mut value = json!({"type": type_, "status": status, "lastProbeTime": null,
                           "lastTransitionTime": since});
    if let Some(reason) = reason.filter(|_| !ok) {
        value["reason"] = json!(reason);
    }
    value
}

/// The pod conditions the kubelet owns; others' (readiness gates) it keeps as they are.
pub(crate) const OWN_CONDITIONS: [&str; 5] = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
];

/// The status object for `info`, keeping transition times from `previous` (the stored status).
pub(crate) fn pod_status(info: &PodInfo, previous: &Value, now: &str) -> Value {
    let phase = phase(info);
    let all_ready = !info.containers.is_empty() && info.containers.iter().all(|c| c.ready);
    let completed = matches!(phase, "Succeeded" | "Failed");
    let not_ready_reason = if completed {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    let mut conditions = vec![
        condition(
            previous,
            "PodReadyToStartContainers",
            info.pod_ip.is_some(),
            None,
            now,
        ),
        condition(
            previous,
            "Initialized",
            info.initialized,
            Some(if completed {
                "PodCompleted"
            } else {
                "ContainersNotInitialized"
            }),
            now,
        ),
        condition(
            previous,
            "Ready",
            all_ready && !completed,
            Some(not_ready_reason),
            now,
        ),
        condition(
            previous,
            "ContainersReady",
            all_ready && !completed,
            Some(not_ready_reason),
            now,
        ),
        condition(previous, "PodScheduled", true, None, now),
    ];
    // Conditions set by others (readiness gates) are kept.
    if let Some(list) = previous.get("conditions").and_then(Value::as_array) {
        conditions.extend(
            list.iter()
                .filter(|c| {
                    !OWN_CONDITIONS
                        .contains(&c.get("type").and_then(Value::as_str).unwrap_or_default())
                })
                .cloned(),
        );
    }
    let mut status = json!({
        "phase": phase,
        "conditions": conditions,
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "qosClass": previous.get("qosClass").cloned().unwrap_or(json!("BestEffort")),
        "containerStatuses": info.containers.iter().map(ContainerInfo::to_json).collect::<Vec<_>>(),
    });
    if !info.init.is_empty() {
        status["initContainerStatuses"] = info.init.iter().map(ContainerInfo::to_json).collect();
    }
    if let Some(ip) = &info.pod_ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    if let Some(start) = &info.start_time {
        status["startTime"] = json!(start);
    }
    if let Some(message) = &info.message {
        status["reason"] = json!("InvalidPodSpec");
        status["message"] = json!(message);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn running(name: &str, ready: bool) -> ContainerInfo {
        ContainerInfo {
            state: State::Running {
                started_at: "t0".into(),
            },
            ready,
            container_id: Some("sim://42".into()),
            ..ContainerInfo::waiting(name, "img", "ContainerCreating", None)
        }
    }

    #[test]
    fn running_ready_pod() {
        let info = PodInfo {
            pod_ip: Some("127.9.9.9".into()),
            start_time: Some("t0".into()),
            containers: vec![running("c", true)],
            initialized: true,
            ..PodInfo::default()
        };
        let status = pod_status(&info, &json!({}), "t1");
        assert_eq!(status["phase"], json!("Running"));
        assert_eq!(status["podIP"], json!("127.9.9.9"));
        let ready = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], json!("True"));
        assert_eq!(
            status["containerStatuses"][0]["containerID"],
            json!("sim://42")
        );
        // Unchanged condition keeps its transition time.
        let later = pod_status(&info, &status, "t2");
        let ready_later = later["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready_later["lastTransitionTime"], json!("t1"));
        assert_eq!(
            status["containerStatuses"][0]["state"],
            json!({"running": {"startedAt": "t0"}})
        );
    }

    #[test]
    fn image_pull_failures_and_completion_show_in_container_states() {
        let info = PodInfo {
            containers: vec![ContainerInfo::waiting(
                "c",
                "nginx",
                "ErrImagePull",
                Some("unknown image".into()),
            )],
            ..PodInfo::default()
        };
        let status = pod_status(&info, &json!({}), "t");
        assert_eq!(status["phase"], json!("Pending"));
        assert_eq!(
            status["containerStatuses"][0]["state"],
            json!({"waiting": {"reason": "ErrImagePull", "message": "unknown image"}})
        );
        let done = PodInfo {
            initialized: true,
            terminal: Some("Succeeded".into()),
            containers: vec![ContainerInfo {
                state: State::Terminated(Terminated {
                    exit_code: 0,
                    signal: None,
                    reason: "Completed".into(),
                    message: None,
                    started_at: "a".into(),
                    finished_at: "b".into(),
                    container_id: "sim://1".into(),
                }),
                ..ContainerInfo::waiting("c", "busybox", "", None)
            }],
            ..PodInfo::default()
        };
        let status = pod_status(&done, &json!({}), "t");
        assert_eq!(status["phase"], json!("Succeeded"));
        assert_eq!(
            status["containerStatuses"][0]["state"]["terminated"]["reason"],
            json!("Completed")
        );
    }
}
