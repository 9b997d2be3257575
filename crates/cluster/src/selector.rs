//! Label and field selectors, parsed and applied the way kube-apiserver does.
//!
//! Label selectors come either as the `labelSelector` query parameter string
//! (`k8s.io/apimachinery/pkg/labels`) or as a `metav1.LabelSelector` object inside a
//! spec (PDBs, DaemonSets, StatefulSets). Field selectors come as the `fieldSelector`
//! query parameter (`k8s.io/apimachinery/pkg/fields`). Error texts follow upstream so
//! that `kubectl` users see the messages they know.

use std::borrow::Cow;
use std::fmt;

use capstan_api::names::{label_value_errors, qualified_name_errors};
use serde_json::{Map, Value};

use crate::pointer::Pointer;

/// Why a label or field selector was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The label selector is malformed or one of its requirements is invalid; the text
    /// is upstream's, e.g. `unable to parse requirement: ...`.
    #[error("{0}")]
    InvalidLabelSelector(String),
    /// The field selector is malformed, e.g. `invalid selector: 'x'; can't understand 'x'`.
    #[error("{0}")]
    InvalidFieldSelector(String),
    /// The field selector names a field no kind supports.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

/// How a label requirement relates its key to its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    Exists,
    DoesNotExist,
}

/// One `key <operator> values` clause; a selector matches when all of them do.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    operator: Operator,
    /// Sorted and without duplicates, as upstream's string sets are.
    values: Vec<String>,
}

impl Requirement {
    /// Validates like upstream `labels.NewRequirement`; the error is the aggregated
    /// field-error text.
    fn new(key: &str, operator: Operator, mut values: Vec<String>) -> Result<Self, String> {
        let mut errors = Vec::new();
        if let Some(error) = validate_label_key(key, "key") {
            errors.push(error);
        }
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => errors.push(invalid(
                "values",
                &go_string_slice(&values),
                "for 'in', 'notin' operators, values set can't be empty",
            )),
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals
                if values.len() != 1 =>
            {
                errors.push(invalid(
                    "values",
                    &go_string_slice(&values),
                    "exact-match compatibility requires one single value",
                ))
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                errors.push(invalid(
                    "values",
                    &go_string_slice(&values),
                    "values set must be empty for exists and does not exist",
                ))
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    errors.push(invalid(
                        "values",
                        &go_string_slice(&values),
                        "for 'Gt', 'Lt' operators, exactly one value is required",
                    ));
                }
                for (index, value) in values.iter().enumerate() {
                    if value.parse::<i64>().is_err() {
                        errors.push(invalid(
                            &format!("values[{index}]"),
                            &format!("{value:?}"),
                            "for 'Gt', 'Lt' operators, the value must be an integer",
                        ));
                    }
                }
            }
            _ => {}
        }
        for (index, value) in values.iter().enumerate() {
            let problems = label_value_errors(value);
            if !problems.is_empty() {
                errors.push(invalid(
                    &format!("values[{index}][{key}]"),
                    &format!("{value:?}"),
                    &problems.join("; "),
                ));
            }
        }
        if !errors.is_empty() {
            return Err(aggregate(errors));
        }
        values.sort();
        values.dedup();
        Ok(Requirement {
            key: key.to_string(),
            operator,
            values,
        })
    }

    fn matches(&self, labels: &Map<String, Value>) -> bool {
        let label = labels.get(&self.key).and_then(Value::as_str);
        let has_value = |value: &str| self.values.iter().any(|v| v == value);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                label.is_some_and(has_value)
            }
            Operator::NotIn | Operator::NotEquals => !label.is_some_and(has_value),
            Operator::Exists => label.is_some(),
            Operator::DoesNotExist => label.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(actual) = label.and_then(|l| l.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(bound) = self.values.first().and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    actual > bound
                } else {
                    actual < bound
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let values = self.values.join(",");
        match self.operator {
            Operator::Exists | Operator::DoesNotExist => Ok(()),
            Operator::Equals => write!(f, "={values}"),
            Operator::DoubleEquals => write!(f, "=={values}"),
            Operator::NotEquals => write!(f, "!={values}"),
            Operator::GreaterThan => write!(f, ">{values}"),
            Operator::LessThan => write!(f, "<{values}"),
            Operator::In => write!(f, " in ({values})"),
            Operator::NotIn => write!(f, " notin ({values})"),
        }
    }
}

/// A parsed label selector: the conjunction of its requirements, sorted by key.
///
/// `Display` prints the canonical upstream form (`a=b,c in (x,y),!d`), which is what
/// `kubectl get -o wide` shows in SELECTOR columns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter syntax: `a=b`, `a==b`, `a!=b`,
    /// `a in (x,y)`, `a notin (x)`, `a` (exists), `!a` (does not exist), and upstream's
    /// `a>1` / `a<1`, comma-separated with free whitespace. The empty string selects
    /// everything.
    ///
    /// Fails with [`SelectorError::InvalidLabelSelector`] carrying upstream's text, e.g.
    /// `unable to parse requirement: <nil>: Invalid value: "a@b": name part must ...` for
    /// a bad key, or `found ')', expected: !, identifier, or 'end of string'`.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let mut requirements = Parser::new(selector)
            .parse()
            .map_err(SelectorError::InvalidLabelSelector)?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// Converts a `metav1.LabelSelector` object (`{matchLabels, matchExpressions}`) as
    /// upstream `LabelSelectorAsSelector` does.
    ///
    /// An absent or `null` selector gives `Ok(None)`: upstream treats it as selecting
    /// nothing (a policy/v1 PDB without selector covers no pods). An empty object `{}`
    /// selects everything.
    ///
    /// Fails when the value is not an object, when `matchLabels` is not a map of
    /// strings, when an expression is malformed or uses an operator other than
    /// `In`, `NotIn`, `Exists`, `DoesNotExist` (`"Foo" is not a valid label selector
    /// operator`), or when a key or value is invalid (`key: Invalid value: ...`).
    pub fn from_object(selector: Option<&Value>) -> Result<Option<Self>, SelectorError> {
        let Some(selector) = selector.filter(|s| !s.is_null()) else {
            return Ok(None);
        };
        let Value::Object(selector) = selector else {
            return Err(shape_error("a label selector must be an object"));
        };
        let mut requirements = Vec::new();
        match selector.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(match_labels)) => {
                for (key, value) in match_labels {
                    let Some(value) = value.as_str() else {
                        return Err(shape_error(&format!(
                            "matchLabels[{key:?}] must be a string"
                        )));
                    };
                    requirements.push(
                        Requirement::new(key, Operator::Equals, vec![value.to_string()])
                            .map_err(SelectorError::InvalidLabelSelector)?,
                    );
                }
            }
            Some(_) => return Err(shape_error("matchLabels must be an object")),
        }
        match selector.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(expressions)) => {
                for expression in expressions {
                    requirements.push(expression_requirement(expression)?);
                }
            }
            Some(_) => return Err(shape_error("matchExpressions must be a list")),
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Some(LabelSelector { requirements }))
    }

    /// Whether `labels` (an object's `metadata.labels`) satisfy every requirement.
    /// A label whose value is not a string counts as absent.
    pub fn matches(&self, labels: &Map<String, Value>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether the selector has no requirements, and so selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, requirement) in self.requirements.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

fn shape_error(detail: &str) -> SelectorError {
    SelectorError::InvalidLabelSelector(format!("invalid label selector: {detail}"))
}

/// One `matchExpressions` entry as a requirement.
fn expression_requirement(expression: &Value) -> Result<Requirement, SelectorError> {
    let Value::Object(expression) = expression else {
        return Err(shape_error("each of matchExpressions must be an object"));
    };
    let text = |field: &str| match expression.get(field) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(_) => Err(shape_error(&format!(
            "matchExpressions {field} must be a string"
        ))),
    };
    let key = text("key")?;
    let operator = match text("operator")? {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        other => {
            return Err(SelectorError::InvalidLabelSelector(format!(
                "{other:?} is not a valid label selector operator"
            )));
        }
    };
    let values = match expression.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(values)) => values
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| shape_error("matchExpressions values must be strings"))?,
        Some(_) => return Err(shape_error("matchExpressions values must be a list")),
    };
    Requirement::new(key, operator, values).map_err(SelectorError::InvalidLabelSelector)
}

/// Lexer tokens of the label selector syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn keyword(literal: &str) -> Option<Token> {
    Some(match literal {
        ")" => Token::ClosedPar,
        "," => Token::Comma,
        "!" => Token::DoesNotExist,
        "==" => Token::DoubleEquals,
        "=" => Token::Equals,
        ">" => Token::GreaterThan,
        "in" => Token::In,
        "<" => Token::LessThan,
        "!=" => Token::NotEquals,
        "notin" => Token::NotIn,
        "(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special_symbol(byte: u8) -> bool {
    matches!(byte, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Splits a selector into tokens, ending with `EndOfString`.
fn lex(selector: &str) -> Vec<(Token, &str)> {
    let bytes = selector.as_bytes();
    let mut tokens = Vec::new();
    let mut position = 0;
    loop {
        while position < bytes.len() && is_whitespace(bytes[position]) {
            position += 1;
        }
        let start = position;
        if start == bytes.len() {
            tokens.push((Token::EndOfString, ""));
            return tokens;
        }
        if is_special_symbol(bytes[start]) {
            // The longest run of symbols that is still a keyword; every single symbol is one.
            position += 1;
            while position < bytes.len()
                && is_special_symbol(bytes[position])
                && keyword(&selector[start..=position]).is_some()
            {
                position += 1;
            }
        } else {
            while position < bytes.len()
                && !is_special_symbol(bytes[position])
                && !is_whitespace(bytes[position])
            {
                position += 1;
            }
        }
        // Splits happen only at ASCII bytes, so the slice is on char boundaries.
        let literal = &selector[start..position];
        tokens.push((keyword(literal).unwrap_or(Token::Identifier), literal));
    }
}

/// Where the parser is: `in`/`notin` are operators after a key but plain values inside
/// a value list or after `=`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

/// Recursive-descent parser mirroring upstream's, so error texts match token for token.
struct Parser<'a> {
    tokens: Vec<(Token, &'a str)>,
    position: usize,
}

impl<'a> Parser<'a> {
    fn new(selector: &'a str) -> Self {
        Parser {
            tokens: lex(selector),
            position: 0,
        }
    }

    fn lookahead(&self, context: Context) -> (Token, &'a str) {
        let index = self.position.min(self.tokens.len() - 1);
        let (token, literal) = self.tokens[index];
        match token {
            Token::In | Token::NotIn if context == Context::Values => (Token::Identifier, literal),
            _ => (token, literal),
        }
    }

    fn consume(&mut self, context: Context) -> (Token, &'a str) {
        let item = self.lookahead(context);
        self.position += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        loop {
            let (token, literal) = self.lookahead(Context::Values);
            match token {
                Token::Identifier | Token::DoesNotExist => {
                    let requirement = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(requirement);
                    let (token, literal) = self.consume(Context::Values);
                    match token {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (next, next_literal) = self.lookahead(Context::Values);
                            if next != Token::Identifier && next != Token::DoesNotExist {
                                return Err(format!(
                                    "found '{next_literal}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => {
                            return Err(format!(
                                "found '{literal}', expected: ',' or 'end of string'"
                            ));
                        }
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(format!(
                        "found '{literal}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, unary) = self.parse_key_and_infer_operator()?;
        if let Some(operator) = unary {
            return Requirement::new(key, operator, Vec::new());
        }
        let operator = self.parse_operator()?;
        let mut values = match operator {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        // Upstream collects values in a string set, validated in sorted order.
        values.sort();
        values.dedup();
        Requirement::new(key, operator, values)
    }

    /// The key, and `Exists`/`DoesNotExist` when no binary operator follows it.
    fn parse_key_and_infer_operator(&mut self) -> Result<(&'a str, Option<Operator>), String> {
        let (mut token, mut literal) = self.consume(Context::Values);
        let negated = token == Token::DoesNotExist;
        if negated {
            (token, literal) = self.consume(Context::Values);
        }
        if token != Token::Identifier {
            return Err(format!("found '{literal}', expected: identifier"));
        }
        // Upstream validates the key here with a nil field path.
        if let Some(error) = validate_label_key(literal, "<nil>") {
            return Err(error);
        }
        let (next, _) = self.lookahead(Context::Values);
        let unary = if negated {
            Some(Operator::DoesNotExist)
        } else if matches!(next, Token::EndOfString | Token::Comma) {
            Some(Operator::Exists)
        } else {
            None
        };
        Ok((literal, unary))
    }

    fn parse_operator(&mut self) -> Result<Operator, String> {
        let (token, literal) = self.consume(Context::KeyAndOperator);
        Ok(match token {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return Err(format!(
                    "found '{literal}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        })
    }

    fn parse_values(&mut self) -> Result<Vec<String>, String> {
        let (token, literal) = self.consume(Context::Values);
        if token != Token::OpenPar {
            return Err(format!("found '{literal}' expected: '('"));
        }
        let (token, literal) = self.lookahead(Context::Values);
        match token {
            Token::Identifier | Token::Comma => {
                let values = self.parse_identifiers_list()?;
                let (token, _) = self.consume(Context::Values);
                if token != Token::ClosedPar {
                    return Err(format!("found '{literal}', expected: ')'"));
                }
                Ok(values)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(format!(
                "found '{literal}', expected: ',', ')' or identifier"
            )),
        }
    }

    /// A possibly empty list of possibly empty values: `(a,,b)` holds `""` too.
    fn parse_identifiers_list(&mut self) -> Result<Vec<String>, String> {
        let mut values: Vec<String> = Vec::new();
        loop {
            let (token, literal) = self.consume(Context::Values);
            match token {
                Token::Identifier => {
                    values.push(literal.to_string());
                    let (next, next_literal) = self.lookahead(Context::Values);
                    match next {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(values),
                        _ => return Err(format!("found '{next_literal}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if values.is_empty() {
                        values.push(String::new());
                    }
                    match self.lookahead(Context::Values).0 {
                        Token::ClosedPar => {
                            values.push(String::new());
                            return Ok(values);
                        }
                        Token::Comma => {
                            self.consume(Context::Values);
                            values.push(String::new());
                        }
                        _ => {}
                    }
                }
                _ => return Err(format!("found '{literal}', expected: ',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<Vec<String>, String> {
        let (token, _) = self.lookahead(Context::Values);
        if matches!(token, Token::EndOfString | Token::Comma) {
            return Ok(vec![String::new()]);
        }
        let (token, literal) = self.consume(Context::Values);
        if token == Token::Identifier {
            Ok(vec![literal.to_string()])
        } else {
            Err(format!("found '{literal}', expected: identifier"))
        }
    }
}

fn validate_label_key(key: &str, path: &str) -> Option<String> {
    let errors = qualified_name_errors(key);
    (!errors.is_empty()).then(|| invalid(path, &format!("{key:?}"), &errors.join("; ")))
}

/// A `field.Invalid` error's text; `value` is already formatted the way Go prints it.
fn invalid(path: &str, value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {value}: {detail}")
}

/// Go's `%#v` of a `[]string`, as field errors print bad value lists.
fn go_string_slice(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

/// Upstream `utilerrors.NewAggregate(...).Error()`: one error alone, several
/// de-duplicated in brackets.
fn aggregate(mut errors: Vec<String>) -> String {
    let mut seen = std::collections::HashSet::new();
    errors.retain(|e| seen.insert(e.clone()));
    if errors.len() == 1 {
        errors.remove(0)
    } else {
        format!("[{}]", errors.join(", "))
    }
}

/// Field names a field selector may use, whatever the kind: `metadata.name` and
/// `metadata.namespace` (every kind); Pod `spec.nodeName`, `spec.restartPolicy`,
/// `spec.schedulerName`, `spec.serviceAccountName`, `spec.hostNetwork`, `status.phase`,
/// `status.podIP`, `status.nominatedNodeName`; Node `spec.unschedulable`; core Event
/// `involvedObject.*`, `reason`, `reportingComponent`, `source`, `type`; Secret `type`;
/// Namespace `status.phase`.
///
/// Upstream checks support per kind; here support is decided by the name alone, so a
/// name valid for one kind is accepted for all and evaluates to `""` (or `"false"` for
/// booleans) on objects that lack it.
pub const SUPPORTED_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "spec.unschedulable",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// One `field=value` or `field!=value` term.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldRequirement {
    field: String,
    value: String,
    equal: bool,
}

/// A parsed field selector: the conjunction of its terms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter: comma-separated `field=value`,
    /// `field==value` or `field!=value` terms; `\,`, `\=` and `\\` escape those
    /// characters in values. The empty string selects everything. Field names are
    /// taken verbatim (no trimming), as upstream does; the legacy `spec.host` means
    /// `spec.nodeName`.
    ///
    /// Fails with [`SelectorError::InvalidFieldSelector`] for a term without operator
    /// (`invalid selector: 'x'; can't understand 'x'`) or a badly escaped value, and
    /// with [`SelectorError::UnsupportedField`] for a name outside [`SUPPORTED_FIELDS`].
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let mut terms = split_terms(selector);
        // Upstream sorts the terms, which decides which error is reported first.
        terms.sort_unstable();
        let mut requirements = Vec::new();
        for term in terms.into_iter().filter(|t| !t.is_empty()) {
            let Some((field, operator, value)) = split_term(term) else {
                return Err(SelectorError::InvalidFieldSelector(format!(
                    "invalid selector: '{selector}'; can't understand '{term}'"
                )));
            };
            requirements.push(FieldRequirement {
                field: field.to_string(),
                value: unescape_value(value)?,
                equal: operator != "!=",
            });
        }
        for requirement in &mut requirements {
            if requirement.field == "spec.host" {
                requirement.field = "spec.nodeName".to_string();
            }
            if !SUPPORTED_FIELDS.contains(&requirement.field.as_str()) {
                return Err(SelectorError::UnsupportedField(requirement.field.clone()));
            }
        }
        Ok(FieldSelector { requirements })
    }

    /// Whether `object` satisfies every term. A missing field reads as `""`
    /// (`spec.nodeName` of an unscheduled pod), a missing boolean as `"false"`.
    pub fn matches(&self, object: &Value) -> bool {
        self.requirements
            .iter()
            .all(|r| (field_value(object, &r.field) == r.value) == r.equal)
    }

    /// The value an object's `field` must equal for this selector to match, when a
    /// `field=value` term requires one (e.g. `spec.nodeName=n1`), so callers can use
    /// an index; matching candidates must still be checked with [`Self::matches`].
    pub fn required_values(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.equal && r.field == field)
            .map(|r| r.value.as_str())
    }
}

/// Splits at commas not escaped by a backslash; escapes stay in the terms.
fn split_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (index, c) in selector.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            terms.push(&selector[start..index]);
            start = index + 1;
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// Splits a term at its first operator, trying `!=` and `==` before `=` at each position.
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    term.char_indices().find_map(|(index, _)| {
        ["!=", "==", "="]
            .into_iter()
            .find(|op| term[index..].starts_with(op))
            .map(|op| (&term[..index], op, &term[index + op.len()..]))
    })
}

fn unescape_value(value: &str) -> Result<String, SelectorError> {
    let mut unescaped = String::with_capacity(value.len());
    let mut escaped = false;
    for c in value.chars() {
        if escaped {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(SelectorError::InvalidFieldSelector(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                )));
            }
            unescaped.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' || c == '=' {
            // Upstream formats the rune with %v, which prints its code point.
            return Err(SelectorError::InvalidFieldSelector(format!(
                "invalid field selector: unescaped character in value: {}",
                u32::from(c)
            )));
        } else {
            unescaped.push(c);
        }
    }
    if escaped {
        return Err(SelectorError::InvalidFieldSelector(
            "invalid field selector: invalid escape sequence: \\".to_string(),
        ));
    }
    Ok(unescaped)
}

/// The string upstream's selectable-fields set holds for `field` of `object`.
fn field_value<'a>(object: &'a Value, field: &str) -> Cow<'a, str> {
    let lookup = |pointer: &str| object.at(pointer).map_or(Cow::Borrowed(""), scalar_text);
    match field {
        "spec.unschedulable" | "spec.hostNetwork" => {
            let pointer = format!("/{}", field.replace('.', "/"));
            let set = object.at(&pointer).and_then(Value::as_bool) == Some(true);
            Cow::Borrowed(if set { "true" } else { "false" })
        }
        // Upstream reads podIPs[0]; podIP mirrors it and is all some writers set.
        "status.podIP" => match object.at("/status/podIPs/0/ip").map(scalar_text) {
            Some(ip) if !ip.is_empty() => ip,
            _ => lookup("/status/podIP"),
        },
        "source" => match object.at("/source/component").map(scalar_text) {
            Some(component) if !component.is_empty() => component,
            _ => lookup("/reportingComponent"),
        },
        _ => lookup(&format!("/{}", field.replace('.', "/"))),
    }
}

fn scalar_text(value: &Value) -> Cow<'_, str> {
    match value {
        Value::String(s) => Cow::Borrowed(s),
        Value::Bool(b) => Cow::Borrowed(if *b { "true" } else { "false" }),
        Value::Number(n) => Cow::Owned(n.to_string()),
        _ => Cow::Borrowed(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => panic!("labels must be an object"),
        }
    }

    #[test]
    fn label_selector_matches_every_operator() {
        let app_web = labels(json!({"app": "web", "tier": "front", "n": "5"}));
        let app_db = labels(json!({"app": "db"}));
        let none = labels(json!({}));
        // (selector, matches app_web, matches app_db, matches none)
        let cases = [
            ("", true, true, true),
            ("app=web", true, false, false),
            ("app==web", true, false, false),
            ("app!=web", false, true, true),
            ("app in (web,db)", true, true, false),
            ("app in (api)", false, false, false),
            ("app notin (web)", false, true, true),
            ("tier", true, false, false),
            ("!tier", false, true, true),
            ("app=web,tier=front", true, false, false),
            ("app=web,!tier", false, false, false),
            ("  app  in  ( web , db ) , ! tier ", false, true, false),
            ("n>4", true, false, false),
            ("n<5", false, false, false),
            ("app=", false, false, false),
            ("app in (,web)", true, false, false),
            ("app notin ()", true, true, true),
            ("in in (in)", false, false, false),
        ];
        for (selector, web, db, empty) in cases {
            let parsed = LabelSelector::parse(selector).expect(selector);
            assert_eq!(parsed.matches(&app_web), web, "{selector} on app_web");
            assert_eq!(parsed.matches(&app_db), db, "{selector} on app_db");
            assert_eq!(parsed.matches(&none), empty, "{selector} on no labels");
        }
    }

    #[test]
    fn label_selector_keywords_are_values_in_value_position() {
        let parsed = LabelSelector::parse("x in (in,notin),y=in").expect("parses");
        assert!(parsed.matches(&labels(json!({"x": "notin", "y": "in"}))));
        assert_eq!(parsed.to_string(), "x in (in,notin),y=in");
    }

    #[test]
    fn label_selector_prints_canonically() {
        let cases = [
            ("b=1, a in (z,y)", "a in (y,z),b=1"),
            ("!c,a!=1,b==2", "a!=1,b==2,!c"),
            ("k notin (x)", "k notin (x)"),
            ("k", "k"),
            ("n>3,m<2", "m<2,n>3"),
            ("x in (a,,b)", "x in (,a,b)"),
        ];
        for (selector, printed) in cases {
            let parsed = LabelSelector::parse(selector).expect(selector);
            assert_eq!(parsed.to_string(), printed, "{selector}");
        }
    }

    #[test]
    fn label_selector_errors_follow_upstream() {
        let name_part = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
        let value_part = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
        let cases = [
            (
                "a@b=c".to_string(),
                format!("unable to parse requirement: <nil>: Invalid value: \"a@b\": {name_part}"),
            ),
            (
                "a=b@c".to_string(),
                format!(
                    "unable to parse requirement: values[0][a]: Invalid value: \"b@c\": {value_part}"
                ),
            ),
            (
                "a in (b".to_string(),
                "unable to parse requirement: found '', expected: ',' or ')'".to_string(),
            ),
            (
                "a in b".to_string(),
                "unable to parse requirement: found 'b' expected: '('".to_string(),
            ),
            (
                "a b".to_string(),
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
                    .to_string(),
            ),
            (
                "a=b c".to_string(),
                "found 'c', expected: ',' or 'end of string'".to_string(),
            ),
            (
                "a=b,".to_string(),
                "found '', expected: identifier after ','".to_string(),
            ),
            (
                ",a".to_string(),
                "found ',', expected: !, identifier, or 'end of string'".to_string(),
            ),
            (
                "!".to_string(),
                "unable to parse requirement: found '', expected: identifier".to_string(),
            ),
            (
                "a in (b@,b@)".to_string(),
                format!(
                    "unable to parse requirement: values[0][a]: Invalid value: \"b@\": {value_part}"
                ),
            ),
            (
                "a>b".to_string(),
                "unable to parse requirement: values[0]: Invalid value: \"b\": for 'Gt', 'Lt' operators, the value must be an integer".to_string(),
            ),
            (
                "a/b/c".to_string(),
                format!(
                    "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                    name_part.trim_start_matches("name part ")
                ),
            ),
            (
                "Example.com/x".to_string(),
                "unable to parse requirement: <nil>: Invalid value: \"Example.com/x\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_string(),
            ),
            (
                format!("{}=x", "k".repeat(64)),
                format!(
                    "unable to parse requirement: <nil>: Invalid value: \"{}\": name part must be no more than 63 characters",
                    "k".repeat(64)
                ),
            ),
        ];
        for (selector, message) in cases {
            let error = LabelSelector::parse(&selector).expect_err(&selector);
            assert_eq!(
                error,
                SelectorError::InvalidLabelSelector(message),
                "{selector}"
            );
        }
    }

    #[test]
    fn label_selector_accepts_prefixed_keys() {
        let parsed =
            LabelSelector::parse("node-role.kubernetes.io/control-plane").expect("valid key");
        assert!(parsed.matches(&labels(
            json!({"node-role.kubernetes.io/control-plane": ""})
        )));
        assert!(!parsed.is_empty());
        assert!(LabelSelector::parse("").expect("empty").is_empty());
    }

    #[test]
    fn label_selector_from_object() {
        let pod = labels(json!({"app": "web", "tier": "front"}));
        // (selector, matches pod)
        let cases = [
            (json!({}), true),
            (json!({"matchLabels": {"app": "web"}}), true),
            (json!({"matchLabels": {"app": "db"}}), false),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "back"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist", "values": null}]}),
                false,
            ),
            (
                json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "gone", "operator": "DoesNotExist"}]}),
                true,
            ),
            (json!({"matchLabels": null, "matchExpressions": null}), true),
        ];
        for (selector, matches) in cases {
            let parsed = LabelSelector::from_object(Some(&selector))
                .expect("valid")
                .expect("present");
            assert_eq!(parsed.matches(&pod), matches, "{selector}");
        }
        assert_eq!(LabelSelector::from_object(None), Ok(None));
        assert_eq!(LabelSelector::from_object(Some(&Value::Null)), Ok(None));
        assert!(
            LabelSelector::from_object(Some(&json!({})))
                .expect("valid")
                .expect("present")
                .is_empty()
        );
    }

    #[test]
    fn label_selector_from_object_prints_sorted() {
        let selector = json!({
            "matchLabels": {"z": "1", "a": "2"},
            "matchExpressions": [{"key": "m", "operator": "In", "values": ["y", "x"]}]
        });
        let parsed = LabelSelector::from_object(Some(&selector))
            .expect("valid")
            .expect("present");
        assert_eq!(parsed.to_string(), "a=2,m in (x,y),z=1");
    }

    #[test]
    fn label_selector_from_object_errors() {
        let cases = [
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
                "\"Gt\" is not a valid label selector operator",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
                "values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
                "values: Invalid value: []string{\"x\"}: values set must be empty for exists and does not exist",
            ),
            (
                json!({"matchLabels": {"a": 1}}),
                "invalid label selector: matchLabels[\"a\"] must be a string",
            ),
            (
                json!("app=web"),
                "invalid label selector: a label selector must be an object",
            ),
        ];
        for (selector, message) in cases {
            let error = LabelSelector::from_object(Some(&selector)).expect_err("invalid");
            assert_eq!(
                error,
                SelectorError::InvalidLabelSelector(message.to_string()),
                "{selector}"
            );
        }
        let error = LabelSelector::from_object(Some(&json!({"matchLabels": {"bad key": "x y"}})))
            .expect_err("invalid");
        let SelectorError::InvalidLabelSelector(message) = error else {
            panic!("wrong error kind");
        };
        assert!(
            message.starts_with("[key: Invalid value: \"bad key\": name part"),
            "{message}"
        );
        assert!(
            message.contains(", values[0][bad key]: Invalid value: \"x y\""),
            "{message}"
        );
    }

    #[test]
    fn field_selector_matches() {
        let pod = json!({
            "metadata": {"name": "web-1", "namespace": "default"},
            "spec": {"nodeName": "n1", "restartPolicy": "Always", "schedulerName": "default-scheduler"},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.5"}]}
        });
        let pending = json!({"metadata": {"name": "web-2", "namespace": "default"}, "spec": {}});
        let node = json!({"metadata": {"name": "n1"}, "spec": {"unschedulable": true}});
        let event = json!({
            "metadata": {"name": "e1", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": "default", "uid": "u-1"},
            "reason": "Scheduled", "type": "Normal", "reportingComponent": "scheduler"
        });
        // (selector, object, matches)
        let cases = [
            ("", &pod, true),
            ("metadata.name=web-1", &pod, true),
            ("metadata.name==web-1", &pod, true),
            ("metadata.name!=web-1", &pod, false),
            ("metadata.namespace=default,spec.nodeName=n1", &pod, true),
            ("spec.nodeName=n2", &pod, false),
            ("spec.nodeName=", &pending, true),
            ("spec.nodeName=n1", &pending, false),
            ("spec.host=n1", &pod, true),
            ("status.phase=Running", &pod, true),
            ("status.phase!=Running", &pending, true),
            ("status.podIP=10.0.0.5", &pod, true),
            (
                "spec.restartPolicy=Always,spec.schedulerName=default-scheduler",
                &pod,
                true,
            ),
            ("spec.unschedulable=true", &node, true),
            ("spec.unschedulable=false", &pending, true),
            ("metadata.namespace=", &node, true),
            (
                "involvedObject.kind=Pod,involvedObject.name=web-1",
                &event,
                true,
            ),
            (
                "involvedObject.namespace=default,involvedObject.uid=u-1",
                &event,
                true,
            ),
            ("reason=Scheduled,type=Normal", &event, true),
            ("source=scheduler", &event, true),
            ("involvedObject.name=web-2", &event, false),
        ];
        for (selector, object, matches) in cases {
            let parsed = FieldSelector::parse(selector).expect(selector);
            assert_eq!(parsed.matches(object), matches, "{selector}");
        }
    }

    #[test]
    fn field_selector_unescapes_values() {
        let object = json!({"metadata": {"name": "a,b=c\\d"}});
        let parsed = FieldSelector::parse("metadata.name=a\\,b\\=c\\\\d").expect("escaped");
        assert!(parsed.matches(&object));
    }

    #[test]
    fn field_selector_errors_follow_upstream() {
        let cases = [
            (
                "foo=bar",
                SelectorError::UnsupportedField("foo".to_string()),
            ),
            (
                "metadata.name = x",
                SelectorError::UnsupportedField("metadata.name ".to_string()),
            ),
            (
                "metadata.name",
                SelectorError::InvalidFieldSelector(
                    "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
                        .to_string(),
                ),
            ),
            (
                "spec.nodeName=n1,status.phase",
                SelectorError::InvalidFieldSelector(
                    "invalid selector: 'spec.nodeName=n1,status.phase'; can't understand 'status.phase'"
                        .to_string(),
                ),
            ),
            (
                "metadata.name=a=b",
                SelectorError::InvalidFieldSelector(
                    "invalid field selector: unescaped character in value: 61".to_string(),
                ),
            ),
            (
                "metadata.name=a\\b",
                SelectorError::InvalidFieldSelector(
                    "invalid field selector: invalid escape sequence: \\b".to_string(),
                ),
            ),
            (
                "metadata.name=a\\",
                SelectorError::InvalidFieldSelector(
                    "invalid field selector: invalid escape sequence: \\".to_string(),
                ),
            ),
        ];
        for (selector, error) in cases {
            assert_eq!(
                FieldSelector::parse(selector),
                Err(error.clone()),
                "{selector}"
            );
        }
        assert_eq!(
            SelectorError::UnsupportedField("foo".to_string()).to_string(),
            "field label not supported: foo"
        );
    }

    #[test]
    fn field_selector_required_values() {
        let parsed = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed").expect("valid");
        assert_eq!(parsed.required_values("spec.nodeName"), Some("n1"));
        assert_eq!(parsed.required_values("status.phase"), None);
        assert_eq!(parsed.required_values("metadata.name"), None);
        let legacy = FieldSelector::parse("spec.host=n2").expect("valid");
        assert_eq!(legacy.required_values("spec.nodeName"), Some("n2"));
    }
}
