//! Kernel mappings: the kmod image and load settings a Module uses on one kernel.
//!
//! The first mapping whose `literal` equals the kernel wins; failing that, the first whose
//! `regexp` matches it, unanchored as Go's `regexp.MatchString`. A mapping's
//! `containerImage`, `registryTLS` and `inTreeModulesToRemove` override the container's
//! defaults. The image may use upstream's template variables, as `${NAME}` or `$NAME`:
//!
//! | variable | value for kernel `6.0.15-300.fc37.x86_64`, Module `kmm-demo/my-kmod` |
//! | --- | --- |
//! | `KERNEL_FULL_VERSION`, `KERNEL_VERSION` | `6.0.15-300.fc37.x86_64` |
//! | `KERNEL_XYZ` | `6.0.15` |
//! | `KERNEL_X`, `KERNEL_Y`, `KERNEL_Z` | `6`, `0`, `15` |
//! | `MOD_NAME`, `MOD_NAMESPACE` | `my-kmod`, `kmm-demo` |
//!
//! X, Y and Z are the first three parts of the kernel split at `.`, `,` and `-`. Upstream
//! replaces an unknown variable by nothing and so pulls an image nobody named; here it is an
//! error, as is a kernel with fewer than three parts when X, Y, Z or XYZ is used.

use std::convert::Infallible;

use regex::Regex;
use thiserror::Error;

use capstan_api::labels::ModuleKey;
use capstan_api::module::{KernelMapping, ModuleLoaderContainerSpec};
use capstan_api::nmc::{DEFAULT_IMAGE_PULL_POLICY, ModuleConfig};
use capstan_api::text_memo::Memo;

/// Every variable an image template may use.
pub const TEMPLATE_VARIABLES: [&str; 8] = [
    "KERNEL_FULL_VERSION",
    "KERNEL_VERSION",
    "KERNEL_XYZ",
    "KERNEL_X",
    "KERNEL_Y",
    "KERNEL_Z",
    "MOD_NAME",
    "MOD_NAMESPACE",
];

/// Why a Module's kernel mappings give no config for a kernel they match.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum KernelMappingError {
    /// A `regexp` does not compile.
    #[error(
        "kernelMappings[{index}].regexp {pattern:?} is not a valid regular expression: {reason}"
    )]
    InvalidRegexp {
        /// Index of the mapping.
        index: usize,
        /// The pattern.
        pattern: String,
        /// What the regular expression parser said.
        reason: String,
    },
    /// Neither the matching mapping nor the container names an image.
    #[error(
        "kernelMappings[{index}] matches kernel {kernel:?} but names no containerImage, and \
         the container has no default containerImage"
    )]
    NoImage {
        /// Index of the matching mapping.
        index: usize,
        /// The kernel it matched.
        kernel: String,
    },
    /// The image template cannot be expanded.
    #[error("{field} {template:?}: {reason}")]
    Template {
        /// Where the template is: `containerImage` or `kernelMappings[<i>].containerImage`.
        field: String,
        /// The template.
        template: String,
        /// What is wrong with it.
        reason: TemplateError,
    },
}

/// What is wrong with an image template.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum TemplateError {
    /// A variable that is not one of [`TEMPLATE_VARIABLES`].
    #[error(
        "unknown variable ${{{0}}}; the known ones are KERNEL_FULL_VERSION, KERNEL_VERSION, \
         KERNEL_XYZ, KERNEL_X, KERNEL_Y, KERNEL_Z, MOD_NAME and MOD_NAMESPACE"
    )]
    UnknownVariable(String),
    /// `KERNEL_X`, `_Y`, `_Z` or `_XYZ` on a kernel without three parts.
    #[error(
        "${{{variable}}} needs a kernel version with at least three parts separated by \
         '.', ',' or '-', but the kernel is {kernel:?}"
    )]
    KernelWithoutXyz {
        /// The variable.
        variable: String,
        /// The kernel.
        kernel: String,
    },
    /// `${` without its `}`.
    #[error("the \"${{\" at character {0} has no closing \"}}\"")]
    Unclosed(usize),
}

/// Patterns compiled so far (invalid ones too): every node of every Module is matched
/// against the same few, and compiling one costs far more than matching it.
static COMPILED: Memo<Result<Regex, String>> = Memo::new(1024);

/// `pattern` compiled (a cheap clone of the remembered one), or why it does not compile.
fn compiled(pattern: &str) -> Result<Regex, String> {
    COMPILED
        .get_or_try(pattern, || {
            Ok::<_, Infallible>(Regex::new(pattern).map_err(|err| err.to_string()))
        })
        .unwrap_or_else(|never| match never {})
}

/// The mapping for `kernel`, with its index: the first equal `literal`, else the first
/// matching `regexp`; `None` when no mapping covers the kernel.
///
/// Fails when a `regexp` tried before a match does not compile.
pub fn find_mapping<'a>(
    mappings: &'a [KernelMapping],
    kernel: &str,
) -> Result<Option<(usize, &'a KernelMapping)>, KernelMappingError> {
    if let Some(literal) = mappings
        .iter()
        .enumerate()
        .find(|(_, mapping)| !mapping.literal.is_empty() && mapping.literal == kernel)
    {
        return Ok(Some(literal));
    }
    for (index, mapping) in mappings.iter().enumerate() {
        if mapping.regexp.is_empty() {
            continue;
        }
        let regexp =
            compiled(&mapping.regexp).map_err(|reason| KernelMappingError::InvalidRegexp {
                index,
                pattern: mapping.regexp.clone(),
                reason,
            })?;
        if regexp.is_match(kernel) {
            return Ok(Some((index, mapping)));
        }
    }
    Ok(None)
}

/// The worker config of Module `key` on `kernel` (as [`NodeFacts::kernel_version`] spells
/// it): the mapping's settings over the container's, the image template expanded, the pull
/// policy defaulted to `IfNotPresent`. `None` when no mapping covers the kernel.
///
/// Fails as [`find_mapping`], when no image is named, or when the image template does not
/// expand ([`expand_image`]).
///
/// [`NodeFacts::kernel_version`]: super::node::NodeFacts::kernel_version
pub fn resolve(
    key: &ModuleKey,
    container: &ModuleLoaderContainerSpec,
    kernel: &str,
) -> Result<Option<ModuleConfig>, KernelMappingError> {
    let Some((index, mapping)) = find_mapping(&container.kernel_mappings, kernel)? else {
        return Ok(None);
    };
    let (field, template) = if mapping.container_image.is_empty() {
        ("containerImage".to_string(), &container.container_image)
    } else {
        (
            format!("kernelMappings[{index}].containerImage"),
            &mapping.container_image,
        )
    };
    if template.is_empty() {
        return Err(KernelMappingError::NoImage {
            index,
            kernel: kernel.to_string(),
        });
    }
    let container_image =
        expand_image(template, kernel, key).map_err(|reason| KernelMappingError::Template {
            field,
            template: template.clone(),
            reason,
        })?;
    let tls = mapping
        .registry_tls
        .as_ref()
        .unwrap_or(&container.registry_tls);
    let image_pull_policy = if container.image_pull_policy.is_empty() {
        DEFAULT_IMAGE_PULL_POLICY
    } else {
        &container.image_pull_policy
    };
    Ok(Some(ModuleConfig {
        kernel_version: kernel.to_string(),
        container_image,
        insecure_pull: tls.insecure || tls.insecure_skip_tls_verify,
        modprobe: container.modprobe.clone(),
        image_pull_policy: image_pull_policy.to_string(),
        in_tree_modules_to_remove: mapping.in_tree_modules_for(container),
        // The deprecated single module is folded into the list above.
        in_tree_module_to_remove: String::new(),
    }))
}

/// Expands the template variables of `template` (see the module docs) for `kernel` and
/// Module `key`. A `$` that starts no variable name is kept as it is.
///
/// Fails on an unknown variable, an unclosed `${`, or a kernel without three parts when
/// `KERNEL_X`, `_Y`, `_Z` or `_XYZ` is used.
pub fn expand_image(
    template: &str,
    kernel: &str,
    key: &ModuleKey,
) -> Result<String, TemplateError> {
    let mut expanded = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(dollar) = rest.find('$') {
        expanded.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        let (name, length) = if let Some(braced) = after.strip_prefix('{') {
            let Some(close) = braced.find('}') else {
                let at = template[..template.len() - rest.len() + dollar]
                    .chars()
                    .count();
                return Err(TemplateError::Unclosed(at));
            };
            (&braced[..close], close + 2)
        } else {
            let length = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if length == 0 || after.starts_with(|c: char| c.is_ascii_digit()) {
                expanded.push('$');
                rest = after;
                continue;
            }
            (&after[..length], length)
        };
        expanded.push_str(&variable(name, kernel, key)?);
        rest = &after[length..];
    }
    expanded.push_str(rest);
    Ok(expanded)
}

fn variable(name: &str, kernel: &str, key: &ModuleKey) -> Result<String, TemplateError> {
    let part = |index: usize| {
        let mut parts = kernel.split(['.', ',', '-']);
        let xyz = [parts.next(), parts.next(), parts.next()];
        match xyz {
            [Some(x), Some(y), Some(z)] => Ok([x, y, z][index.min(2)].to_string()),
            _ => Err(TemplateError::KernelWithoutXyz {
                variable: name.to_string(),
                kernel: kernel.to_string(),
            }),
        }
    };
    match name {
        "KERNEL_FULL_VERSION" | "KERNEL_VERSION" => Ok(kernel.to_string()),
        "KERNEL_XYZ" => Ok(format!("{}.{}.{}", part(0)?, part(1)?, part(2)?)),
        "KERNEL_X" => part(0),
        "KERNEL_Y" => part(1),
        "KERNEL_Z" => part(2),
        "MOD_NAME" => Ok(key.name().to_string()),
        "MOD_NAMESPACE" => Ok(key.namespace().to_string()),
        _ => Err(TemplateError::UnknownVariable(name.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::module::{ModprobeSpec, TlsOptions};

    const KERNEL: &str = "6.0.15-300.fc37.x86_64";

    fn key() -> ModuleKey {
        ModuleKey::new("kmm-demo", "my-kmod").unwrap()
    }

    fn literal(kernel: &str, image: &str) -> KernelMapping {
        KernelMapping {
            literal: kernel.to_string(),
            container_image: image.to_string(),
            ..KernelMapping::default()
        }
    }

    fn regexp(pattern: &str, image: &str) -> KernelMapping {
        KernelMapping {
            regexp: pattern.to_string(),
            container_image: image.to_string(),
            ..KernelMapping::default()
        }
    }

    fn container(mappings: Vec<KernelMapping>) -> ModuleLoaderContainerSpec {
        ModuleLoaderContainerSpec {
            kernel_mappings: mappings,
            modprobe: ModprobeSpec {
                module_name: "my_kmod".to_string(),
                ..ModprobeSpec::default()
            },
            ..ModuleLoaderContainerSpec::default()
        }
    }

    fn image_for(mappings: Vec<KernelMapping>, kernel: &str) -> Option<String> {
        resolve(&key(), &container(mappings), kernel)
            .unwrap()
            .map(|config| config.container_image)
    }

    #[test]
    fn mapping_choice() {
        let cases = [
            (
                "an equal literal wins",
                vec![literal(KERNEL, "lit")],
                Some("lit"),
            ),
            (
                "a literal wins over an earlier matching regexp",
                vec![regexp("^.+$", "re"), literal(KERNEL, "lit")],
                Some("lit"),
            ),
            (
                "the first matching regexp wins",
                vec![
                    regexp("^5", "five"),
                    regexp("fc37", "fc"),
                    regexp(".", "any"),
                ],
                Some("fc"),
            ),
            (
                "a regexp is not anchored",
                vec![regexp("300", "re")],
                Some("re"),
            ),
            (
                "a literal must equal the whole kernel",
                vec![literal("6.0.15", "lit")],
                None,
            ),
            (
                "no mapping covers the kernel",
                vec![literal("5.14.0", "lit"), regexp("^5\\.", "re")],
                None,
            ),
        ];
        for (name, mappings, want) in cases {
            assert_eq!(image_for(mappings, KERNEL).as_deref(), want, "{name}");
        }
    }

    #[test]
    fn mapping_settings_override_the_container_defaults() {
        let mut spec = container(vec![
            KernelMapping {
                registry_tls: Some(TlsOptions {
                    insecure: false,
                    insecure_skip_tls_verify: true,
                }),
                in_tree_modules_to_remove: vec!["mapped".to_string()],
                ..literal(KERNEL, "")
            },
            regexp("^5", "five"),
        ]);
        spec.container_image = "default:${KERNEL_X}".to_string();
        spec.in_tree_modules_to_remove = vec!["default".to_string()];
        spec.image_pull_policy = "Always".to_string();

        let config = resolve(&key(), &spec, KERNEL).unwrap().unwrap();
        assert_eq!(config.container_image, "default:6");
        assert!(config.insecure_pull);
        assert_eq!(config.in_tree_modules_to_remove, ["mapped"]);
        assert_eq!(config.image_pull_policy, "Always");
        assert_eq!(config.kernel_version, KERNEL);
        assert_eq!(config.modprobe.module_name, "my_kmod");

        // The second mapping sets nothing but the image: the defaults apply.
        spec.registry_tls.insecure = true;
        let config = resolve(&key(), &spec, "5.14.0-1").unwrap().unwrap();
        assert_eq!(config.container_image, "five");
        assert!(config.insecure_pull);
        assert_eq!(config.in_tree_modules_to_remove, ["default"]);
    }

    #[test]
    fn pull_policy_defaults_to_if_not_present() {
        let config = resolve(&key(), &container(vec![literal(KERNEL, "img")]), KERNEL)
            .unwrap()
            .unwrap();
        assert_eq!(config.image_pull_policy, "IfNotPresent");
        assert!(!config.insecure_pull);
    }

    #[test]
    fn template_variables_as_upstream_defines_them() {
        let cases = [
            ("${KERNEL_FULL_VERSION}", KERNEL),
            ("${KERNEL_VERSION}", KERNEL),
            ("${KERNEL_XYZ}", "6.0.15"),
            ("${KERNEL_X}", "6"),
            ("${KERNEL_Y}", "0"),
            ("${KERNEL_Z}", "15"),
            ("${MOD_NAME}", "my-kmod"),
            ("${MOD_NAMESPACE}", "kmm-demo"),
            ("$KERNEL_X.$KERNEL_Y", "6.0"),
            (
                "registry.example/${MOD_NAMESPACE}/${MOD_NAME}:v1-$KERNEL_FULL_VERSION",
                "registry.example/kmm-demo/my-kmod:v1-6.0.15-300.fc37.x86_64",
            ),
            ("no variables here", "no variables here"),
            ("cost: $5 or $", "cost: $5 or $"),
        ];
        for (template, want) in cases {
            assert_eq!(
                expand_image(template, KERNEL, &key()).as_deref(),
                Ok(want),
                "{template}"
            );
        }
    }

    #[test]
    fn template_errors() {
        let cases = [
            (
                "registry/${KERNEL_MAJOR}",
                KERNEL,
                TemplateError::UnknownVariable("KERNEL_MAJOR".to_string()),
            ),
            (
                "$KERNEL_XYZ_x",
                KERNEL,
                TemplateError::UnknownVariable("KERNEL_XYZ_x".to_string()),
            ),
            ("img:${KERNEL_X", KERNEL, TemplateError::Unclosed(4)),
            (
                "img:${KERNEL_Z}",
                "6.0",
                TemplateError::KernelWithoutXyz {
                    variable: "KERNEL_Z".to_string(),
                    kernel: "6.0".to_string(),
                },
            ),
        ];
        for (template, kernel, want) in cases {
            assert_eq!(
                expand_image(template, kernel, &key()),
                Err(want),
                "{template}"
            );
        }
        // A short kernel is fine as long as X, Y and Z are not asked for.
        assert_eq!(
            expand_image("img:${KERNEL_FULL_VERSION}", "test", &key()).as_deref(),
            Ok("img:test")
        );
    }

    #[test]
    fn resolution_errors_name_the_field() {
        let err = resolve(
            &key(),
            &container(vec![regexp("(", "img"), literal("x", "img")]),
            KERNEL,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            KernelMappingError::InvalidRegexp { index: 0, .. }
        ));
        assert!(
            err.to_string()
                .starts_with("kernelMappings[0].regexp \"(\"")
        );

        let err = resolve(&key(), &container(vec![literal(KERNEL, "")]), KERNEL).unwrap_err();
        assert_eq!(
            err,
            KernelMappingError::NoImage {
                index: 0,
                kernel: KERNEL.to_string()
            }
        );

        let err = resolve(
            &key(),
            &container(vec![literal("x", "a"), regexp(".", "img:${NOPE}")]),
            KERNEL,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "kernelMappings[1].containerImage \"img:${NOPE}\": unknown variable ${NOPE}; the \
             known ones are KERNEL_FULL_VERSION, KERNEL_VERSION, KERNEL_XYZ, KERNEL_X, \
             KERNEL_Y, KERNEL_Z, MOD_NAME and MOD_NAMESPACE"
        );
    }

    #[test]
    fn reference_example_resolves_for_both_mappings() {
        let mappings = vec![
            literal(KERNEL, "registry.example/org/my-kmod:v1-6.0.15"),
            regexp(
                "^.+$",
                "registry.example/org/my-kmod:v1-${KERNEL_FULL_VERSION}",
            ),
        ];
        assert_eq!(
            image_for(mappings.clone(), KERNEL).as_deref(),
            Some("registry.example/org/my-kmod:v1-6.0.15")
        );
        assert_eq!(
            image_for(mappings, "6.1.7-200.fc37.x86_64").as_deref(),
            Some("registry.example/org/my-kmod:v1-6.1.7-200.fc37.x86_64")
        );
    }
}
