//! The column definitions of the built-in printers, with kube-apiserver's names,
//! types, priorities and descriptions (`kubectl explain`'s swagger docs where upstream
//! uses them).

use serde_json::{Value, json};

/// `metav1.ObjectMeta` swagger doc of `name`.
pub(super) const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
/// `metav1.ObjectMeta` swagger doc of `creationTimestamp`.
pub(super) const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
pub(super) const NODE_ADDRESSES_DESCRIPTION: &str = "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).";
pub(super) const CONTAINERS_DESCRIPTION: &str = "Names of each container in the template.";
pub(super) const IMAGES_DESCRIPTION: &str = "Images referenced by each container in the template.";

/// A column definition of a built-in printer.
#[derive(Clone, Copy)]
pub(super) struct Column {
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

    pub(super) fn definition(&self) -> Value {
        column_definition(
            self.name,
            self.kind,
            self.format,
            self.description,
            self.priority,
        )
    }
}

pub(super) fn column_definition(
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

pub(super) const NAME: Column = Column {
    name: "Name",
    kind: "string",
    format: "name",
    description: NAME_DESCRIPTION,
    priority: 0,
};
pub(super) const AGE: Column = Column::new("Age", AGE_DESCRIPTION);
pub(super) const CONTAINERS: Column = Column::new("Containers", CONTAINERS_DESCRIPTION).wide();
pub(super) const IMAGES: Column = Column::new("Images", IMAGES_DESCRIPTION).wide();

pub(super) const NODE_COLUMNS: &[Column] = &[
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

pub(super) const POD_COLUMNS: &[Column] = &[
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

pub(super) const NAMESPACE_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Status", "The status of the namespace"),
    AGE,
];

pub(super) const CONFIG_MAP_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Data",
        "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.",
    ),
    AGE,
];

pub(super) const SECRET_COLUMNS: &[Column] = &[
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

pub(super) const SERVICE_ACCOUNT_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Secrets",
        "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use. Pods are only limited to this list if this service account has a \"kubernetes.io/enforce-mountable-secrets\" annotation set to \"true\". The \"kubernetes.io/enforce-mountable-secrets\" annotation is deprecated since v1.32. Prefer separate namespaces to isolate access to mounted secrets. This field should not be used to find auto-generated service account token secrets for use outside of pods. Instead, tokens can be requested directly using the TokenRequest API, or service account token secrets can be manually created. More info: https://kubernetes.io/docs/concepts/configuration/secret",
    ),
    AGE,
];

pub(super) const SERVICE_COLUMNS: &[Column] = &[
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

pub(super) const EVENT_COLUMNS: &[Column] = &[
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

pub(super) const DAEMON_SET_COLUMNS: &[Column] = &[
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

pub(super) const DEPLOYMENT_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Ready", "Number of the pod with ready state"),
    Column::new(
        "Up-to-date",
        "Total number of non-terminating pods targeted by this deployment that have the desired template spec.",
    ),
    Column::new(
        "Available",
        "Total number of available non-terminating pods (ready for at least minReadySeconds) targeted by this deployment.",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    Column::new(
        "Selector",
        "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment. It must match the pod template's labels.",
    )
    .wide(),
];

pub(super) const REPLICA_SET_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Desired",
        "Replicas is the number of desired pods. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset",
    )
    .of_kind("integer"),
    Column::new(
        "Current",
        "Replicas is the most recently observed number of non-terminating pods. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset",
    )
    .of_kind("integer"),
    Column::new(
        "Ready",
        "The number of non-terminating pods targeted by this ReplicaSet with a Ready Condition.",
    )
    .of_kind("integer"),
    AGE,
    CONTAINERS,
    IMAGES,
    Column::new(
        "Selector",
        "Selector is a label query over pods that should match the replica count. Label keys and values that must match in order to be controlled by this replica set. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    )
    .wide(),
];

pub(super) const REPLICATION_CONTROLLER_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Desired",
        "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller",
    )
    .of_kind("integer"),
    Column::new(
        "Current",
        "Replicas is the most recently observed number of replicas. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller",
    )
    .of_kind("integer"),
    Column::new(
        "Ready",
        "The number of ready replicas for this replication controller.",
    )
    .of_kind("integer"),
    AGE,
    CONTAINERS,
    IMAGES,
    Column::new(
        "Selector",
        "Selector is a label query over pods that should match the Replicas count. If Selector is empty, it is defaulted to the labels present on the Pod template. Label keys and values that must match in order to be controlled by this replication controller, if empty defaulted to labels on Pod template. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    )
    .wide(),
];

pub(super) const STATEFUL_SET_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Ready", "Number of the pod with ready state"),
    AGE,
    CONTAINERS,
    IMAGES,
];

pub(super) const CONTROLLER_REVISION_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Controller", "Controller of the object"),
    Column::new(
        "Revision",
        "Revision indicates the revision of the state represented by Data.",
    ),
    AGE,
];

pub(super) const POD_DISRUPTION_BUDGET_COLUMNS: &[Column] = &[
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

pub(super) const LEASE_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Holder",
        "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.",
    ),
    AGE,
];

/// CRDs are served by apiextensions-apiserver's default table convertor.
pub(super) const CUSTOM_RESOURCE_DEFINITION_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Created At", AGE_DESCRIPTION).of_kind("date"),
];

pub(super) const GENERIC_COLUMNS: &[Column] = &[NAME, AGE];
