//! The CustomResourceDefinitions of every kind capstan handles, as objects and as the YAML
//! stream `capstan crds` prints for `kubectl apply -f -`. The strict field check that
//! manifests from Git go through, [`crate::schema::unknown_fields`], walks these schemas.
//!
//! The schemas come from the Rust types (kube's derive with schemars), so the types and the
//! CRDs cannot drift apart. They are structural (every node typed, no `$ref`, no untagged
//! unions), as a real API server requires.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use thiserror::Error;

use super::capstan::{GitSync, HistoryRecord};
use super::lws::LeaderWorkerSet;
use super::module::Module;
use super::nmc::NodeModulesConfig;
use super::upgrade_config::UpgradeConfig;

/// The CRDs could not be printed.
#[derive(Debug, Error)]
pub enum CrdError {
    /// A CRD did not serialise to YAML.
    #[error("cannot write CRD {crd} as YAML: {source}")]
    Yaml {
        /// `metadata.name` of the CRD.
        crd: String,
        /// What the YAML serialiser reported.
        #[source]
        source: serde_saphyr::ser::Error,
    },
}

/// Every CRD capstan handles: `Module`, `NodeModulesConfig`, `UpgradeConfig`,
/// `LeaderWorkerSet`, then capstan's own `GitSync` and `HistoryRecord`, in that order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        Module::crd(),
        NodeModulesConfig::crd(),
        UpgradeConfig::crd(),
        LeaderWorkerSet::crd(),
        GitSync::crd(),
        HistoryRecord::crd(),
    ]
}

/// [`all`] as one YAML stream, each CRD a document starting with `---`.
///
/// Fails only if the YAML serialiser rejects a CRD, naming it.
pub fn to_yaml() -> Result<String, CrdError> {
    let mut out = String::new();
    for crd in all() {
        let yaml = serde_saphyr::to_string(&crd).map_err(|source| CrdError::Yaml {
            crd: crd.metadata.name.clone().unwrap_or_default(),
            source,
        })?;
        out.push_str("---\n");
        out.push_str(yaml.strip_prefix("---\n").unwrap_or(&yaml));
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::collect_unknown;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionVersion, JSON, JSONSchemaProps, JSONSchemaPropsOrArray,
        JSONSchemaPropsOrBool,
    };
    use serde_json::Value;
    use std::sync::LazyLock;

    /// Generated once: the pod template schemas make generation slow in debug builds.
    static ALL: LazyLock<Vec<CustomResourceDefinition>> = LazyLock::new(all);

    fn crd_named(name: &str) -> CustomResourceDefinition {
        ALL.iter()
            .find(|crd| crd.metadata.name.as_deref() == Some(name))
            .cloned()
            .unwrap_or_else(|| panic!("no CRD {name}"))
    }

    fn only_version(crd: &CustomResourceDefinition) -> &CustomResourceDefinitionVersion {
        assert_eq!(crd.spec.versions.len(), 1);
        &crd.spec.versions[0]
    }

    fn root_schema(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
        only_version(crd)
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap()
    }

    /// Follows properties (and `[]` for array items) from the root schema.
    fn schema_at<'a>(root: &'a JSONSchemaProps, path: &[&str]) -> &'a JSONSchemaProps {
        let mut node = root;
        for step in path {
            node = if *step == "[]" {
                match node.items.as_ref() {
                    Some(JSONSchemaPropsOrArray::Schema(items)) => items,
                    other => panic!("no items at {path:?}: {other:?}"),
                }
            } else {
                node.properties
                    .as_ref()
                    .and_then(|p| p.get(*step))
                    .unwrap_or_else(|| panic!("no property {step} in {path:?}"))
            };
        }
        node
    }

    struct Names {
        crd: &'static str,
        group: &'static str,
        kind: &'static str,
        plural: &'static str,
        singular: &'static str,
        scope: &'static str,
        version: &'static str,
        short_names: &'static [&'static str],
    }

    #[test]
    fn names_scopes_and_versions_match_upstream() {
        let cases = [
            Names {
                crd: "modules.kmm.sigs.x-k8s.io",
                group: "kmm.sigs.x-k8s.io",
                kind: "Module",
                plural: "modules",
                singular: "module",
                scope: "Namespaced",
                version: "v1beta1",
                short_names: &[],
            },
            Names {
                crd: "nodemodulesconfigs.kmm.sigs.x-k8s.io",
                group: "kmm.sigs.x-k8s.io",
                kind: "NodeModulesConfig",
                plural: "nodemodulesconfigs",
                singular: "nodemodulesconfig",
                scope: "Cluster",
                version: "v1beta1",
                short_names: &["nmc"],
            },
            Names {
                crd: "upgradeconfigs.upgrade.managed.openshift.io",
                group: "upgrade.managed.openshift.io",
                kind: "UpgradeConfig",
                plural: "upgradeconfigs",
                singular: "upgradeconfig",
                scope: "Namespaced",
                version: "v1alpha1",
                short_names: &["upgrade"],
            },
            Names {
                crd: "leaderworkersets.leaderworkerset.x-k8s.io",
                group: "leaderworkerset.x-k8s.io",
                kind: "LeaderWorkerSet",
                plural: "leaderworkersets",
                singular: "leaderworkerset",
                scope: "Namespaced",
                version: "v1",
                short_names: &["lws"],
            },
            Names {
                crd: "gitsyncs.capstan.dev",
                group: "capstan.dev",
                kind: "GitSync",
                plural: "gitsyncs",
                singular: "gitsync",
                scope: "Namespaced",
                version: "v1alpha1",
                short_names: &["gs"],
            },
            Names {
                crd: "historyrecords.capstan.dev",
                group: "capstan.dev",
                kind: "HistoryRecord",
                plural: "historyrecords",
                singular: "historyrecord",
                scope: "Namespaced",
                version: "v1alpha1",
                short_names: &["hist"],
            },
        ];
        assert_eq!(ALL.len(), cases.len());
        for want in cases {
            let name = want.crd;
            let crd = crd_named(name);
            assert_eq!(crd.spec.group, want.group, "{name}");
            assert_eq!(crd.spec.names.kind, want.kind, "{name}");
            assert_eq!(crd.spec.names.plural, want.plural, "{name}");
            assert_eq!(
                crd.spec.names.singular.as_deref(),
                Some(want.singular),
                "{name}"
            );
            assert_eq!(crd.spec.scope, want.scope, "{name}");
            let short_names = crd.spec.names.short_names.clone().unwrap_or_default();
            assert_eq!(short_names, want.short_names, "{name}");
            let v = only_version(&crd);
            assert_eq!(v.name, want.version, "{name}");
            assert!(v.served && v.storage, "{name}");
            // A history record is written once and never observed: no status.
            let has_status = v.subresources.as_ref().is_some_and(|s| s.status.is_some());
            assert_eq!(
                has_status,
                want.kind != "HistoryRecord",
                "{name} status subresource"
            );
        }
    }

    #[test]
    fn lws_has_upstream_scale_subresource() {
        let crd = crd_named("leaderworkersets.leaderworkerset.x-k8s.io");
        let v = only_version(&crd);
        let scale = v.subresources.as_ref().unwrap().scale.as_ref().unwrap();
        assert_eq!(scale.spec_replicas_path, ".spec.replicas");
        assert_eq!(scale.status_replicas_path, ".status.replicas");
        assert_eq!(
            scale.label_selector_path.as_deref(),
            Some(".status.hpaPodSelector")
        );
        for other in [
            "modules.kmm.sigs.x-k8s.io",
            "nodemodulesconfigs.kmm.sigs.x-k8s.io",
            "upgradeconfigs.upgrade.managed.openshift.io",
        ] {
            let crd = crd_named(other);
            assert!(
                only_version(&crd)
                    .subresources
                    .as_ref()
                    .unwrap()
                    .scale
                    .is_none()
            );
        }
    }

    #[test]
    fn printer_columns() {
        let columns = |name: &str| -> Vec<(String, String)> {
            only_version(&crd_named(name))
                .additional_printer_columns
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|c| (c.name, c.json_path))
                .collect()
        };
        let expect = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(n, p)| (n.to_string(), p.to_string()))
                .collect()
        };
        assert_eq!(
            columns("modules.kmm.sigs.x-k8s.io"),
            expect(&[
                ("Version", ".spec.moduleLoader.container.version"),
                (
                    "Targeted",
                    ".status.moduleLoader.nodesMatchingSelectorNumber"
                ),
                ("Desired", ".status.moduleLoader.desiredNumber"),
                ("Available", ".status.moduleLoader.availableNumber"),
                ("Age", ".metadata.creationTimestamp"),
            ])
        );
        assert_eq!(
            columns("upgradeconfigs.upgrade.managed.openshift.io"),
            expect(&[
                ("desired_version", ".spec.desired.version"),
                ("phase", ".status.history[0].phase"),
                ("stage", ".status.history[0].conditions[0].type"),
                ("status", ".status.history[0].conditions[0].status"),
                ("reason", ".status.history[0].conditions[0].reason"),
                ("message", ".status.history[0].conditions[0].message"),
            ])
        );
        assert_eq!(
            columns("leaderworkersets.leaderworkerset.x-k8s.io"),
            expect(&[
                ("Ready", ".status.readyReplicas"),
                ("Desired", ".spec.replicas"),
                ("Up-to-date", ".status.updatedReplicas"),
                ("Age", ".metadata.creationTimestamp"),
            ])
        );
        assert_eq!(columns("nodemodulesconfigs.kmm.sigs.x-k8s.io").len(), 3);
    }

    #[test]
    fn nmc_module_lists_are_maps_keyed_by_namespace_and_name() {
        let crd = crd_named("nodemodulesconfigs.kmm.sigs.x-k8s.io");
        let root = root_schema(&crd);
        for part in ["spec", "status"] {
            let modules = schema_at(root, &[part, "modules"]);
            assert_eq!(
                modules.x_kubernetes_list_type.as_deref(),
                Some("map"),
                "{part}"
            );
            assert_eq!(
                modules.x_kubernetes_list_map_keys,
                Some(vec!["namespace".to_string(), "name".to_string()]),
                "{part}"
            );
            let required = schema_at(root, &[part, "modules", "[]"])
                .required
                .clone()
                .unwrap();
            assert!(required.contains(&"namespace".to_string()), "{part}");
            assert!(required.contains(&"name".to_string()), "{part}");
        }
        let lws = crd_named("leaderworkersets.leaderworkerset.x-k8s.io");
        let conditions = schema_at(root_schema(&lws), &["status", "conditions"]);
        assert_eq!(conditions.x_kubernetes_list_type.as_deref(), Some("map"));
        assert_eq!(
            conditions.x_kubernetes_list_map_keys,
            Some(vec!["type".to_string()])
        );
    }

    #[test]
    fn schemas_carry_upstream_names_required_fields_and_defaults() {
        let json = |value: Value| Some(JSON(value));

        let module = crd_named("modules.kmm.sigs.x-k8s.io");
        let root = root_schema(&module);
        let container = schema_at(root, &["spec", "moduleLoader", "container"]);
        let mut required = container.required.clone().unwrap();
        required.sort();
        assert_eq!(required, ["kernelMappings", "modprobe"]);
        assert_eq!(schema_at(container, &["kernelMappings"]).min_items, Some(1));
        assert!(
            schema_at(container, &["registryTLS", "insecureSkipTLSVerify"])
                .type_
                .is_some()
        );
        assert_eq!(
            schema_at(container, &["modprobe", "dirName"]).default,
            json(Value::from("/opt"))
        );
        assert_eq!(
            schema_at(root, &["spec"]).required,
            Some(vec!["selector".to_string()])
        );

        let nmc = crd_named("nodemodulesconfigs.kmm.sigs.x-k8s.io");
        let config = schema_at(root_schema(&nmc), &["spec", "modules", "[]", "config"]);
        assert_eq!(
            schema_at(config, &["imagePullPolicy"]).default,
            json(Value::from("IfNotPresent"))
        );
        assert!(
            schema_at(root_schema(&nmc), &["status", "modules", "[]", "bootId"])
                .type_
                .is_some()
        );

        let upgrade = crd_named("upgradeconfigs.upgrade.managed.openshift.io");
        let spec = schema_at(root_schema(&upgrade), &["spec"]);
        let mut required = spec.required.clone().unwrap();
        required.sort();
        assert_eq!(
            required,
            ["PDBForceDrainTimeout", "desired", "type", "upgradeAt"]
        );
        assert_eq!(
            schema_at(spec, &["PDBForceDrainTimeout"]).minimum,
            Some(0.0)
        );
        assert_eq!(
            schema_at(spec, &["type"]).enum_,
            Some(vec![JSON("OSD".into()), JSON("ARO".into())])
        );

        let lws = crd_named("leaderworkersets.leaderworkerset.x-k8s.io");
        let spec = schema_at(root_schema(&lws), &["spec"]);
        assert_eq!(schema_at(spec, &["replicas"]).default, json(1.into()));
        assert_eq!(
            schema_at(spec, &["startupPolicy"]).default,
            json("LeaderCreated".into())
        );
        let template = schema_at(spec, &["leaderWorkerTemplate"]);
        assert_eq!(schema_at(template, &["size"]).default, json(1.into()));
        assert_eq!(
            schema_at(template, &["restartPolicy"]).default,
            json("RecreateGroupOnPodRestart".into())
        );
        let rolling = schema_at(spec, &["rolloutStrategy", "rollingUpdateConfiguration"]);
        assert_eq!(
            schema_at(rolling, &["maxUnavailable"]).x_kubernetes_int_or_string,
            Some(true)
        );
        assert_eq!(
            schema_at(rolling, &["maxUnavailable"]).default,
            json(1.into())
        );
        assert_eq!(schema_at(rolling, &["maxSurge"]).default, json(0.into()));
    }

    #[test]
    fn every_schema_is_structural() {
        for crd in ALL.iter() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let mut problems = Vec::new();
            structural_problems(root_schema(crd), "", Level::Root, &mut problems);
            assert_eq!(problems, Vec::<String>::new(), "{name}");
        }
    }

    #[test]
    fn yaml_stream_round_trips() {
        let yaml = to_yaml().unwrap();
        assert!(yaml.starts_with("---\n"), "{}", &yaml[..40]);
        assert_eq!(yaml.matches("\n---\n").count() + 1, ALL.len());
        assert!(!yaml.contains("$ref"));
        let parsed: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&yaml).unwrap();
        assert_eq!(&parsed, &*ALL);
    }

    #[test]
    fn every_crd_fits_client_side_apply() {
        // kubectl apply stores the object as compact JSON in an annotation limited to 256 kB.
        // The LeaderWorkerSet CRD, upstream's without descriptions, takes about half of it;
        // a quarter stays free for growth of Kubernetes' pod template.
        const ANNOTATION_LIMIT: usize = 256 * 1024;
        for crd in ALL.iter() {
            let size = serde_json::to_string(crd).unwrap().len();
            assert!(
                size < ANNOTATION_LIMIT * 3 / 4,
                "{:?} is {size} bytes",
                crd.metadata.name
            );
        }
        let lws = crd_named("leaderworkersets.leaderworkerset.x-k8s.io");
        let template = schema_at(
            root_schema(&lws),
            &["spec", "leaderWorkerTemplate", "workerTemplate"],
        );
        // The field keeps its own description; only the nested ones are dropped.
        assert!(template.description.is_some());
        assert!(
            schema_at(template, &["spec", "containers"])
                .description
                .is_none()
        );
    }

    #[test]
    fn unknown_fields_reports_paths_and_respects_open_fields() {
        let module = crd_named("modules.kmm.sigs.x-k8s.io");
        let object = serde_json::json!({
            "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
            "kind": "Module",
            "metadata": {"name": "m", "namespace": "n", "labels": {"any": "thing"}},
            "spec": {
                "selector": {"free-form": "keys are fine"},
                "moduleLoader": {
                    "container": {
                        "kernelMappings": [{"containerImage": "i", "regex": "typo"}],
                        "modprobe": {"moduleName": "m"}
                    }
                },
                "devicePlugin": {
                    "container": {
                        "image": "i",
                        "resources": {"limits": {"cpu": "1"}},
                        "env": [{"name": "A", "valu": "typo"}]
                    }
                },
                "nodeSelector": {}
            },
            "unexpected": 1
        });
        assert_eq!(
            crate::schema::unknown_fields(&module, &object),
            [
                "spec.devicePlugin.container.env[0].valu",
                "spec.moduleLoader.container.kernelMappings[0].regex",
                "spec.nodeSelector",
                "unexpected",
            ]
        );
    }

    #[test]
    fn structural_check_catches_violations() {
        let schema: JSONSchemaProps = serde_json::from_value(serde_json::json!({
            "type": "object",
            "properties": {
                "untyped": {"description": "no type"},
                "list": {"type": "array"},
                "modules": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string"}}}
                },
                "union": {
                    "type": "object",
                    "anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}}]
                },
                "port": {
                    "x-kubernetes-int-or-string": true,
                    "anyOf": [{"type": "integer"}, {"type": "string"}]
                },
                "withDefault": {
                    "type": "object",
                    "properties": {"a": {"type": "string"}},
                    "default": {"a": "x", "b": "pruned"}
                }
            }
        }))
        .unwrap();
        let mut problems = Vec::new();
        structural_problems(&schema, "", Level::Root, &mut problems);
        problems.sort();
        assert_eq!(
            problems,
            [
                "list: array without items",
                "modules: map key name neither required nor defaulted",
                "union(junctor).a: generic field or extension inside a junctor",
                "union(junctor): generic field or extension inside a junctor",
                "union: anyOf/oneOf/allOf/not",
                "untyped: no type",
                "withDefault: default has pruned fields [\"b\"]",
            ]
        );
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Level {
        Root,
        Property,
        Junctor,
    }

    /// Formats Kubernetes understands; others are dropped with a warning by the API server.
    const KNOWN_FORMATS: [&str; 6] = ["int32", "int64", "float", "double", "byte", "date-time"];

    /// The rules of structural schemas (Kubernetes "Specifying a structural schema") and
    /// what else an API server rejects in a CRD schema.
    fn structural_problems(
        schema: &JSONSchemaProps,
        path: &str,
        level: Level,
        out: &mut Vec<String>,
    ) {
        let at = if path.is_empty() { "<root>" } else { path };
        let int_or_string = schema.x_kubernetes_int_or_string == Some(true);
        let preserves = schema.x_kubernetes_preserve_unknown_fields == Some(true);
        if schema.ref_path.is_some() || schema.schema.is_some() || schema.id.is_some() {
            out.push(format!("{at}: $ref, $schema or id"));
        }
        if schema.definitions.is_some() || schema.dependencies.is_some() {
            out.push(format!("{at}: definitions or dependencies"));
        }
        if schema.unique_items == Some(true) || schema.additional_items.is_some() {
            out.push(format!("{at}: uniqueItems or additionalItems"));
        }
        if schema.pattern_properties.is_some() {
            out.push(format!("{at}: patternProperties"));
        }
        if let Some(format) = &schema.format
            && !KNOWN_FORMATS.contains(&format.as_str())
        {
            out.push(format!("{at}: unknown format {format}"));
        }
        match level {
            Level::Junctor => {
                let extensions = schema.x_kubernetes_preserve_unknown_fields.is_some()
                    || schema.x_kubernetes_embedded_resource.is_some()
                    || schema.x_kubernetes_int_or_string.is_some()
                    || schema.x_kubernetes_list_type.is_some()
                    || schema.x_kubernetes_list_map_keys.is_some()
                    || schema.x_kubernetes_map_type.is_some()
                    || schema.x_kubernetes_validations.is_some();
                if schema.type_.is_some()
                    || schema.title.is_some()
                    || schema.description.is_some()
                    || schema.default.is_some()
                    || schema.nullable == Some(true)
                    || schema.additional_properties.is_some()
                    || extensions
                {
                    out.push(format!("{at}: generic field or extension inside a junctor"));
                }
                if schema
                    .properties
                    .as_ref()
                    .is_some_and(|p| p.contains_key("metadata"))
                {
                    out.push(format!("{at}: metadata inside a junctor"));
                }
            }
            Level::Root | Level::Property => {
                if schema.type_.as_deref().is_none_or(str::is_empty) && !int_or_string && !preserves
                {
                    out.push(format!("{at}: no type"));
                }
            }
        }
        if level == Level::Root && schema.type_.as_deref() != Some("object") {
            out.push(format!("{at}: root is not an object"));
        }
        if level == Level::Root && schema.additional_properties.is_some() {
            out.push(format!("{at}: additionalProperties at the root"));
        }
        if schema.properties.is_some()
            && matches!(
                schema.additional_properties,
                Some(JSONSchemaPropsOrBool::Schema(_))
            )
        {
            out.push(format!(
                "{at}: properties and additionalProperties together"
            ));
        }
        if matches!(
            schema.additional_properties,
            Some(JSONSchemaPropsOrBool::Bool(false))
        ) {
            out.push(format!("{at}: additionalProperties: false"));
        }
        if schema.type_.as_deref() == Some("array") && schema.items.is_none() {
            out.push(format!("{at}: array without items"));
        }
        if matches!(schema.items, Some(JSONSchemaPropsOrArray::Schemas(_))) {
            out.push(format!("{at}: tuple items"));
        }
        if let Some(metadata) = schema.properties.as_ref().and_then(|p| p.get("metadata"))
            && (level == Level::Root || schema.x_kubernetes_embedded_resource == Some(true))
            && metadata
                .properties
                .as_ref()
                .is_some_and(|p| p.keys().any(|k| k != "name" && k != "generateName"))
        {
            out.push(format!("{at}: restricts metadata beyond name/generateName"));
        }
        list_problems(schema, at, out);
        if let Some(default) = &schema.default {
            let mut unknown = Vec::new();
            collect_unknown(schema, &default.0, "", false, &mut unknown);
            if !unknown.is_empty() {
                out.push(format!("{at}: default has pruned fields {unknown:?}"));
            }
        }

        let child_level = if level == Level::Junctor {
            Level::Junctor
        } else {
            Level::Property
        };
        for (name, property) in schema.properties.iter().flatten() {
            structural_problems(property, &join(path, name), child_level, out);
        }
        if let Some(JSONSchemaPropsOrBool::Schema(additional)) = &schema.additional_properties {
            structural_problems(additional, &join(path, "*"), child_level, out);
        }
        if let Some(JSONSchemaPropsOrArray::Schema(items)) = &schema.items {
            structural_problems(items, &format!("{path}[]"), child_level, out);
        }
        // `anyOf: [{type: integer}, {type: string}]` is the one allowed typed junctor.
        let int_or_string_any_of = schema.any_of.as_ref().is_some_and(|branches| {
            let types: Vec<_> = branches.iter().map(|b| b.type_.as_deref()).collect();
            types == [Some("integer"), Some("string")]
                && branches.iter().all(|b| {
                    JSONSchemaProps {
                        type_: None,
                        ..b.clone()
                    } == JSONSchemaProps::default()
                })
        });
        let any_of = if int_or_string_any_of {
            &None
        } else {
            &schema.any_of
        };
        let junctors = [&schema.all_of, any_of, &schema.one_of];
        // Stricter than the API server: capstan's schemas need no unions at all.
        if junctors.iter().any(|j| j.is_some()) || schema.not.is_some() {
            out.push(format!("{at}: anyOf/oneOf/allOf/not"));
        }
        for branch in junctors.into_iter().flatten().flatten() {
            structural_problems(branch, &format!("{path}(junctor)"), Level::Junctor, out);
        }
        if let Some(not) = &schema.not {
            structural_problems(not, &format!("{path}(not)"), Level::Junctor, out);
        }
    }

    fn list_problems(schema: &JSONSchemaProps, at: &str, out: &mut Vec<String>) {
        let item = match &schema.items {
            Some(JSONSchemaPropsOrArray::Schema(item)) => Some(item.as_ref()),
            _ => None,
        };
        match schema.x_kubernetes_list_type.as_deref() {
            None | Some("atomic") => {
                if schema.x_kubernetes_list_map_keys.is_some() {
                    out.push(format!("{at}: list-map-keys without list-type map"));
                }
            }
            Some("set") => {
                if item.is_some_and(|i| matches!(i.type_.as_deref(), Some("object" | "array"))) {
                    out.push(format!("{at}: set of non-scalars"));
                }
            }
            Some("map") => {
                let keys = schema
                    .x_kubernetes_list_map_keys
                    .clone()
                    .unwrap_or_default();
                if keys.is_empty() {
                    out.push(format!("{at}: list-type map without keys"));
                }
                let Some(item) = item.filter(|i| i.type_.as_deref() == Some("object")) else {
                    out.push(format!("{at}: list-type map of non-objects"));
                    return;
                };
                for key in keys {
                    let property = item.properties.as_ref().and_then(|p| p.get(&key));
                    let required = item.required.as_ref().is_some_and(|r| r.contains(&key));
                    match property {
                        None => out.push(format!("{at}: map key {key} is not a property")),
                        Some(p) if !required && p.default.is_none() => out.push(format!(
                            "{at}: map key {key} neither required nor defaulted"
                        )),
                        Some(p) if matches!(p.type_.as_deref(), Some("object" | "array")) => {
                            out.push(format!("{at}: map key {key} is not a scalar"))
                        }
                        Some(_) => {}
                    }
                }
            }
            Some(other) => out.push(format!("{at}: unknown list-type {other}")),
        }
    }

    fn join(path: &str, name: &str) -> String {
        if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        }
    }
}
