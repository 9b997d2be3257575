//! The manifests of a test fleet, as YAML a fleet repository holds: KMM Modules of
//! namespace `kmm-demo`, the Node version labels that move a node to a version of a Module,
//! ConfigMaps and the namespace itself.

/// The namespace of every fixture.
pub const NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kmm-demo\n";

/// Module `kmm-demo/<name>` at `version`, loading kernel module `<name>` (dashes as
/// underscores) on workers from an image tagged with the version and the kernel.
pub fn module(name: &str, version: &str) -> String {
    format!(
        r#"apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: {name}
  namespace: kmm-demo
spec:
  selector:
    node-role.kubernetes.io/worker: ""
  moduleLoader:
    container:
      version: "{version}"
      modprobe:
        moduleName: {module}
      kernelMappings:
        - regexp: '^.+$'
          containerImage: "registry.example/org/{name}:{version}-${{KERNEL_FULL_VERSION}}"
"#,
        module = name.replace('-', "_")
    )
}

/// [`module`] with a device plugin at the same version, which an ordered upgrade stops
/// before the unload and starts after the load.
pub fn module_with_device_plugin(name: &str, version: &str) -> String {
    module(name, version)
        + &format!(
            r#"  devicePlugin:
    container:
      image: "registry.example/org/{name}-device-plugin:{version}"
"#
        )
}

/// A Node manifest with the version label: `node` may run `version` of Module
/// `kmm-demo/<module>`.
pub fn node_label(node: &str, module: &str, version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    kmm.node.kubernetes.io/version-module.kmm-demo.{module}: \"{version}\"\n"
    )
}

/// ConfigMap `kmm-demo/<name>` whose `value` is `value`.
pub fn config_map(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: kmm-demo\ndata:\n  value: \"{value}\"\n"
    )
}
