//! The subset of Kubernetes JSONPath that CRD printer columns are written in.

use std::cmp::Ordering;

use serde_json::Value;

/// The subset of Kubernetes JSONPath that CRD printer columns use: `.a.b`,
/// `.a[0]`, `.a[-1]`, `.a[*].b`, `.a['b.c']`, `.labels.x\.y` (escaped dots),
/// `.*`, and filters `[?(@.type=="Ready")]` with `==`, `!=`, `<`, `<=`, `>`, `>=` or
/// existence `[?(@.x)]`. Slices, unions and recursive descent are not supported.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct JsonPath {
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
    pub(super) fn parse(path: &str) -> Option<Self> {
        let path = path.trim();
        let path = path.strip_prefix('$').unwrap_or(path);
        parse_steps(path).map(|steps| JsonPath { steps })
    }

    /// The first result, which is all upstream shows in a cell.
    pub(super) fn first<'a>(&self, root: &'a Value) -> Option<&'a Value> {
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
    use serde_json::json;

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
