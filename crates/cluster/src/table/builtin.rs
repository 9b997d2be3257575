//! kube-apiserver's printers for the built-in resources: which columns a resource
//! gets and the cells of each row, as `pkg/printers/internalversion` computes them.

use std::collections::BTreeSet;

use crate::pointer::Pointer;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::Row;
use super::columns::*;
use super::duration::since;
use super::fields::{entries, flag, integer, list, or_placeholder, text, timestamp};
use crate::selector::LabelSelector;

/// The built-in printers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Printer {
    Node,
    Pod,
    Namespace,
    ConfigMap,
    Secret,
    ServiceAccount,
    Service,
    Event,
    DaemonSet,
    Deployment,
    ReplicaSet,
    ReplicationController,
    StatefulSet,
    ControllerRevision,
    PodDisruptionBudget,
    Lease,
    CustomResourceDefinition,
    Generic,
}

impl Printer {
    pub(super) fn for_resource(plural: &str) -> Self {
        match plural {
            "nodes" => Printer::Node,
            "pods" => Printer::Pod,
            "namespaces" => Printer::Namespace,
            "configmaps" => Printer::ConfigMap,
            "secrets" => Printer::Secret,
            "serviceaccounts" => Printer::ServiceAccount,
            "services" => Printer::Service,
            "events" => Printer::Event,
            "daemonsets" => Printer::DaemonSet,
            "deployments" => Printer::Deployment,
            "replicasets" => Printer::ReplicaSet,
            "replicationcontrollers" => Printer::ReplicationController,
            "statefulsets" => Printer::StatefulSet,
            "controllerrevisions" => Printer::ControllerRevision,
            "poddisruptionbudgets" => Printer::PodDisruptionBudget,
            "leases" => Printer::Lease,
            "customresourcedefinitions" => Printer::CustomResourceDefinition,
            _ => Printer::Generic,
        }
    }

    pub(super) fn columns(self) -> &'static [Column] {
        match self {
            Printer::Node => NODE_COLUMNS,
            Printer::Pod => POD_COLUMNS,
            Printer::Namespace => NAMESPACE_COLUMNS,
            Printer::ConfigMap => CONFIG_MAP_COLUMNS,
            Printer::Secret => SECRET_COLUMNS,
            Printer::ServiceAccount => SERVICE_ACCOUNT_COLUMNS,
            Printer::Service => SERVICE_COLUMNS,
            Printer::Event => EVENT_COLUMNS,
            Printer::DaemonSet => DAEMON_SET_COLUMNS,
            Printer::Deployment => DEPLOYMENT_COLUMNS,
            Printer::ReplicaSet => REPLICA_SET_COLUMNS,
            Printer::ReplicationController => REPLICATION_CONTROLLER_COLUMNS,
            Printer::StatefulSet => STATEFUL_SET_COLUMNS,
            Printer::ControllerRevision => CONTROLLER_REVISION_COLUMNS,
            Printer::PodDisruptionBudget => POD_DISRUPTION_BUDGET_COLUMNS,
            Printer::Lease => LEASE_COLUMNS,
            Printer::CustomResourceDefinition => CUSTOM_RESOURCE_DEFINITION_COLUMNS,
            Printer::Generic => GENERIC_COLUMNS,
        }
    }

    pub(super) fn row(self, object: &Value, now: Timestamp) -> Row {
        let name = text(object, "/metadata/name");
        let age = since(timestamp(object, "/metadata/creationTimestamp"), now);
        match self {
            Printer::Node => node_row(object, now),
            Printer::Pod => pod_row(object, now),
            Printer::Namespace => Row::new(vec![
                json!(name),
                json!(text(object, "/status/phase")),
                json!(age),
            ]),
            Printer::ConfigMap => Row::new(vec![
                json!(name),
                json!(entries(object, "/data") + entries(object, "/binaryData")),
                json!(age),
            ]),
            Printer::Secret => Row::new(vec![
                json!(name),
                json!(text(object, "/type")),
                json!(entries(object, "/data")),
                json!(age),
            ]),
            Printer::ServiceAccount => Row::new(vec![
                json!(name),
                json!(list(object, "/secrets").len()),
                json!(age),
            ]),
            Printer::Service => service_row(object, now),
            Printer::Event => event_row(object, now),
            Printer::DaemonSet => {
                let (names, images) = container_cells(object);
                Row::new(vec![
                    json!(name),
                    json!(integer(object, "/status/desiredNumberScheduled")),
                    json!(integer(object, "/status/currentNumberScheduled")),
                    json!(integer(object, "/status/numberReady")),
                    json!(integer(object, "/status/updatedNumberScheduled")),
                    json!(integer(object, "/status/numberAvailable")),
                    json!(format_labels(object.at("/spec/template/spec/nodeSelector"))),
                    json!(age),
                    json!(names),
                    json!(images),
                    json!(format_label_selector(object.at("/spec/selector"))),
                ])
            }
            Printer::Deployment => {
                let (names, images) = container_cells(object);
                // `selector.String()`: empty, not `<none>`, when it selects everything.
                let selector = match LabelSelector::from_object(object.at("/spec/selector")) {
                    Ok(selector) => selector.map(|s| s.to_string()).unwrap_or_default(),
                    Err(_) => "<invalid>".to_string(),
                };
                Row::new(vec![
                    json!(name),
                    json!(format!(
                        "{}/{}",
                        integer(object, "/status/readyReplicas"),
                        integer(object, "/spec/replicas")
                    )),
                    json!(integer(object, "/status/updatedReplicas")),
                    json!(integer(object, "/status/availableReplicas")),
                    json!(age),
                    json!(names),
                    json!(images),
                    json!(selector),
                ])
            }
            Printer::ReplicaSet | Printer::ReplicationController => {
                let (names, images) = container_cells(object);
                let selector = if self == Printer::ReplicaSet {
                    format_label_selector(object.at("/spec/selector"))
                } else {
                    format_labels(object.at("/spec/selector"))
                };
                Row::new(vec![
                    json!(name),
                    json!(integer(object, "/spec/replicas")),
                    json!(integer(object, "/status/replicas")),
                    json!(integer(object, "/status/readyReplicas")),
                    json!(age),
                    json!(names),
                    json!(images),
                    json!(selector),
                ])
            }
            Printer::StatefulSet => {
                // Defaulting sets spec.replicas to 1 when a StatefulSet omits it.
                let desired = object
                    .at("/spec/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                let ready = integer(object, "/status/readyReplicas");
                let (names, images) = container_cells(object);
                Row::new(vec![
                    json!(name),
                    json!(format!("{ready}/{desired}")),
                    json!(age),
                    json!(names),
                    json!(images),
                ])
            }
            Printer::ControllerRevision => Row::new(vec![
                json!(name),
                json!(controller_name(object)),
                json!(integer(object, "/revision")),
                json!(age),
            ]),
            Printer::PodDisruptionBudget => Row::new(vec![
                json!(name),
                json!(int_or_string(object.at("/spec/minAvailable"))),
                json!(int_or_string(object.at("/spec/maxUnavailable"))),
                json!(integer(object, "/status/disruptionsAllowed")),
                json!(age),
            ]),
            Printer::Lease => Row::new(vec![
                json!(name),
                json!(text(object, "/spec/holderIdentity")),
                json!(age),
            ]),
            Printer::CustomResourceDefinition => {
                // The default convertor prints the zero time for a missing timestamp.
                let created = timestamp(object, "/metadata/creationTimestamp").map_or_else(
                    || "0001-01-01T00:00:00Z".to_string(),
                    |t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                );
                Row::new(vec![json!(name), json!(created)])
            }
            Printer::Generic => Row::new(vec![json!(name), json!(age)]),
        }
    }
}

fn node_row(node: &Value, now: Timestamp) -> Row {
    // Upstream indexes conditions by type, so the last Ready condition wins.
    let ready = list(node, "/status/conditions")
        .iter()
        .rev()
        .find(|c| text(c, "/type") == "Ready");
    let mut status = vec![match ready {
        Some(condition) if text(condition, "/status") == "True" => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }];
    if flag(node, "/spec/unschedulable") {
        status.push("SchedulingDisabled");
    }
    let mut roles = BTreeSet::new();
    if let Some(Value::Object(labels)) = node.at("/metadata/labels") {
        for (key, value) in labels {
            if let Some(role) = key.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.insert(role);
                }
            } else if key == "kubernetes.io/role" {
                roles.extend(value.as_str().filter(|v| !v.is_empty()));
            }
        }
    }
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    };
    let address = |kind: &str| {
        list(node, "/status/addresses")
            .iter()
            .find(|a| text(a, "/type") == kind)
            .map_or("<none>", |a| text(a, "/address"))
    };
    let info = |field: &str| {
        or_placeholder(
            text(node, &format!("/status/nodeInfo/{field}")),
            "<unknown>",
        )
    };
    Row::new(vec![
        json!(text(node, "/metadata/name")),
        json!(status.join(",")),
        json!(roles),
        json!(since(timestamp(node, "/metadata/creationTimestamp"), now)),
        json!(text(node, "/status/nodeInfo/kubeletVersion")),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(info("osImage")),
        json!(info("kernelVersion")),
        json!(info("containerRuntimeVersion")),
    ])
}

/// The READY, STATUS and RESTARTS logic of upstream `printPod` (Kubernetes 1.35).
fn pod_row(pod: &Value, now: Timestamp) -> Row {
    let init_containers = list(pod, "/spec/initContainers");
    let is_sidecar = |name: &str| {
        init_containers
            .iter()
            .any(|c| text(c, "/name") == name && text(c, "/restartPolicy") == "Always")
    };
    let total = list(pod, "/spec/containers").len()
        + init_containers
            .iter()
            .filter(|c| text(c, "/restartPolicy") == "Always")
            .count();
    let mut ready = 0;
    let mut restarts = 0;
    let mut sidecar_restarts = 0;
    let mut last_restart = None;
    let mut last_sidecar_restart = None;

    let phase = text(pod, "/status/phase");
    let status_reason = text(pod, "/status/reason");
    let mut reason = or_placeholder(status_reason, phase).to_string();
    let conditions = list(pod, "/status/conditions");
    if conditions
        .iter()
        .any(|c| text(c, "/type") == "PodScheduled" && text(c, "/reason") == "SchedulingGated")
    {
        reason = "SchedulingGated".to_string();
    }

    let mut initializing = false;
    for (index, status) in list(pod, "/status/initContainerStatuses")
        .iter()
        .enumerate()
    {
        let count = integer(status, "/restartCount");
        let finished = timestamp(status, "/lastState/terminated/finishedAt");
        restarts += count;
        keep_latest(&mut last_restart, finished);
        let sidecar = is_sidecar(text(status, "/name"));
        if sidecar {
            sidecar_restarts += count;
            keep_latest(&mut last_sidecar_restart, finished);
        }
        let terminated = state(status, "terminated");
        if terminated.is_some_and(|t| integer(t, "/exitCode") == 0) {
            continue;
        }
        if sidecar && flag(status, "/started") {
            if flag(status, "/ready") {
                ready += 1;
            }
            continue;
        }
        let waiting_reason = state(status, "waiting").map_or("", |w| text(w, "/reason"));
        reason = if let Some(terminated) = terminated {
            match text(terminated, "/reason") {
                "" => format!("Init:{}", exit_description(terminated)),
                terminated_reason => format!("Init:{terminated_reason}"),
            }
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            format!("Init:{waiting_reason}")
        } else {
            format!("Init:{index}/{}", init_containers.len())
        };
        initializing = true;
        break;
    }

    if !initializing || condition_true(conditions, "Initialized") {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        let mut error_reason = None;
        for status in list(pod, "/status/containerStatuses").iter().rev() {
            restarts += integer(status, "/restartCount");
            keep_latest(
                &mut last_restart,
                timestamp(status, "/lastState/terminated/finishedAt"),
            );
            let waiting_reason = state(status, "waiting").map_or("", |w| text(w, "/reason"));
            if !waiting_reason.is_empty() {
                reason = waiting_reason.to_string();
            } else if let Some(terminated) = state(status, "terminated") {
                reason = match text(terminated, "/reason") {
                    "" => exit_description(terminated),
                    terminated_reason => terminated_reason.to_string(),
                };
                if integer(terminated, "/exitCode") != 0 {
                    error_reason = Some(reason.clone());
                }
            } else if flag(status, "/ready") && state(status, "running").is_some() {
                has_running = true;
                ready += 1;
            }
        }
        // A pod with a still-running container is not shown as Completed.
        if reason == "Completed" {
            if has_running && condition_true(conditions, "Ready") {
                reason = "Running".to_string();
            } else if let Some(error_reason) = error_reason {
                reason = error_reason;
            } else if has_running {
                reason = "NotReady".to_string();
            }
        }
    }

    let deleting = pod
        .at("/metadata/deletionTimestamp")
        .is_some_and(|d| !d.is_null());
    if deleting && status_reason == "NodeLost" {
        reason = "Unknown".to_string();
    } else if deleting && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".to_string();
    }

    let restarts = match last_restart {
        Some(last) if restarts != 0 => format!("{restarts} ({} ago)", since(Some(last), now)),
        _ => restarts.to_string(),
    };

    // Upstream reads podIPs[0]; podIP mirrors it and is all some writers set.
    let ip = [text(pod, "/status/podIPs/0/ip"), text(pod, "/status/podIP")]
        .into_iter()
        .find(|ip| !ip.is_empty())
        .unwrap_or("<none>");
    let gates = list(pod, "/spec/readinessGates");
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let passing = gates
            .iter()
            .filter(|gate| {
                let wanted = text(gate, "/conditionType");
                conditions
                    .iter()
                    .find(|c| text(c, "/type") == wanted)
                    .is_some_and(|c| text(c, "/status") == "True")
            })
            .count();
        format!("{passing}/{}", gates.len())
    };

    let mut row = Row::new(vec![
        json!(text(pod, "/metadata/name")),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts),
        json!(since(timestamp(pod, "/metadata/creationTimestamp"), now)),
        json!(ip),
        json!(or_placeholder(text(pod, "/spec/nodeName"), "<none>")),
        json!(or_placeholder(
            text(pod, "/status/nominatedNodeName"),
            "<none>"
        )),
        json!(readiness_gates),
    ]);
    row.conditions = match phase {
        "Succeeded" => Some(completed_condition(
            "Succeeded",
            "The pod has completed successfully.",
        )),
        "Failed" => Some(completed_condition("Failed", "The pod failed.")),
        _ => None,
    };
    row
}

fn completed_condition(reason: &str, message: &str) -> Value {
    json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}])
}

/// `Signal:N` or `ExitCode:N` for a terminated state without a reason.
fn exit_description(terminated: &Value) -> String {
    match integer(terminated, "/signal") {
        0 => format!("ExitCode:{}", integer(terminated, "/exitCode")),
        signal => format!("Signal:{signal}"),
    }
}

/// A container state (`waiting`, `running`, `terminated`) when present.
fn state<'a>(status: &'a Value, which: &str) -> Option<&'a Value> {
    status
        .at(&format!("/state/{which}"))
        .filter(|s| s.is_object())
}

/// Whether the first condition of `kind` has status `True`.
fn condition_true(conditions: &[Value], kind: &str) -> bool {
    conditions
        .iter()
        .find(|c| text(c, "/type") == kind)
        .is_some_and(|c| text(c, "/status") == "True")
}

fn keep_latest(latest: &mut Option<Timestamp>, candidate: Option<Timestamp>) {
    if candidate > *latest {
        *latest = candidate;
    }
}

fn service_row(service: &Value, now: Timestamp) -> Row {
    // Defaulting gives every stored Service a type, clusterIPs and port protocols.
    let kind = or_placeholder(text(service, "/spec/type"), "ClusterIP");
    let cluster_ip = [
        text(service, "/spec/clusterIPs/0"),
        text(service, "/spec/clusterIP"),
    ]
    .into_iter()
    .find(|ip| !ip.is_empty())
    .unwrap_or("<none>");
    let external_ips: Vec<&str> = list(service, "/spec/externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let external_ip = match kind {
        "ClusterIP" | "NodePort" if external_ips.is_empty() => "<none>".to_string(),
        "ClusterIP" | "NodePort" => external_ips.join(","),
        "LoadBalancer" => {
            let ingress: BTreeSet<&str> = list(service, "/status/loadBalancer/ingress")
                .iter()
                .map(|i| or_placeholder(text(i, "/ip"), text(i, "/hostname")))
                .filter(|a| !a.is_empty())
                .collect();
            let mut addresses: Vec<&str> = ingress.into_iter().collect();
            if addresses.is_empty() && external_ips.is_empty() {
                "<pending>".to_string()
            } else {
                addresses.extend(external_ips);
                addresses.join(",")
            }
        }
        "ExternalName" => text(service, "/spec/externalName").to_string(),
        _ => "<unknown>".to_string(),
    };
    let ports: Vec<String> = list(service, "/spec/ports")
        .iter()
        .map(|p| {
            let port = integer(p, "/port");
            let protocol = or_placeholder(text(p, "/protocol"), "TCP");
            match integer(p, "/nodePort") {
                node_port if node_port > 0 => format!("{port}:{node_port}/{protocol}"),
                _ => format!("{port}/{protocol}"),
            }
        })
        .collect();
    let ports = if ports.is_empty() {
        "<none>".to_string()
    } else {
        ports.join(",")
    };
    Row::new(vec![
        json!(text(service, "/metadata/name")),
        json!(kind),
        json!(cluster_ip),
        json!(external_ip),
        json!(ports),
        json!(since(
            timestamp(service, "/metadata/creationTimestamp"),
            now
        )),
        json!(format_labels(service.at("/spec/selector"))),
    ])
}

/// Core v1 Events; events.k8s.io/v1 field names are read as fallbacks, since both
/// versions are served as `events`.
fn event_row(event: &Value, now: Timestamp) -> Row {
    let either = |core: &str, events_v1: &str| -> Option<&Value> {
        event
            .get(core)
            .filter(|v| !v.is_null())
            .or_else(|| event.get(events_v1).filter(|v| !v.is_null()))
    };
    let field = |core: &str, events_v1: &str| either(core, events_v1).and_then(Value::as_str);
    let time = |core: &str, events_v1: &str| {
        field(core, events_v1).and_then(|t| t.parse::<Timestamp>().ok())
    };
    let first_seen = match time("firstTimestamp", "deprecatedFirstTimestamp") {
        Some(first) => since(Some(first), now),
        None => since(timestamp(event, "/eventTime"), now),
    };
    let mut last_seen = match time("lastTimestamp", "deprecatedLastTimestamp") {
        Some(last) => since(Some(last), now),
        None => first_seen.clone(),
    };
    let mut count = either("count", "deprecatedCount")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if event.get("series").is_some_and(Value::is_object) {
        last_seen = since(timestamp(event, "/series/lastObservedTime"), now);
        count = integer(event, "/series/count");
    } else if count == 0 {
        // Singleton events of the new API carry no count.
        count = 1;
    }
    let involved = either("involvedObject", "regarding").unwrap_or(&Value::Null);
    let kind = text(involved, "/kind").to_lowercase();
    let target = match text(involved, "/name") {
        "" => kind,
        name => format!("{kind}/{name}"),
    };
    let source = either("source", "deprecatedSource").unwrap_or(&Value::Null);
    let component = or_placeholder(
        text(source, "/component"),
        text(event, "/reportingComponent"),
    );
    let component = or_placeholder(component, text(event, "/reportingController"));
    let instance = or_placeholder(text(source, "/host"), text(event, "/reportingInstance"));
    let source = if instance.is_empty() {
        component.to_string()
    } else {
        format!("{component}, {instance}")
    };
    Row::new(vec![
        json!(last_seen),
        json!(text(event, "/type")),
        json!(text(event, "/reason")),
        json!(target),
        json!(text(involved, "/fieldPath")),
        json!(source),
        json!(field("message", "note").unwrap_or("").trim()),
        json!(first_seen),
        json!(count),
        json!(text(event, "/metadata/name")),
    ])
}

/// `kind.group/name` of the controlling owner, as `formatResourceName` prints it.
fn controller_name(object: &Value) -> String {
    let Some(owner) = list(object, "/metadata/ownerReferences")
        .iter()
        .find(|o| flag(o, "/controller"))
    else {
        return "<none>".to_string();
    };
    let kind = text(owner, "/kind");
    let group = text(owner, "/apiVersion")
        .split_once('/')
        .map_or("", |(group, _)| group);
    let name = text(owner, "/name");
    match (kind, group) {
        ("", "") => name.to_string(),
        (kind, "") => format!("{}/{name}", kind.to_lowercase()),
        (kind, group) => format!("{}/{name}", format!("{kind}.{group}").to_lowercase()),
    }
}

/// An `IntOrString` as upstream prints it, `N/A` when unset.
fn int_or_string(value: Option<&Value>) -> String {
    match value {
        Some(Value::Number(number)) => number.to_string(),
        Some(Value::String(text)) => text.clone(),
        _ => "N/A".to_string(),
    }
}

/// Container names and images of the pod template, each comma-joined.
fn container_cells(object: &Value) -> (String, String) {
    let containers = list(object, "/spec/template/spec/containers");
    let join = |field: &str| {
        containers
            .iter()
            .map(|c| text(c, field))
            .collect::<Vec<_>>()
            .join(",")
    };
    (join("/name"), join("/image"))
}

/// `labels.FormatLabels`: sorted `k=v` pairs, `<none>` when empty.
fn format_labels(labels: Option<&Value>) -> String {
    let Some(Value::Object(labels)) = labels else {
        return "<none>".to_string();
    };
    if labels.is_empty() {
        return "<none>".to_string();
    }
    let mut pairs: Vec<String> = labels
        .iter()
        .map(|(key, value)| format!("{key}={}", value.as_str().unwrap_or("")))
        .collect();
    pairs.sort();
    pairs.join(",")
}

/// `metav1.FormatLabelSelector`: the canonical selector string, `<none>` when it
/// selects everything or nothing, `<error>` when invalid.
fn format_label_selector(selector: Option<&Value>) -> String {
    match LabelSelector::from_object(selector) {
        Err(_) => "<error>".to_string(),
        Ok(None) => "<none>".to_string(),
        Ok(Some(selector)) if selector.is_empty() => "<none>".to_string(),
        Ok(Some(selector)) => selector.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::{ago, cells, column_names, table};

    #[test]
    fn builtin_column_names() {
        let cases: [(&str, &[(&str, i64)]); 10] = [
            (
                "nodes",
                &[
                    ("Name", 0),
                    ("Status", 0),
                    ("Roles", 0),
                    ("Age", 0),
                    ("Version", 0),
                    ("Internal-IP", 1),
                    ("External-IP", 1),
                    ("OS-Image", 1),
                    ("Kernel-Version", 1),
                    ("Container-Runtime", 1),
                ],
            ),
            (
                "pods",
                &[
                    ("Name", 0),
                    ("Ready", 0),
                    ("Status", 0),
                    ("Restarts", 0),
                    ("Age", 0),
                    ("IP", 1),
                    ("Node", 1),
                    ("Nominated Node", 1),
                    ("Readiness Gates", 1),
                ],
            ),
            (
                "services",
                &[
                    ("Name", 0),
                    ("Type", 0),
                    ("Cluster-IP", 0),
                    ("External-IP", 0),
                    ("Port(s)", 0),
                    ("Age", 0),
                    ("Selector", 1),
                ],
            ),
            (
                "events",
                &[
                    ("Last Seen", 0),
                    ("Type", 0),
                    ("Reason", 0),
                    ("Object", 0),
                    ("Subobject", 1),
                    ("Source", 1),
                    ("Message", 0),
                    ("First Seen", 1),
                    ("Count", 1),
                    ("Name", 1),
                ],
            ),
            (
                "daemonsets",
                &[
                    ("Name", 0),
                    ("Desired", 0),
                    ("Current", 0),
                    ("Ready", 0),
                    ("Up-to-date", 0),
                    ("Available", 0),
                    ("Node Selector", 0),
                    ("Age", 0),
                    ("Containers", 1),
                    ("Images", 1),
                    ("Selector", 1),
                ],
            ),
            (
                "poddisruptionbudgets",
                &[
                    ("Name", 0),
                    ("Min Available", 0),
                    ("Max Unavailable", 0),
                    ("Allowed Disruptions", 0),
                    ("Age", 0),
                ],
            ),
            (
                "customresourcedefinitions",
                &[("Name", 0), ("Created At", 0)],
            ),
            (
                "deployments",
                &[
                    ("Name", 0),
                    ("Ready", 0),
                    ("Up-to-date", 0),
                    ("Available", 0),
                    ("Age", 0),
                    ("Containers", 1),
                    ("Images", 1),
                    ("Selector", 1),
                ],
            ),
            (
                "replicasets",
                &[
                    ("Name", 0),
                    ("Desired", 0),
                    ("Current", 0),
                    ("Ready", 0),
                    ("Age", 0),
                    ("Containers", 1),
                    ("Images", 1),
                    ("Selector", 1),
                ],
            ),
            ("horizontalpodautoscalers", &[("Name", 0), ("Age", 0)]),
        ];
        for (plural, expected) in cases {
            let expected: Vec<(String, i64)> =
                expected.iter().map(|(n, p)| (n.to_string(), *p)).collect();
            assert_eq!(column_names(&table(plural, &[])), expected, "{plural}");
        }
    }

    #[test]
    fn node_rows() {
        let node = |labels: Value, conditions: Value, unschedulable: bool| {
            json!({
                "metadata": {"name": "n1", "creationTimestamp": ago(3 * 86400 + 2 * 3600), "labels": labels},
                "spec": {"unschedulable": unschedulable},
                "status": {
                    "conditions": conditions,
                    "addresses": [
                        {"type": "Hostname", "address": "n1"},
                        {"type": "InternalIP", "address": "10.0.0.1"},
                    ],
                    "nodeInfo": {"kubeletVersion": "v1.33.1", "osImage": "Ubuntu 24.04", "containerRuntimeVersion": "containerd://2.0"},
                },
            })
        };
        let ready = json!([{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]);
        let not_ready = json!([{"type": "Ready", "status": "Unknown"}]);
        // (node, status, roles)
        let cases = [
            (node(json!({}), ready.clone(), false), "Ready", "<none>"),
            (
                node(json!({}), ready.clone(), true),
                "Ready,SchedulingDisabled",
                "<none>",
            ),
            (node(json!({}), not_ready, false), "NotReady", "<none>"),
            (
                node(json!({}), json!([]), true),
                "Unknown,SchedulingDisabled",
                "<none>",
            ),
            (
                node(
                    json!({"node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/": ""}),
                    ready.clone(),
                    false,
                ),
                "Ready",
                "control-plane,worker",
            ),
            (
                node(
                    json!({"kubernetes.io/role": "infra", "node-role.kubernetes.io/infra": ""}),
                    ready,
                    false,
                ),
                "Ready",
                "infra",
            ),
        ];
        for (node, status, roles) in cases {
            let cells = cells("nodes", node);
            assert_eq!(
                cells,
                vec![
                    json!("n1"),
                    json!(status),
                    json!(roles),
                    json!("3d2h"),
                    json!("v1.33.1"),
                    json!("10.0.0.1"),
                    json!("<none>"),
                    json!("Ubuntu 24.04"),
                    json!("<unknown>"),
                    json!("containerd://2.0"),
                ]
            );
        }
    }

    /// A pod with the given phase, container statuses and extra status fields.
    fn pod(phase: &str, container_statuses: Value, extra_status: Value) -> Value {
        let mut status = json!({"phase": phase, "containerStatuses": container_statuses});
        if let (Value::Object(status), Value::Object(extra)) = (&mut status, extra_status) {
            status.extend(extra);
        }
        json!({
            "metadata": {"name": "web", "creationTimestamp": ago(45 * 60)},
            "spec": {"containers": [{"name": "app"}, {"name": "log"}], "nodeName": "n1"},
            "status": status,
        })
    }

    #[test]
    fn pod_status_cells() {
        let running = json!({"running": {"startedAt": ago(600)}});
        let ready_conditions = json!({"conditions": [{"type": "Ready", "status": "True"}]});
        // (pod, READY, STATUS, RESTARTS)
        let cases = [
            (pod("Pending", json!([]), json!({})), "0/2", "Pending", "0"),
            (
                pod(
                    "Running",
                    json!([
                        {"name": "app", "ready": true, "restartCount": 0, "state": running},
                        {"name": "log", "ready": true, "restartCount": 0, "state": running},
                    ]),
                    ready_conditions.clone(),
                ),
                "2/2",
                "Running",
                "0",
            ),
            (
                pod(
                    "Running",
                    json!([
                        {"name": "app", "ready": false, "restartCount": 4,
                         "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                         "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(90)}}},
                        {"name": "log", "ready": true, "restartCount": 1, "state": running,
                         "lastState": {"terminated": {"exitCode": 137, "finishedAt": ago(3600)}}},
                    ]),
                    json!({}),
                ),
                "1/2",
                "CrashLoopBackOff",
                "5 (90s ago)",
            ),
            (
                pod(
                    "Succeeded",
                    json!([
                        {"name": "app", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                        {"name": "log", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    ]),
                    json!({}),
                ),
                "0/2",
                "Completed",
                "0",
            ),
            (
                pod(
                    "Failed",
                    json!([
                        {"name": "app", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}},
                        {"name": "log", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    ]),
                    json!({}),
                ),
                "0/2",
                "Error",
                "0",
            ),
            (
                pod(
                    "Running",
                    json!([
                        {"name": "app", "ready": true, "state": running},
                        {"name": "log", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    ]),
                    ready_conditions.clone(),
                ),
                "1/2",
                "Running",
                "0",
            ),
            (
                pod(
                    "Running",
                    json!([
                        {"name": "app", "ready": true, "state": running},
                        {"name": "log", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    ]),
                    json!({}),
                ),
                "1/2",
                "NotReady",
                "0",
            ),
            (
                pod(
                    "Running",
                    json!([
                        {"name": "app", "state": {"terminated": {"exitCode": 0, "signal": 9}}},
                        {"name": "log", "state": {"terminated": {"exitCode": 3}}},
                    ]),
                    json!({}),
                ),
                "0/2",
                "Signal:9",
                "0",
            ),
            (
                pod("Failed", json!([]), json!({"reason": "Evicted"})),
                "0/2",
                "Evicted",
                "0",
            ),
            (
                pod(
                    "Pending",
                    json!([]),
                    json!({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}),
                ),
                "0/2",
                "SchedulingGated",
                "0",
            ),
        ];
        for (pod, ready, status, restarts) in cases {
            let cells = cells("pods", pod.clone());
            assert_eq!(
                cells[..5],
                [
                    json!("web"),
                    json!(ready),
                    json!(status),
                    json!(restarts),
                    json!("45m")
                ],
                "{pod}"
            );
        }
    }

    #[test]
    fn pod_init_containers_and_deletion() {
        let with_init = |init_statuses: Value, extra: Value| {
            let mut pod = pod(
                "Pending",
                json!([]),
                json!({"initContainerStatuses": init_statuses}),
            );
            pod["spec"]["initContainers"] = json!([
                {"name": "setup"},
                {"name": "proxy", "restartPolicy": "Always"},
            ]);
            if let (Value::Object(pod), Value::Object(extra)) = (&mut pod, extra) {
                pod.extend(extra);
            }
            pod
        };
        let cases = [
            (
                with_init(
                    json!([{"name": "setup", "state": {"running": {}}}]),
                    json!({}),
                ),
                "0/3",
                "Init:0/2",
            ),
            (
                with_init(
                    json!([{"name": "setup", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]),
                    json!({}),
                ),
                "0/3",
                "Init:ImagePullBackOff",
            ),
            (
                with_init(
                    json!([{"name": "setup", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]),
                    json!({}),
                ),
                "0/3",
                "Init:Error",
            ),
            (
                with_init(
                    json!([{"name": "setup", "state": {"terminated": {"exitCode": 7}}}]),
                    json!({}),
                ),
                "0/3",
                "Init:ExitCode:7",
            ),
            (
                with_init(
                    json!([
                        {"name": "setup", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                        {"name": "proxy", "started": true, "ready": true, "state": {"running": {}}},
                    ]),
                    json!({}),
                ),
                "1/3",
                "Pending",
            ),
            (
                with_init(
                    json!([]),
                    json!({"metadata": {"name": "web", "creationTimestamp": ago(45 * 60), "deletionTimestamp": ago(5)}}),
                ),
                "0/3",
                "Terminating",
            ),
        ];
        for (pod, ready, status) in cases {
            let cells = cells("pods", pod.clone());
            assert_eq!(cells[1..3], [json!(ready), json!(status)], "{pod}");
        }
        let mut lost = pod("Running", json!([]), json!({"reason": "NodeLost"}));
        lost["metadata"]["deletionTimestamp"] = json!(ago(5));
        assert_eq!(cells("pods", lost)[2], json!("Unknown"));
        let mut finished = pod("Succeeded", json!([]), json!({}));
        finished["metadata"]["deletionTimestamp"] = json!(ago(5));
        assert_eq!(cells("pods", finished)[2], json!("Succeeded"));
    }

    #[test]
    fn pod_wide_cells_and_row_conditions() {
        let mut scheduled = pod(
            "Running",
            json!([]),
            json!({
                "podIPs": [{"ip": "10.1.0.7"}, {"ip": "fd00::7"}],
                "nominatedNodeName": "n2",
                "conditions": [{"type": "example.com/gate", "status": "True"}],
            }),
        );
        scheduled["spec"]["readinessGates"] =
            json!([{"conditionType": "example.com/gate"}, {"conditionType": "example.com/other"}]);
        assert_eq!(
            cells("pods", scheduled)[5..],
            [json!("10.1.0.7"), json!("n1"), json!("n2"), json!("1/2")]
        );
        let mut unscheduled = pod("Pending", json!([]), json!({}));
        unscheduled["spec"]
            .as_object_mut()
            .expect("spec")
            .remove("nodeName");
        assert_eq!(
            cells("pods", unscheduled)[5..],
            [
                json!("<none>"),
                json!("<none>"),
                json!("<none>"),
                json!("<none>")
            ]
        );
        let only_pod_ip = pod("Running", json!([]), json!({"podIP": "10.1.0.8"}));
        assert_eq!(cells("pods", only_pod_ip)[5], json!("10.1.0.8"));

        let table = table(
            "pods",
            &[
                pod("Succeeded", json!([]), json!({})),
                pod("Running", json!([]), json!({})),
            ],
        );
        assert_eq!(
            table["rows"][0]["conditions"],
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}])
        );
        assert!(table["rows"][1].get("conditions").is_none());
    }

    #[test]
    fn simple_builtin_rows() {
        let meta = json!({"name": "x", "creationTimestamp": ago(5 * 3600)});
        let cases = [
            (
                "namespaces",
                json!({"metadata": meta, "status": {"phase": "Active"}}),
                json!(["x", "Active", "5h"]),
            ),
            (
                "configmaps",
                json!({"metadata": meta, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}),
                json!(["x", 3, "5h"]),
            ),
            (
                "secrets",
                json!({"metadata": meta, "type": "Opaque", "data": {"a": "MQ=="}}),
                json!(["x", "Opaque", 1, "5h"]),
            ),
            (
                "serviceaccounts",
                json!({"metadata": meta}),
                json!(["x", 0, "5h"]),
            ),
            (
                "statefulsets",
                json!({"metadata": meta, "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "img:1"}, {"name": "b", "image": "img:2"}]}}}, "status": {"readyReplicas": 1}}),
                json!(["x", "1/1", "5h", "a,b", "img:1,img:2"]),
            ),
            (
                "controllerrevisions",
                json!({"metadata": {"name": "x", "creationTimestamp": ago(5 * 3600), "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": "other"},
                    {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "controller": true}]},
                    "revision": 3}),
                json!(["x", "daemonset.apps/agent", 3, "5h"]),
            ),
            (
                "controllerrevisions",
                json!({"metadata": meta, "revision": 1}),
                json!(["x", "<none>", 1, "5h"]),
            ),
            (
                "poddisruptionbudgets",
                json!({"metadata": meta, "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 2}}),
                json!(["x", "50%", "N/A", 2, "5h"]),
            ),
            (
                "poddisruptionbudgets",
                json!({"metadata": meta, "spec": {"maxUnavailable": 1}}),
                json!(["x", "N/A", "1", 0, "5h"]),
            ),
            (
                "leases",
                json!({"metadata": meta, "spec": {"holderIdentity": "capstan-0"}}),
                json!(["x", "capstan-0", "5h"]),
            ),
            (
                "customresourcedefinitions",
                json!({"metadata": {"name": "x", "creationTimestamp": "2024-05-01T08:30:00Z"}}),
                json!(["x", "2024-05-01T08:30:00Z"]),
            ),
            (
                "horizontalpodautoscalers",
                json!({"metadata": meta}),
                json!(["x", "5h"]),
            ),
            (
                "widgets",
                json!({"metadata": {"name": "x"}}),
                json!(["x", "<unknown>"]),
            ),
        ];
        for (plural, object, expected) in cases {
            assert_eq!(Value::Array(cells(plural, object)), expected, "{plural}");
        }
    }

    #[test]
    fn daemon_set_row() {
        let daemon_set = json!({
            "metadata": {"name": "agent", "creationTimestamp": ago(600)},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}]},
                "template": {"spec": {"nodeSelector": {"zone": "z1", "disk": "ssd"}, "containers": [{"name": "agent", "image": "agent:1"}]}},
            },
            "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2, "updatedNumberScheduled": 3, "numberAvailable": 2},
        });
        assert_eq!(
            Value::Array(cells("daemonsets", daemon_set)),
            json!([
                "agent",
                3,
                3,
                2,
                3,
                2,
                "disk=ssd,zone=z1",
                "10m",
                "agent",
                "agent:1",
                "app=agent,tier in (a,b)"
            ])
        );
        let bare = json!({"metadata": {"name": "bare"}, "spec": {"selector": {}}});
        let cells = cells("daemonsets", bare);
        assert_eq!(cells[6], json!("<none>"));
        assert_eq!(cells[10], json!("<none>"));
    }

    /// Deployments, ReplicaSets and ReplicationControllers, as upstream's printers show them.
    #[test]
    fn replicated_workload_rows() {
        let workload = |spec: Value, status: Value| json!({"metadata": {"name": "web", "creationTimestamp": ago(600)}, "spec": spec, "status": status});
        let template = json!({"spec": {"containers": [{"name": "app", "image": "web:1"}, {"name": "log", "image": "log:2"}]}});
        #[rustfmt::skip]
        let cases: Vec<(&str, Value, Value)> = vec![
            ("deployments",
             workload(json!({"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template}),
                      json!({"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 1})),
             json!(["web", "2/3", 3, 1, "10m", "app,log", "web:1,log:2", "app=web"])),
            ("deployments",
             workload(json!({"replicas": 1, "selector": {}}), json!({})),
             json!(["web", "0/1", 0, 0, "10m", "", "", ""])),
            ("replicasets",
             workload(json!({"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template}),
                      json!({"replicas": 2, "readyReplicas": 1})),
             json!(["web", 3, 2, 1, "10m", "app,log", "web:1,log:2", "app=web"])),
            ("replicasets",
             workload(json!({"replicas": 1, "selector": {}}), json!({})),
             json!(["web", 1, 0, 0, "10m", "", "", "<none>"])),
            ("replicationcontrollers",
             workload(json!({"replicas": 2, "selector": {"b": "2", "a": "1"}, "template": template}),
                      json!({"replicas": 2, "readyReplicas": 2})),
             json!(["web", 2, 2, 2, "10m", "app,log", "web:1,log:2", "a=1,b=2"])),
        ];
        for (plural, object, expected) in cases {
            assert_eq!(Value::Array(cells(plural, object)), expected, "{plural}");
        }
    }

    #[test]
    fn service_rows() {
        let service = |spec: Value, status: Value| json!({"metadata": {"name": "svc", "creationTimestamp": ago(120)}, "spec": spec, "status": status});
        // (service, TYPE, CLUSTER-IP, EXTERNAL-IP, PORT(S), SELECTOR)
        let cases = [
            (
                service(
                    json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "selector": {"app": "dns"},
                           "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}),
                    json!({}),
                ),
                "ClusterIP",
                "10.96.0.10",
                "<none>",
                "53/UDP,53/TCP",
                "app=dns",
            ),
            (
                service(
                    json!({"clusterIP": "10.96.0.11", "ports": [{"port": 80}]}),
                    json!({}),
                ),
                "ClusterIP",
                "10.96.0.11",
                "<none>",
                "80/TCP",
                "<none>",
            ),
            (
                service(
                    json!({"type": "NodePort", "clusterIPs": ["10.96.0.12"], "externalIPs": ["1.2.3.4"],
                           "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}),
                    json!({}),
                ),
                "NodePort",
                "10.96.0.12",
                "1.2.3.4",
                "80:30080/TCP",
                "<none>",
            ),
            (
                service(
                    json!({"type": "LoadBalancer", "clusterIPs": ["10.96.0.13"]}),
                    json!({}),
                ),
                "LoadBalancer",
                "10.96.0.13",
                "<pending>",
                "<none>",
                "<none>",
            ),
            (
                service(
                    json!({"type": "LoadBalancer", "clusterIPs": ["10.96.0.13"], "externalIPs": ["9.9.9.9"]}),
                    json!({"loadBalancer": {"ingress": [{"ip": "5.5.5.5"}, {"hostname": "lb.example.com"}, {"ip": "5.5.5.5"}]}}),
                ),
                "LoadBalancer",
                "10.96.0.13",
                "5.5.5.5,lb.example.com,9.9.9.9",
                "<none>",
                "<none>",
            ),
            (
                service(
                    json!({"type": "ExternalName", "externalName": "db.example.com"}),
                    json!({}),
                ),
                "ExternalName",
                "<none>",
                "db.example.com",
                "<none>",
                "<none>",
            ),
            (
                service(
                    json!({"clusterIP": "None", "clusterIPs": ["None"]}),
                    json!({}),
                ),
                "ClusterIP",
                "None",
                "<none>",
                "<none>",
                "<none>",
            ),
        ];
        for (service, kind, cluster_ip, external_ip, ports, selector) in cases {
            assert_eq!(
                Value::Array(cells("services", service)),
                json!(["svc", kind, cluster_ip, external_ip, ports, "2m", selector])
            );
        }
    }

    #[test]
    fn event_rows() {
        let core = json!({
            "metadata": {"name": "web.17c", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{app}"},
            "reason": "Pulled", "type": "Normal", "message": "  Pulled image  \n",
            "source": {"component": "kubelet", "host": "n1"},
            "firstTimestamp": ago(3600), "lastTimestamp": ago(60), "count": 4,
        });
        assert_eq!(
            Value::Array(cells("events", core)),
            json!([
                "60s",
                "Normal",
                "Pulled",
                "pod/web",
                "spec.containers{app}",
                "kubelet, n1",
                "Pulled image",
                "60m",
                4,
                "web.17c"
            ])
        );
        let new_api = json!({
            "metadata": {"name": "n1.18a"},
            "involvedObject": {"kind": "Node"},
            "reason": "Drained", "type": "Warning", "message": "drained",
            "eventTime": ago(30), "reportingComponent": "capstan", "reportingInstance": "capstan-0",
        });
        assert_eq!(
            Value::Array(cells("events", new_api)),
            json!([
                "30s",
                "Warning",
                "Drained",
                "node",
                "",
                "capstan, capstan-0",
                "drained",
                "30s",
                1,
                "n1.18a"
            ])
        );
        let series = json!({
            "metadata": {"name": "s"}, "involvedObject": {"kind": "Pod", "name": "p"},
            "eventTime": ago(600), "series": {"count": 9, "lastObservedTime": ago(5)},
        });
        let cells_of_series = cells("events", series);
        assert_eq!(cells_of_series[0], json!("5s"));
        assert_eq!(cells_of_series[7], json!("10m"));
        assert_eq!(cells_of_series[8], json!(9));
        let events_v1 = json!({
            "metadata": {"name": "e"}, "regarding": {"kind": "Pod", "name": "p"}, "note": "hi",
            "reportingController": "ctl", "deprecatedFirstTimestamp": ago(120), "deprecatedCount": 2,
        });
        let cells_of_v1 = cells("events", events_v1);
        assert_eq!(
            cells_of_v1[..6],
            [
                json!("2m"),
                json!(""),
                json!(""),
                json!("pod/p"),
                json!(""),
                json!("ctl")
            ]
        );
        assert_eq!(cells_of_v1[6], json!("hi"));
        assert_eq!(cells_of_v1[8], json!(2));
    }
}
