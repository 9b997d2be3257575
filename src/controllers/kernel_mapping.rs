//! Kernel mappings: the kmod image and load settings a Module uses on one kernel.
//!
//! Mappings are tried in list order and the first whose `literal` equals the kernel, or whose
//! `regexp` matches it (unanchored, as Go's `regexp.MatchString`), wins. A mapping's
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
//! The kernel variables hold the kernel as upstream's `kernel.NormalizeVersion` writes it,
//! every character other than a letter, digit, `.`, `_` or `-` replaced by `_` (so
//! `6.6.31+rpt-rpi-v8` gives `6.6.31_rpt-rpi-v8`, a valid image tag); the config's
//! `kernelVersion` keeps the kernel as the node reports it. X, Y and Z are the first three
//! parts of that normalized kernel split at `.` and `-` (upstream also splits at `,`, which
//! the normalization has replaced already); a kernel with fewer than three
//! parts (such as the empty one of a node that reports none yet) gets no config, whatever the
//! template, as upstream's `KernelComponentsAsEnvVars` refuses it.
//!
//! Templates follow upstream's envsubst: `$$` is a literal `$`; `${NAME:-word}` and
//! `${NAME:=word}` give the word when the value is empty, `${NAME-word}` and `${NAME=word}`
//! the value (every known variable is set), `${NAME+word}` and `${NAME:+word}` the word; an
//! empty word gives the value. A `$` before no name, before a digit, or as `$_` is kept as
//! written. Upstream replaces an unknown variable by nothing and so pulls an image nobody
//! named; here it is an error, as are other `${...}` forms, which upstream reads in ways no
//! shell does.

use std::convert::Infallible;

use regex::Regex;
use thiserror::Error;

use capstan_api::labels::ModuleKey;
use capstan_api::module::{KernelMapping, ModuleLoaderContainerSpec};
use capstan_api::nmc::ModuleConfig;
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
    /// The kernel has fewer than three parts, which the template variables need.
    #[error(
        "kernelMappings[{index}] matches kernel {kernel:?}, but it has fewer than three parts \
         (major.minor.patch) separated by '.' or '-'"
    )]
    ShortKernel {
        /// Index of the matching mapping.
        index: usize,
        /// The kernel, as the node reports it.
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
    /// A kernel with fewer than three parts, whatever the template uses.
    #[error(
        "the kernel {0:?} has fewer than three parts (major.minor.patch) separated by '.' or '-'"
    )]
    ShortKernel(String),
    /// `${` without its `}`.
    #[error("the \"${{\" at character {0} has no closing \"}}\"")]
    Unclosed(usize),
    /// A `${...}` that is neither a variable nor a variable, an operator and plain text.
    #[error(
        "{0:?} is not supported: use ${{NAME}} or ${{NAME<operator>word}}, the operator one of \
         :-, -, :=, =, :+ and +, the word plain text without $ (such as ${{KERNEL_Z:-0}})"
    )]
    Unsupported(String),
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

/// Why `pattern` cannot be a mapping's `regexp`; `None` when it compiles.
pub fn regexp_problem(pattern: &str) -> Option<String> {
    compiled(pattern).err()
}

/// The mapping for `kernel`, with its index: the first in list order whose `literal` equals
/// the kernel or whose `regexp` matches it, as upstream's `findKernelMapping`; `None` when no
/// mapping covers the kernel.
///
/// Fails when a `regexp` tried before a match does not compile.
pub fn find_mapping<'a>(
    mappings: &'a [KernelMapping],
    kernel: &str,
) -> Result<Option<(usize, &'a KernelMapping)>, KernelMappingError> {
    for (index, mapping) in mappings.iter().enumerate() {
        if !mapping.literal.is_empty() && mapping.literal == kernel {
            return Ok(Some((index, mapping)));
        }
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
/// Fails as [`find_mapping`], when the kernel has fewer than three parts, when no image is
/// named, or when the image template does not expand ([`expand_image`]).
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
    let variables = Variables::new(kernel, key).ok_or_else(|| KernelMappingError::ShortKernel {
        index,
        kernel: kernel.to_string(),
    })?;
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
        variables
            .expand(template)
            .map_err(|reason| KernelMappingError::Template {
                field,
                template: template.clone(),
                reason,
            })?;
    let tls = mapping
        .registry_tls
        .as_ref()
        .unwrap_or(&container.registry_tls);
    Ok(Some(ModuleConfig {
        kernel_version: kernel.to_string(),
        container_image,
        insecure_pull: tls.insecure || tls.insecure_skip_tls_verify,
        modprobe: container.modprobe.clone(),
        // Written as the Module has it, unset included, as upstream writes it: an NMC
        // written by either compares equal (see `ModuleConfig`'s equality).
        image_pull_policy: container.image_pull_policy.clone(),
        in_tree_modules_to_remove: mapping.in_tree_modules_for(container),
        // The deprecated single module is folded into the list above.
        in_tree_module_to_remove: String::new(),
    }))
}

/// Expands the template variables of `template` (see the module docs) for `kernel` and
/// Module `key`.
///
/// Fails on a kernel with fewer than three parts (whatever the template uses), an unknown
/// variable, an unclosed `${` or an unsupported `${...}` form.
pub fn expand_image(
    template: &str,
    kernel: &str,
    key: &ModuleKey,
) -> Result<String, TemplateError> {
    Variables::new(kernel, key)
        .ok_or_else(|| TemplateError::ShortKernel(kernel.to_string()))?
        .expand(template)
}

/// `kernel` with every character other than an ASCII letter, digit, `.`, `_` or `-`
/// replaced by `_`, as upstream's `kernel.NormalizeVersion`.
pub fn normalized_kernel(kernel: &str) -> String {
    kernel
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The values of the template variables for one kernel and Module.
struct Variables<'a> {
    /// The normalized kernel.
    kernel: String,
    /// Its first three parts.
    xyz: [String; 3],
    key: &'a ModuleKey,
}

impl<'a> Variables<'a> {
    /// `None` when the normalized kernel has fewer than three parts.
    fn new(kernel: &str, key: &'a ModuleKey) -> Option<Self> {
        let kernel = normalized_kernel(kernel);
        let mut parts = kernel.split(['.', ',', '-']);
        let xyz = [parts.next()?, parts.next()?, parts.next()?].map(str::to_string);
        Some(Variables { kernel, xyz, key })
    }

    /// The value of variable `name`; `None` when it is not one of [`TEMPLATE_VARIABLES`].
    fn value(&self, name: &str) -> Option<String> {
        Some(match name {
            "KERNEL_FULL_VERSION" | "KERNEL_VERSION" => self.kernel.clone(),
            "KERNEL_XYZ" => self.xyz.join("."),
            "KERNEL_X" => self.xyz[0].clone(),
            "KERNEL_Y" => self.xyz[1].clone(),
            "KERNEL_Z" => self.xyz[2].clone(),
            "MOD_NAME" => self.key.name().to_string(),
            "MOD_NAMESPACE" => self.key.namespace().to_string(),
            _ => return None,
        })
    }

    fn known(&self, name: &str) -> Result<String, TemplateError> {
        self.value(name)
            .ok_or_else(|| TemplateError::UnknownVariable(name.to_string()))
    }

    fn expand(&self, template: &str) -> Result<String, TemplateError> {
        let mut expanded = String::with_capacity(template.len());
        let mut rest = template;
        while let Some(dollar) = rest.find('$') {
            expanded.push_str(&rest[..dollar]);
            let after = &rest[dollar + 1..];
            if let Some(escaped) = after.strip_prefix('$') {
                expanded.push('$');
                rest = escaped;
            } else if let Some(braced) = after.strip_prefix('{') {
                let Some(close) = braced.find('}') else {
                    let at = template[..template.len() - rest.len() + dollar]
                        .chars()
                        .count();
                    return Err(TemplateError::Unclosed(at));
                };
                expanded.push_str(&self.braced(&braced[..close])?);
                rest = &braced[close + 1..];
            } else {
                let name = &after[..name_length(after)];
                // Upstream reads `$1` as a positional parameter, always empty; no image
                // reference means that, so it stays text, like a lone `$` and `$_`.
                if name.is_empty() || name == "_" || name.starts_with(|c: char| c.is_ascii_digit())
                {
                    expanded.push('$');
                    rest = after;
                    continue;
                }
                expanded.push_str(&self.known(name)?);
                rest = &after[name.len()..];
            }
        }
        expanded.push_str(rest);
        Ok(expanded)
    }

    /// The value of `${inner}`: a variable, or a variable, an operator and a word.
    fn braced(&self, inner: &str) -> Result<String, TemplateError> {
        let unsupported = || TemplateError::Unsupported(format!("${{{inner}}}"));
        let (name, rest) = inner.split_at(name_length(inner));
        if name.is_empty() {
            return Err(unsupported());
        }
        let value = self.known(name)?;
        if rest.is_empty() {
            return Ok(value);
        }
        let (operator, word) = [":-", ":=", ":+", "-", "=", "+"]
            .into_iter()
            .find_map(|operator| Some((operator, rest.strip_prefix(operator)?)))
            .ok_or_else(unsupported)?;
        // Upstream reads a `$` in the word as the start of another variable, and a line
        // break as the end of the template.
        if word.contains(['$', '\n', '\r']) {
            return Err(unsupported());
        }
        // Every known variable is set: `-` and `=` give its value, `+` and `:+` (upstream
        // tests both for set only) the word, `:-` and `:=` the word for an empty value. An
        // empty word gives the value, as upstream.
        Ok(match operator {
            _ if word.is_empty() => value,
            ":-" | ":=" if value.is_empty() => word.to_string(),
            "+" | ":+" => word.to_string(),
            _ => value,
        })
    }
}

/// Length of the variable name `text` starts with: letters, digits and `_`, as upstream's
/// lexer reads one.
fn name_length(text: &str) -> usize {
    text.find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::module::{ModprobeSpec, TlsOptions};
    use capstan_api::nmc::DEFAULT_IMAGE_PULL_POLICY;

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
                "an earlier matching regexp wins over a literal",
                vec![regexp("^.+$", "re"), literal(KERNEL, "lit")],
                Some("re"),
            ),
            (
                "an earlier literal wins over a matching regexp",
                vec![literal(KERNEL, "lit"), regexp("^.+$", "re")],
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
                in_tree_modules_to_remove: Some(vec!["mapped".to_string()]),
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
    fn an_unset_pull_policy_is_written_unset_and_equals_the_default() {
        let config = resolve(&key(), &container(vec![literal(KERNEL, "img")]), KERNEL)
            .unwrap()
            .unwrap();
        assert_eq!(config.image_pull_policy, "");
        assert_eq!(
            config,
            ModuleConfig {
                image_pull_policy: DEFAULT_IMAGE_PULL_POLICY.to_string(),
                ..config.clone()
            }
        );
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
                TemplateError::ShortKernel("6.0".to_string()),
            ),
            // Upstream refuses a short kernel whatever the template uses.
            (
                "img:${KERNEL_FULL_VERSION}",
                "test",
                TemplateError::ShortKernel("test".to_string()),
            ),
            ("img:v1", "", TemplateError::ShortKernel(String::new())),
            // The unknown variable stays an error behind an operator too.
            (
                "img:${NOPE:-v1}",
                KERNEL,
                TemplateError::UnknownVariable("NOPE".to_string()),
            ),
            (
                "img:$_x",
                KERNEL,
                TemplateError::UnknownVariable("_x".to_string()),
            ),
            (
                "img:${KERNEL_X:2}",
                KERNEL,
                TemplateError::Unsupported("${KERNEL_X:2}".to_string()),
            ),
            (
                "img:${KERNEL_X.y}",
                KERNEL,
                TemplateError::Unsupported("${KERNEL_X.y}".to_string()),
            ),
            (
                "img:${KERNEL_X:-$MOD_NAME}",
                KERNEL,
                TemplateError::Unsupported("${KERNEL_X:-$MOD_NAME}".to_string()),
            ),
            (
                "img:${}",
                KERNEL,
                TemplateError::Unsupported("${}".to_string()),
            ),
            (
                "img:${-v1}",
                KERNEL,
                TemplateError::Unsupported("${-v1}".to_string()),
            ),
        ];
        for (template, kernel, want) in cases {
            assert_eq!(
                expand_image(template, kernel, &key()),
                Err(want),
                "{template}"
            );
        }
    }

    #[test]
    fn envsubst_forms_as_upstream_reads_them() {
        // (template, kernel, expanded)
        let cases = [
            ("img:$$KERNEL_X", KERNEL, "img:$KERNEL_X"),
            ("img:$${KERNEL_X}", KERNEL, "img:${KERNEL_X}"),
            ("img:$$$KERNEL_X", KERNEL, "img:$6"),
            ("img:a$$", KERNEL, "img:a$"),
            ("img:$_-x", KERNEL, "img:$_-x"),
            ("img:${KERNEL_Z:-0}", "6.0.15-1", "img:15"),
            ("img:${KERNEL_X-9}", KERNEL, "img:6"),
            ("img:${KERNEL_X=9}", KERNEL, "img:6"),
            ("img:${KERNEL_X:=9}", KERNEL, "img:6"),
            ("img:${KERNEL_X+set}", KERNEL, "img:set"),
            ("img:${KERNEL_X:+set}", KERNEL, "img:set"),
            ("img:${MOD_NAME:-a-b:c}", KERNEL, "img:my-kmod"),
            // An empty word gives the value, whatever the operator.
            ("img:${KERNEL_X:-}", KERNEL, "img:6"),
            ("img:${KERNEL_X+}", KERNEL, "img:6"),
            // An empty part is set but empty: only :- and := give the word.
            ("img:${KERNEL_Y:-0}", "6..15-1", "img:0"),
            ("img:${KERNEL_Y:=0}", "6..15-1", "img:0"),
            ("img:${KERNEL_Y-0}", "6..15-1", "img:"),
            ("img:${KERNEL_Y=0}", "6..15-1", "img:"),
            ("img:${KERNEL_Y:+set}", "6..15-1", "img:set"),
        ];
        for (template, kernel, want) in cases {
            assert_eq!(
                expand_image(template, kernel, &key()).as_deref(),
                Ok(want),
                "{template} on {kernel:?}"
            );
        }
    }

    #[test]
    fn kernels_are_normalized_as_upstream() {
        // Upstream's NormalizeVersion table, and a character outside ASCII.
        let cases = [
            ("1.2.3-4", "1.2.3-4"),
            ("1.2.3+4", "1.2.3_4"),
            ("1.2.3_4", "1.2.3_4"),
            ("1.2.3&4", "1.2.3_4"),
            ("1.2.3%4", "1.2.3_4"),
            ("1.2.3?4", "1.2.3_4"),
            ("1.2.3 4", "1.2.3_4"),
            ("1.2.3\u{e9}4", "1.2.3_4"),
            (KERNEL, KERNEL),
        ];
        for (kernel, want) in cases {
            assert_eq!(normalized_kernel(kernel), want, "{kernel:?}");
        }
    }

    #[test]
    fn templates_get_the_normalized_kernel_and_the_config_the_reported_one() {
        const PI: &str = "6.6.31+rpt-rpi-v8";
        let cases = [
            ("img:${KERNEL_FULL_VERSION}", "img:6.6.31_rpt-rpi-v8"),
            ("img:${KERNEL_VERSION}", "img:6.6.31_rpt-rpi-v8"),
            // The `+` is gone before the split, so Z runs on to the next `-`.
            ("img:$KERNEL_XYZ", "img:6.6.31_rpt"),
            ("img:${KERNEL_X}.${KERNEL_Y}.${KERNEL_Z}", "img:6.6.31_rpt"),
        ];
        for (template, want) in cases {
            let config = resolve(&key(), &container(vec![regexp("^6", template)]), PI)
                .unwrap()
                .unwrap();
            assert_eq!(config.container_image, want, "{template}");
            assert_eq!(config.kernel_version, PI);
        }
        // A ',' is normalized before the kernel is split, so it separates no parts.
        assert_eq!(
            expand_image("img:$KERNEL_X", "6,0,15", &key()),
            Err(TemplateError::ShortKernel("6,0,15".to_string()))
        );
    }

    #[test]
    fn a_kernel_without_three_parts_gets_no_config() {
        // (kernel, whether it resolves)
        let cases = [
            ("", false),
            ("6", false),
            ("6.0", false),
            ("test", false),
            ("6,0,15", false),
            ("6.0.15", true),
            ("6..15", true),
            ("6.0-1", true),
        ];
        for (kernel, resolves) in cases {
            let found = resolve(&key(), &container(vec![regexp(".*", "img:v1")]), kernel);
            if resolves {
                assert_eq!(
                    found.unwrap().unwrap().container_image,
                    "img:v1",
                    "{kernel:?}"
                );
            } else {
                assert_eq!(
                    found,
                    Err(KernelMappingError::ShortKernel {
                        index: 0,
                        kernel: kernel.to_string()
                    }),
                    "{kernel:?}"
                );
            }
        }
        let err = resolve(&key(), &container(vec![regexp(".*", "img:v1")]), "").unwrap_err();
        assert_eq!(
            err.to_string(),
            "kernelMappings[0] matches kernel \"\", but it has fewer than three parts \
             (major.minor.patch) separated by '.' or '-'"
        );
    }

    #[test]
    fn an_empty_in_tree_list_on_the_mapping_removes_nothing() {
        let mut spec = container(vec![KernelMapping {
            in_tree_modules_to_remove: Some(Vec::new()),
            ..literal(KERNEL, "img:v1")
        }]);
        spec.in_tree_modules_to_remove = vec!["a".to_string()];
        let config = resolve(&key(), &spec, KERNEL).unwrap().unwrap();
        assert_eq!(config.in_tree_modules_to_remove, Vec::<String>::new());
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
