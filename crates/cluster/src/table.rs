//! Server-side `meta.k8s.io/v1` Table output, which `kubectl get` asks for with
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`.
//!
//! Built-in resources get kube-apiserver's printer columns (`pkg/printers/internalversion`),
//! always generated wide as the server does: columns with priority 1 are only shown by
//! `kubectl get -o wide`. Custom resources get their CRD's `additionalPrinterColumns`
//! evaluated as apiextensions-apiserver does. Ages use `duration.HumanDuration`.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::str::FromStr;

use crate::pointer::Pointer;

use jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value, json};

use super::selector::LabelSelector;

/// Which printer builds the rows.
#[derive(Clone, Copy, Debug)]
pub enum TableKind<'a> {
    /// A built-in resource by its plural name, e.g. `"pods"`. Unknown plurals get
    /// `Name` and `Age` columns.
    Builtin(&'a str),
    /// A custom resource, with the served CRD version's `additionalPrinterColumns`
    /// (`{name, type, format, description, priority, jsonPath}`); an empty list gets
    /// upstream's default `Age` column.
    Custom {
        /// The CRD version's `additionalPrinterColumns`.
        printer_columns: &'a [Value],
    },
}

/// What each row carries in `object`, from the `includeObject` query parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IncludeObject {
    /// `object` is `null`.
    None,
    /// `object` is a `PartialObjectMetadata` (kubectl's default).
    #[default]
    Metadata,
    /// `object` is the whole object.
    Object,
}

/// An `includeObject` value other than `None`, `Metadata` or `Object`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unrecognized includeObject value: {0:?}")]
pub struct UnknownIncludeObject(pub String);

impl FromStr for IncludeObject {
    type Err = UnknownIncludeObject;

    /// Parses the `includeObject` query parameter; the empty string means `Metadata`.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "" | "Metadata" => Ok(IncludeObject::Metadata),
            "None" => Ok(IncludeObject::None),
            "Object" => Ok(IncludeObject::Object),
            other => Err(UnknownIncludeObject(other.to_string())),
        }
    }
}

/// Builds a `meta.k8s.io/v1` Table for `objects`, all of one resource.
///
/// `list_meta` becomes the table's `metadata` (`{resourceVersion, continue, ...}`; a
/// non-object gives `{}`), and `now` is the instant ages are measured from. Objects
/// missing fields print as upstream prints zero values; nothing fails.
pub fn to_table(
    resource: &TableKind<'_>,
    objects: &[&Value],
    include_object: IncludeObject,
    list_meta: Value,
    now: Timestamp,
) -> Value {
    let (columns, rows): (Vec<Value>, Vec<Row>) = match resource {
        TableKind::Builtin(plural) => {
            let printer = Printer::for_resource(plural);
            (
                printer.columns().iter().map(Column::definition).collect(),
                objects.iter().map(|o| printer.row(o, now)).collect(),
            )
        }
        TableKind::Custom { printer_columns } => {
            let columns = custom_columns(printer_columns);
            (
                std::iter::once(NAME.definition())
                    .chain(columns.iter().map(|c| c.definition.clone()))
                    .collect(),
                objects
                    .iter()
                    .map(|o| custom_row(&columns, o, now))
                    .collect(),
            )
        }
    };
    let rows: Vec<Value> = objects
        .iter()
        .zip(rows)
        .map(|(object, row)| row.into_json(object, include_object))
        .collect();
    let metadata = if list_meta.is_object() {
        list_meta
    } else {
        json!({})
    };
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// One table row before its `object` is attached.
struct Row {
    cells: Vec<Value>,
    /// Upstream marks finished pods with a `Completed` row condition.
    conditions: Option<Value>,
}

impl Row {
    fn new(cells: Vec<Value>) -> Self {
        Row {
            cells,
            conditions: None,
        }
    }

    fn into_json(self, object: &Value, include_object: IncludeObject) -> Value {
        let mut row = Map::new();
        row.insert("cells".to_string(), Value::Array(self.cells));
        if let Some(conditions) = self.conditions {
            row.insert("conditions".to_string(), conditions);
        }
        let object = match include_object {
            IncludeObject::None => Value::Null,
            IncludeObject::Metadata => json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
            }),
            IncludeObject::Object => object.clone(),
        };
        row.insert("object".to_string(), object);
        Value::Object(row)
    }
}

/// `metav1.ObjectMeta` swagger doc of `name`.
const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
/// `metav1.ObjectMeta` swagger doc of `creationTimestamp`.
const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const NODE_ADDRESSES_DESCRIPTION: &str = "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).";
const CONTAINERS_DESCRIPTION: &str = "Names of each container in the template.";
const IMAGES_DESCRIPTION: &str = "Images referenced by each container in the template.";

/// A column definition of a built-in printer.
#[derive(Clone, Copy)]
struct Column {
    name: &'static str,
    kind: &'static str,
    format: &'static str,
    description: &'static str,
    priority: i64,
}

impl Column {
    const fn new(name: &'static str, description: &'static str) -> Self {
        Column {
            name,
            kind: "string",
            format: "",
            description,
            priority: 0,
        }
    }

    const fn of_kind(self, kind: &'static str) -> Self {
        Column { kind, ..self }
    }

    /// Shown only with `-o wide`.
    const fn wide(self) -> Self {
        Column {
            priority: 1,
            ..self
        }
    }

    fn definition(&self) -> Value {
        column_definition(
            self.name,
            self.kind,
            self.format,
            self.description,
            self.priority,
        )
    }
}

fn column_definition(
    name: &str,
    kind: &str,
    format: &str,
    description: &str,
    priority: i64,
) -> Value {
    json!({
        "name": name,
        "type": kind,
        "format": format,
        "description": description,
        "priority": priority,
    })
}

const NAME: Column = Column {
    name: "Name",
    kind: "string",
    format: "name",
    description: NAME_DESCRIPTION,
    priority: 0,
};
const AGE: Column = Column::new("Age", AGE_DESCRIPTION);
const CONTAINERS: Column = Column::new("Containers", CONTAINERS_DESCRIPTION).wide();
const IMAGES: Column = Column::new("Images", IMAGES_DESCRIPTION).wide();

const NODE_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Status", "The status of the node"),
    Column::new("Roles", "The roles of the node"),
    AGE,
    Column::new("Version", "Kubelet Version reported by the node."),
    Column::new("Internal-IP", NODE_ADDRESSES_DESCRIPTION).wide(),
    Column::new("External-IP", NODE_ADDRESSES_DESCRIPTION).wide(),
    Column::new(
        "OS-Image",
        "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
    )
    .wide(),
    Column::new(
        "Kernel-Version",
        "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
    )
    .wide(),
    Column::new(
        "Container-Runtime",
        "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
    )
    .wide(),
];

const POD_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Ready",
        "The aggregate readiness state of this pod for accepting traffic.",
    ),
    Column::new(
        "Status",
        "The aggregate status of the containers in this pod.",
    ),
    Column::new(
        "Restarts",
        "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
    ),
    AGE,
    Column::new(
        "IP",
        "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
    )
    .wide(),
    Column::new(
        "Node",
        "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename",
    )
    .wide(),
    Column::new(
        "Nominated Node",
        "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.",
    )
    .wide(),
    Column::new(
        "Readiness Gates",
        "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates",
    )
    .wide(),
];

const NAMESPACE_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Status", "The status of the namespace"),
    AGE,
];

const CONFIG_MAP_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Data",
        "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.",
    ),
    AGE,
];

const SECRET_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Type",
        "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types",
    ),
    Column::new(
        "Data",
        "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4",
    ),
    AGE,
];

const SERVICE_ACCOUNT_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Secrets",
        "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use. Pods are only limited to this list if this service account has a \"kubernetes.io/enforce-mountable-secrets\" annotation set to \"true\". The \"kubernetes.io/enforce-mountable-secrets\" annotation is deprecated since v1.32. Prefer separate namespaces to isolate access to mounted secrets. This field should not be used to find auto-generated service account token secrets for use outside of pods. Instead, tokens can be requested directly using the TokenRequest API, or service account token secrets can be manually created. More info: https://kubernetes.io/docs/concepts/configuration/secret",
    ),
    AGE,
];

const SERVICE_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Type",
        "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer. \"ClusterIP\" allocates a cluster-internal IP address for load-balancing to endpoints. Endpoints are determined by the selector or if that is not specified, by manual construction of an Endpoints object or EndpointSlice objects. If clusterIP is \"None\", no virtual IP is allocated and the endpoints are published as a set of endpoints rather than a virtual IP. \"NodePort\" builds on ClusterIP and allocates a port on every node which routes to the same endpoints as the clusterIP. \"LoadBalancer\" builds on NodePort and creates an external load-balancer (if supported in the current cloud) which routes to the same endpoints as the clusterIP. \"ExternalName\" aliases this service to the specified externalName. Several other fields do not apply to ExternalName services. More info: https://kubernetes.io/docs/concepts/services-networking/service/#publishing-services-service-types",
    ),
    Column::new(
        "Cluster-IP",
        "clusterIP is the IP address of the service and is usually assigned randomly. If an address is specified manually, is in-range (as per system configuration), and is not in use, it will be allocated to the service; otherwise creation of the service will fail. This field may not be changed through updates unless the type field is also being changed to ExternalName (which requires this field to be blank) or the type field is being changed from ExternalName (in which case this field may optionally be specified, as describe above).  Valid values are \"None\", empty string (\"\"), or a valid IP address. Setting this to \"None\" makes a \"headless service\" (no virtual IP), which is useful when direct endpoint connections are preferred and proxying is not required.  Only applies to types ClusterIP, NodePort, and LoadBalancer. If this field is specified when creating a Service of type ExternalName, creation will fail. This field will be wiped when updating a Service to type ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
    ),
    Column::new(
        "External-IP",
        "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system.",
    ),
    Column::new(
        "Port(s)",
        "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
    ),
    AGE,
    Column::new(
        "Selector",
        "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/",
    )
    .wide(),
];

const EVENT_COLUMNS: &[Column] = &[
    Column::new(
        "Last Seen",
        "The time at which the most recent occurrence of this event was recorded.",
    ),
    Column::new(
        "Type",
        "Type of this event (Normal, Warning), new types could be added in the future",
    ),
    Column::new(
        "Reason",
        "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
    ),
    Column::new("Object", "The object that this event is about."),
    Column::new(
        "Subobject",
        "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2]. For example, if the object reference is to a container within a pod, this would take on a value like: \"spec.containers{name}\" (where \"name\" refers to the name of the container that triggered the event) or if no container name is specified \"spec.containers[2]\" (container with index 2 in this pod). This syntax is chosen only to have some well-defined way of referencing a part of an object.",
    )
    .wide(),
    Column::new(
        "Source",
        "The component reporting this event. Should be a short machine understandable string.",
    )
    .wide(),
    Column::new(
        "Message",
        "A human-readable description of the status of this operation.",
    ),
    Column::new(
        "First Seen",
        "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
    )
    .wide(),
    Column::new("Count", "The number of times this event has occurred.").wide(),
    NAME.wide(),
];

const DAEMON_SET_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Desired",
        "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
    )
    .of_kind("integer"),
    Column::new(
        "Current",
        "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
    )
    .of_kind("integer"),
    Column::new(
        "Ready",
        "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition.",
    )
    .of_kind("integer"),
    Column::new(
        "Up-to-date",
        "The total number of nodes that are running updated daemon pod",
    )
    .of_kind("integer"),
    Column::new(
        "Available",
        "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
    )
    .of_kind("integer"),
    Column::new(
        "Node Selector",
        "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    Column::new(
        "Selector",
        "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    )
    .wide(),
];

const STATEFUL_SET_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Ready", "Number of the pod with ready state"),
    AGE,
    CONTAINERS,
    IMAGES,
];

const CONTROLLER_REVISION_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Controller", "Controller of the object"),
    Column::new(
        "Revision",
        "Revision indicates the revision of the state represented by Data.",
    ),
    AGE,
];

const POD_DISRUPTION_BUDGET_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Min Available",
        "The minimum number of pods that must be available.",
    ),
    Column::new(
        "Max Unavailable",
        "The maximum number of pods that may be unavailable.",
    ),
    Column::new(
        "Allowed Disruptions",
        "Calculated number of pods that may be disrupted at this time.",
    )
    .of_kind("integer"),
    AGE,
];

const LEASE_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Holder",
        "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.",
    ),
    AGE,
];

/// CRDs are served by apiextensions-apiserver's default table convertor.
const CUSTOM_RESOURCE_DEFINITION_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Created At", AGE_DESCRIPTION).of_kind("date"),
];

const GENERIC_COLUMNS: &[Column] = &[NAME, AGE];

/// The built-in printers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Printer {
    Node,
    Pod,
    Namespace,
    ConfigMap,
    Secret,
    ServiceAccount,
    Service,
    Event,
    DaemonSet,
    StatefulSet,
    ControllerRevision,
    PodDisruptionBudget,
    Lease,
    CustomResourceDefinition,
    Generic,
}

impl Printer {
    fn for_resource(plural: &str) -> Self {
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
            "statefulsets" => Printer::StatefulSet,
            "controllerrevisions" => Printer::ControllerRevision,
            "poddisruptionbudgets" => Printer::PodDisruptionBudget,
            "leases" => Printer::Lease,
            "customresourcedefinitions" => Printer::CustomResourceDefinition,
            _ => Printer::Generic,
        }
    }

    fn columns(self) -> &'static [Column] {
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
            Printer::StatefulSet => STATEFUL_SET_COLUMNS,
            Printer::ControllerRevision => CONTROLLER_REVISION_COLUMNS,
            Printer::PodDisruptionBudget => POD_DISRUPTION_BUDGET_COLUMNS,
            Printer::Lease => LEASE_COLUMNS,
            Printer::CustomResourceDefinition => CUSTOM_RESOURCE_DEFINITION_COLUMNS,
            Printer::Generic => GENERIC_COLUMNS,
        }
    }

    fn row(self, object: &Value, now: Timestamp) -> Row {
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

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object.at(pointer).and_then(Value::as_str).unwrap_or("")
}

fn integer(object: &Value, pointer: &str) -> i64 {
    object.at(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn flag(object: &Value, pointer: &str) -> bool {
    object.at(pointer).and_then(Value::as_bool) == Some(true)
}

fn list<'a>(object: &'a Value, pointer: &str) -> &'a [Value] {
    object
        .at(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Number of keys of a map field, 0 when absent.
fn entries(object: &Value, pointer: &str) -> usize {
    object
        .at(pointer)
        .and_then(Value::as_object)
        .map_or(0, Map::len)
}

fn timestamp(object: &Value, pointer: &str) -> Option<Timestamp> {
    object
        .at(pointer)
        .and_then(Value::as_str)
        .and_then(|t| t.parse().ok())
}

fn or_placeholder<'a>(value: &'a str, placeholder: &'a str) -> &'a str {
    if value.is_empty() { placeholder } else { value }
}

/// Upstream `translateTimestampSince`: the age of `time`, `<unknown>` when unset.
fn since(time: Option<Timestamp>, now: Timestamp) -> String {
    time.map_or_else(
        || "<unknown>".to_string(),
        |time| human_duration(now.duration_since(time)),
    )
}

/// Upstream `duration.HumanDuration`: two or three significant figures, tolerating up
/// to two seconds of clock skew into the future.
fn human_duration(duration: SignedDuration) -> String {
    let seconds = duration.as_secs();
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    let days = hours / 24;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        };
    }
    format!("{years}y")
}

/// A CRD printer column ready to evaluate.
struct PrinterColumn {
    definition: Value,
    kind: String,
    /// `None` when the JSONPath is outside the supported subset; cells are then null.
    path: Option<JsonPath>,
}

/// The columns after `Name`, as apiextensions-apiserver derives them.
fn custom_columns(printer_columns: &[Value]) -> Vec<PrinterColumn> {
    if printer_columns.is_empty() {
        return vec![PrinterColumn {
            definition: column_definition("Age", "date", "", AGE_DESCRIPTION, 0),
            kind: "date".to_string(),
            path: JsonPath::parse(".metadata.creationTimestamp"),
        }];
    }
    printer_columns
        .iter()
        .map(|column| {
            let kind = text(column, "/type");
            let json_path = text(column, "/jsonPath");
            let default_description =
                format!("Custom resource definition column (in JSONPath format): {json_path}");
            PrinterColumn {
                definition: column_definition(
                    text(column, "/name"),
                    kind,
                    text(column, "/format"),
                    or_placeholder(text(column, "/description"), &default_description),
                    integer(column, "/priority"),
                ),
                kind: kind.to_string(),
                path: JsonPath::parse(json_path),
            }
        })
        .collect()
}

fn custom_row(columns: &[PrinterColumn], object: &Value, now: Timestamp) -> Row {
    let mut cells = vec![json!(text(object, "/metadata/name"))];
    cells.extend(columns.iter().map(|column| {
        column
            .path
            .as_ref()
            .and_then(|path| path.first(object))
            .map_or(Value::Null, |value| custom_cell(&column.kind, value, now))
    }));
    Row::new(cells)
}

/// Upstream `cellForJSONValue`, with `string` columns printed as jsonpath prints.
fn custom_cell(kind: &str, value: &Value, now: Timestamp) -> Value {
    match (kind, value) {
        (_, Value::Null) => Value::Null,
        ("string", Value::String(_)) => value.clone(),
        ("string", Value::Bool(_) | Value::Number(_)) => json!(value.to_string()),
        ("string", _) => json!(capstan_api::canonical::sorted_keys(value).to_string()),
        ("integer", Value::Number(number)) => number
            .as_i64()
            .map(Value::from)
            .or_else(|| number.as_u64().map(Value::from))
            // Truncates toward zero as Go's int64(float64) does.
            .or_else(|| number.as_f64().map(|f| Value::from(f.trunc() as i64)))
            .unwrap_or(Value::Null),
        ("number", Value::Number(number)) => match number.as_f64() {
            // Go encodes whole float64 values without a fraction.
            Some(f) if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 => {
                Value::from(f as i64)
            }
            _ => value.clone(),
        },
        ("boolean", Value::Bool(_)) => value.clone(),
        ("date", Value::String(date)) if date.is_empty() => json!("<unknown>"),
        ("date", Value::String(date)) => match date.parse::<Timestamp>() {
            Ok(time) => json!(since(Some(time), now)),
            Err(_) => json!("<invalid>"),
        },
        _ => Value::Null,
    }
}

/// The subset of Kubernetes JSONPath that CRD printer columns use: `.a.b`,
/// `.a[0]`, `.a[-1]`, `.a[*].b`, `.a['b.c']`, `.labels.x\.y` (escaped dots),
/// `.*`, and filters `[?(@.type=="Ready")]` with `==`, `!=`, `<`, `<=`, `>`, `>=` or
/// existence `[?(@.x)]`. Slices, unions and recursive descent are not supported.
#[derive(Clone, Debug, PartialEq)]
struct JsonPath {
    steps: Vec<Step>,
}

#[derive(Clone, Debug, PartialEq)]
enum Step {
    Field(String),
    Wildcard,
    Index(i64),
    Filter(Box<Filter>),
}

#[derive(Clone, Debug, PartialEq)]
struct Filter {
    /// Path relative to `@`, the element being tested.
    left: Vec<Step>,
    /// `None` tests that `left` exists.
    comparison: Option<(Comparison, Literal)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Comparison {
    Equal,
    NotEqual,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

#[derive(Clone, Debug, PartialEq)]
enum Literal {
    Text(String),
    Number(f64),
    Bool(bool),
}

impl JsonPath {
    /// Parses a printer column `jsonPath`; `None` when outside the supported subset.
    fn parse(path: &str) -> Option<Self> {
        let path = path.trim();
        let path = path.strip_prefix('$').unwrap_or(path);
        parse_steps(path).map(|steps| JsonPath { steps })
    }

    /// The first result, which is all upstream shows in a cell.
    fn first<'a>(&self, root: &'a Value) -> Option<&'a Value> {
        evaluate(&self.steps, root).into_iter().next()
    }
}

fn parse_steps(mut rest: &str) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            if after.starts_with('.') {
                return None;
            }
            let (name, remaining) = field_name(after);
            rest = remaining;
            match name.as_str() {
                // A bare `.` names the current value.
                "" => {}
                "*" => steps.push(Step::Wildcard),
                _ => steps.push(Step::Field(name)),
            }
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = closing_bracket(after)?;
            steps.push(bracket_step(after[..end].trim())?);
            rest = &after[end + 1..];
        } else {
            return None;
        }
    }
    Some(steps)
}

/// A dotted field name up to the next unescaped `.` or `[`; `\` escapes one character.
fn field_name(path: &str) -> (String, &str) {
    let mut name = String::new();
    let mut chars = path.char_indices();
    while let Some((index, c)) = chars.next() {
        match c {
            '\\' => {
                if let Some((_, escaped)) = chars.next() {
                    name.push(escaped);
                }
            }
            '.' | '[' => return (name, &path[index..]),
            _ => name.push(c),
        }
    }
    (name, "")
}

/// Index of the `]` closing a bracket, skipping quoted text and nested brackets.
fn closing_bracket(path: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote = None;
    for (index, c) in path.char_indices() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') if depth == 0 => return Some(index),
            (None, ']') => depth -= 1,
            _ => {}
        }
    }
    None
}

fn bracket_step(inner: &str) -> Option<Step> {
    if inner == "*" {
        return Some(Step::Wildcard);
    }
    if let Some(expression) = inner.strip_prefix("?(").and_then(|e| e.strip_suffix(')')) {
        return parse_filter(expression.trim()).map(|f| Step::Filter(Box::new(f)));
    }
    if let Some(quoted) = unquote(inner) {
        return Some(Step::Field(quoted.to_string()));
    }
    inner.parse().ok().map(Step::Index)
}

fn unquote(text: &str) -> Option<&str> {
    ['\'', '"'].into_iter().find_map(|q| {
        text.strip_prefix(q)
            .and_then(|t| t.strip_suffix(q))
            .filter(|t| !t.contains(q))
    })
}

fn parse_filter(expression: &str) -> Option<Filter> {
    const OPERATORS: [(&str, Comparison); 6] = [
        ("==", Comparison::Equal),
        ("!=", Comparison::NotEqual),
        ("<=", Comparison::LessOrEqual),
        (">=", Comparison::GreaterOrEqual),
        ("<", Comparison::Less),
        (">", Comparison::Greater),
    ];
    let mut quote = None;
    let mut split = None;
    for (index, c) in expression.char_indices() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, _) => {
                split = OPERATORS
                    .iter()
                    .find(|(symbol, _)| expression[index..].starts_with(symbol))
                    .map(|(symbol, comparison)| (index, symbol.len(), *comparison));
                if split.is_some() {
                    break;
                }
            }
        }
    }
    let left_text = split.map_or(expression, |(index, _, _)| &expression[..index]);
    let left = parse_steps(left_text.trim().strip_prefix('@')?)?;
    let comparison = match split {
        None => None,
        Some((index, length, comparison)) => Some((
            comparison,
            parse_literal(expression[index + length..].trim())?,
        )),
    };
    Some(Filter { left, comparison })
}

fn parse_literal(text: &str) -> Option<Literal> {
    if let Some(quoted) = unquote(text) {
        return Some(Literal::Text(quoted.to_string()));
    }
    match text {
        "true" => Some(Literal::Bool(true)),
        "false" => Some(Literal::Bool(false)),
        _ => text.parse().ok().map(Literal::Number),
    }
}

fn evaluate<'a>(steps: &[Step], root: &'a Value) -> Vec<&'a Value> {
    let mut current = vec![root];
    for step in steps {
        let mut next = Vec::new();
        for value in current {
            match (step, value) {
                (Step::Field(name), Value::Object(map)) => next.extend(map.get(name)),
                (Step::Wildcard, Value::Object(map)) => next.extend(map.values()),
                (Step::Wildcard, Value::Array(items)) => next.extend(items),
                (Step::Index(index), Value::Array(items)) => {
                    let index = if *index < 0 {
                        index.checked_add_unsigned(items.len() as u64)
                    } else {
                        Some(*index)
                    };
                    next.extend(
                        index
                            .and_then(|i| usize::try_from(i).ok())
                            .and_then(|i| items.get(i)),
                    );
                }
                (Step::Filter(filter), Value::Array(items)) => {
                    next.extend(items.iter().filter(|item| filter.accepts(item)));
                }
                _ => {}
            }
        }
        current = next;
    }
    current
}

impl Filter {
    fn accepts(&self, item: &Value) -> bool {
        let lefts = evaluate(&self.left, item);
        let Some((comparison, literal)) = &self.comparison else {
            return !lefts.is_empty();
        };
        // Upstream compares exactly one value; several are an error, here a non-match.
        let [left] = lefts.as_slice() else {
            return false;
        };
        let ordering = match (left, literal) {
            (Value::String(left), Literal::Text(right)) => Some(left.as_str().cmp(right)),
            (Value::Number(left), Literal::Number(right)) => {
                left.as_f64().and_then(|l| l.partial_cmp(right))
            }
            (Value::Bool(left), Literal::Bool(right)) => Some(left.cmp(right)),
            _ => None,
        };
        ordering.is_some_and(|ordering| match comparison {
            Comparison::Equal => ordering == Ordering::Equal,
            Comparison::NotEqual => ordering != Ordering::Equal,
            Comparison::Less => ordering == Ordering::Less,
            Comparison::LessOrEqual => ordering != Ordering::Greater,
            Comparison::Greater => ordering == Ordering::Greater,
            Comparison::GreaterOrEqual => ordering != Ordering::Less,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2024-05-10T12:00:00Z".parse().expect("valid timestamp")
    }

    /// `now` minus `seconds`, RFC 3339.
    fn ago(seconds: i64) -> String {
        (now() - SignedDuration::from_secs(seconds)).to_string()
    }

    fn table(plural: &str, objects: &[Value]) -> Value {
        let refs: Vec<&Value> = objects.iter().collect();
        to_table(
            &TableKind::Builtin(plural),
            &refs,
            IncludeObject::Metadata,
            json!({"resourceVersion": "7"}),
            now(),
        )
    }

    fn cells(plural: &str, object: Value) -> Vec<Value> {
        let table = table(plural, &[object]);
        table["rows"][0]["cells"].as_array().expect("cells").clone()
    }

    fn column_names(table: &Value) -> Vec<(String, i64)> {
        table["columnDefinitions"]
            .as_array()
            .expect("columns")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().expect("name").to_string(),
                    c["priority"].as_i64().expect("priority"),
                )
            })
            .collect()
    }

    #[test]
    fn human_duration_matches_upstream() {
        let cases = [
            (-3, "<invalid>"),
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (1, "1s"),
            (119, "119s"),
            (120, "2m"),
            (121, "2m1s"),
            (9 * 60 + 59, "9m59s"),
            (10 * 60, "10m"),
            (10 * 60 + 30, "10m"),
            (179 * 60 + 59, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (7 * 3600 + 59 * 60, "7h59m"),
            (8 * 3600, "8h"),
            (47 * 3600 + 59 * 60, "47h"),
            (48 * 3600, "2d"),
            (49 * 3600, "2d1h"),
            (7 * 86400 + 23 * 3600, "7d23h"),
            (8 * 86400, "8d"),
            (729 * 86400, "729d"),
            (730 * 86400, "2y"),
            (731 * 86400, "2y1d"),
            (8 * 365 * 86400 - 86400, "7y364d"),
            (8 * 365 * 86400, "8y"),
            (20 * 365 * 86400, "20y"),
        ];
        for (seconds, expected) in cases {
            assert_eq!(
                human_duration(SignedDuration::from_secs(seconds)),
                expected,
                "{seconds}s"
            );
        }
        assert_eq!(human_duration(SignedDuration::from_millis(-1500)), "0s");
        assert_eq!(
            human_duration(SignedDuration::from_millis(-2500)),
            "<invalid>"
        );
    }

    #[test]
    fn table_envelope_and_include_object() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u1", "creationTimestamp": ago(30)},
            "spec": {"containers": [{"name": "c"}]},
        });
        let table = table("pods", std::slice::from_ref(&pod));
        assert_eq!(table["kind"], "Table");
        assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(table["metadata"], json!({"resourceVersion": "7"}));
        assert_eq!(
            table["rows"][0]["object"],
            json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": pod["metadata"],
            })
        );
        let first = &table["columnDefinitions"][0];
        assert_eq!(
            first,
            &json!({"name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0})
        );
        for (include, expected) in [
            (IncludeObject::None, Value::Null),
            (IncludeObject::Object, pod.clone()),
        ] {
            let table = to_table(
                &TableKind::Builtin("pods"),
                &[&pod],
                include,
                Value::Null,
                now(),
            );
            assert_eq!(table["rows"][0]["object"], expected);
            assert_eq!(table["metadata"], json!({}));
        }
        let empty = to_table(
            &TableKind::Builtin("pods"),
            &[],
            IncludeObject::Metadata,
            json!({}),
            now(),
        );
        assert_eq!(empty["rows"], json!([]));
    }

    #[test]
    fn include_object_parses_query_values() {
        let cases = [
            ("", Ok(IncludeObject::Metadata)),
            ("Metadata", Ok(IncludeObject::Metadata)),
            ("None", Ok(IncludeObject::None)),
            ("Object", Ok(IncludeObject::Object)),
            ("object", Err(UnknownIncludeObject("object".to_string()))),
        ];
        for (value, expected) in cases {
            assert_eq!(value.parse::<IncludeObject>(), expected, "{value}");
        }
        assert_eq!(
            UnknownIncludeObject("x".to_string()).to_string(),
            "unrecognized includeObject value: \"x\""
        );
    }

    #[test]
    fn builtin_column_names() {
        let cases: [(&str, &[(&str, i64)]); 8] = [
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
            ("replicasets", &[("Name", 0), ("Age", 0)]),
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
            ("replicasets", json!({"metadata": meta}), json!(["x", "5h"])),
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

    fn custom(printer_columns: &[Value], object: Value) -> Value {
        to_table(
            &TableKind::Custom { printer_columns },
            &[&object],
            IncludeObject::Metadata,
            json!({}),
            now(),
        )
    }

    #[test]
    fn custom_resource_default_age_column() {
        let table = custom(
            &[],
            json!({"metadata": {"name": "w", "creationTimestamp": ago(400)}}),
        );
        assert_eq!(
            table["columnDefinitions"],
            json!([
                {"name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0},
                {"name": "Age", "type": "date", "format": "", "description": AGE_DESCRIPTION, "priority": 0},
            ])
        );
        assert_eq!(table["rows"][0]["cells"], json!(["w", "6m40s"]));
    }

    #[test]
    fn custom_resource_printer_columns() {
        let columns = [
            json!({"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Upgrade phase"}),
            json!({"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}),
            json!({"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes", "priority": 1}),
            json!({"name": "Ratio", "type": "number", "jsonPath": ".status.ratio"}),
            json!({"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused"}),
            json!({"name": "Module", "type": "string", "jsonPath": ".spec.modules[*].name"}),
            json!({"name": "Last", "type": "string", "jsonPath": ".spec.modules[-1].name"}),
            json!({"name": "Zone", "type": "string", "jsonPath": ".metadata.labels.topology\\.kubernetes\\.io/zone"}),
            json!({"name": "Owner", "type": "string", "jsonPath": ".metadata.annotations['example.com/owner']"}),
            json!({"name": "Started", "type": "date", "jsonPath": ".status.startedAt"}),
            json!({"name": "Spec", "type": "string", "jsonPath": ".spec.target"}),
            json!({"name": "Missing", "type": "string", "jsonPath": ".status.nothing"}),
            json!({"name": "Mismatch", "type": "integer", "jsonPath": ".status.phase"}),
            json!({"name": "Bad", "type": "date", "jsonPath": ".status.phase"}),
            json!({"name": "Count", "type": "string", "jsonPath": ".status.nodes"}),
            json!({"name": "Recursive", "type": "string", "jsonPath": "..name"}),
        ];
        let object = json!({
            "apiVersion": "capstan.io/v1", "kind": "Upgrade",
            "metadata": {
                "name": "u1", "creationTimestamp": ago(60),
                "labels": {"topology.kubernetes.io/zone": "z1"},
                "annotations": {"example.com/owner": "ops"},
            },
            "spec": {"paused": false, "modules": [{"name": "nvidia"}, {"name": "zfs"}], "target": {"version": "2", "kernel": "6.8"}},
            "status": {
                "phase": "Draining", "nodes": 3.7, "ratio": 2.0, "startedAt": ago(3 * 3600 + 600),
                "conditions": [{"type": "Progressing", "status": "True"}, {"type": "Ready", "status": "False"}],
            },
        });
        let table = custom(&columns, object);
        assert_eq!(
            table["rows"][0]["cells"],
            json!([
                "u1",
                "Draining",
                "False",
                3,
                2,
                false,
                "nvidia",
                "zfs",
                "z1",
                "ops",
                "3h10m",
                "{\"kernel\":\"6.8\",\"version\":\"2\"}",
                null,
                null,
                "<invalid>",
                "3.7",
                null,
            ])
        );
        let definitions = &table["columnDefinitions"];
        assert_eq!(
            definitions.as_array().map(Vec::len),
            Some(columns.len() + 1)
        );
        assert_eq!(
            definitions[1],
            json!({"name": "Phase", "type": "string", "format": "", "description": "Upgrade phase", "priority": 0})
        );
        assert_eq!(
            definitions[3],
            json!({"name": "Nodes", "type": "integer", "format": "", "description": "Custom resource definition column (in JSONPath format): .status.nodes", "priority": 1})
        );
    }

    #[test]
    fn json_path_filters() {
        let object = json!({"items": [
            {"name": "a", "n": 1, "ok": true},
            {"name": "b", "n": 5, "ok": false, "extra": {}},
            {"name": "c", "n": 9},
        ]});
        let cases = [
            (".items[?(@.n>4)].name", Some("b")),
            (".items[?(@.n >= 9)].name", Some("c")),
            (".items[?(@.n<=1)].name", Some("a")),
            (".items[?(@.name!='a')].name", Some("b")),
            (".items[?(@.ok==false)].name", Some("b")),
            (".items[?(@.extra)].name", Some("b")),
            (".items[?(@.n==2)].name", None),
            (".items[3].name", None),
            (".items[-3].name", Some("a")),
            ("$.items[1].name", Some("b")),
            (".items[0]['name']", Some("a")),
        ];
        for (path, expected) in cases {
            let parsed = JsonPath::parse(path).expect(path);
            assert_eq!(
                parsed.first(&object).and_then(Value::as_str),
                expected,
                "{path}"
            );
        }
        for unsupported in [
            "..name",
            ".items[0:2]",
            ".items[?(x==1)]",
            "items",
            ".a[",
            ".a['b','c']",
        ] {
            assert_eq!(JsonPath::parse(unsupported), None, "{unsupported}");
        }
        assert_eq!(
            JsonPath::parse(".").and_then(|p| p.first(&object).cloned()),
            Some(object.clone())
        );
    }
}
