//! A pull request cannot reshape its own plan comment: names, paths and values built to
//! break a table row, hide the rest behind an HTML comment, add raw HTML or a heading,
//! mention someone or close a diff's code fence are shown as text, as GitHub's renderer
//! (cmark-gfm) renders the markdown plan.

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::common;
use crate::fleet;

use common::git::{FleetRepo, with_changes};
use fleet::{capstan, fleet_v1, stdout};
use serde_json::Value;

fn config_map(name: &str, value: &str) -> String {
    let name = serde_json::to_string(name).expect("a string");
    let value = serde_json::to_string(value).expect("a string");
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: kmm-demo\n\
         data:\n  value: {value}\n"
    )
}

/// The plan's markdown rendered as GitHub renders it (before its sanitizer), failing
/// clearly when cmark-gfm is not installed.
fn cmark_gfm(markdown: &str) -> String {
    crate::registry::ensure_packages();
    let mut child = match Command::new("cmark-gfm")
        .args(["--extension", "table", "--extension", "strikethrough"])
        .args([
            "--extension",
            "autolink",
            "--extension",
            "tagfilter",
            "--unsafe",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(error) => panic!(
            "cannot run cmark-gfm ({error}): this test renders the plan with GitHub's \
             renderer; install it (`apt-get install -y cmark-gfm` on Debian)"
        ),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(markdown.as_bytes())
        .expect("write to cmark-gfm");
    let output = child.wait_with_output().expect("cmark-gfm ends");
    assert!(output.status.success(), "cmark-gfm failed");
    String::from_utf8(output.stdout).expect("utf-8 HTML")
}

/// `html` without what is inside `<code>` and `<pre>` elements, where GitHub links no
/// mention.
fn outside_code(html: &str) -> String {
    let mut rest = html;
    let mut out = String::new();
    loop {
        let next = [("<code", "</code>"), ("<pre", "</pre>")]
            .iter()
            .filter_map(|(open, close)| rest.find(open).map(|at| (at, *close)))
            .min();
        let Some((at, close)) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..at]);
        rest = match rest[at..].find(close) {
            Some(end) => &rest[at + end + close.len()..],
            None => "",
        };
    }
}

#[test]
fn a_hostile_pull_request_cannot_reshape_its_plan_comment() {
    let long = format!("{}````\n```\n~~~~ the end", "a".repeat(70_000));
    let head = with_changes(
        &fleet_v1(),
        &[
            (
                "fleet/hidden.yaml",
                Some(config_map("hidden", "x\n<!-- hidden")),
            ),
            (
                "fleet/f`<img src=x>`.yaml",
                Some(config_map("img", "an image in the path")),
            ),
            (
                "fleet/a\n\n# a heading.yaml",
                Some(config_map("heading", "a heading in the path")),
            ),
            (
                "fleet/mention.yaml",
                Some(config_map(
                    "mention",
                    "@octocat </details> <script>alert(1)</script> <!-- x -->",
                )),
            ),
            ("fleet/long.yaml", Some(config_map("long", &long))),
            (
                "fleet/zzz-last.yaml",
                Some(config_map("zzz-last", "the last object")),
            ),
        ],
    );
    let fleet = FleetRepo::proposal(&fleet_v1(), &head);
    let args = ["plan", "--path", "fleet", "--pull-request", "7", "--format"];
    let json = capstan(fleet.path(), &[&args[..], &["json"]].concat());
    let plan: Value = serde_json::from_str(&stdout(&json)).expect("a JSON plan");
    let objects = plan["objects"].as_array().expect("objects").len();
    assert!(objects >= 6, "{plan}");

    let output = capstan(fleet.path(), &[&args[..], &["markdown"]].concat());
    let markdown = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{markdown}");
    // Parts as the CLI separates them, each a comment rendered alone.
    let parts: Vec<String> = markdown
        .split("\n<!-- capstan plan: part ")
        .map(|part| match part.split_once("-->\n") {
            Some((number, rest)) if number.trim_end().parse::<u32>().is_ok() => rest.to_string(),
            _ => part.to_string(),
        })
        .collect();
    let htmls: Vec<String> = parts.iter().map(|part| cmark_gfm(part)).collect();
    let html = htmls.concat();
    let context = format!("markdown:\n{markdown}\nHTML:\n{html}");
    for part in &htmls {
        // Each part's diffs are whole: one code block in each `<details>`.
        let details = part.matches("<details>").count();
        assert_eq!(details, part.matches("</details>").count(), "{context}");
        assert_eq!(details, part.matches("<pre").count(), "{context}");
    }
    // Every object is one row of the table, which is the only one.
    assert_eq!(html.matches("<table>").count(), 1, "{context}");
    let table = &html[html.find("<table>").unwrap()..html.find("</table>").unwrap()];
    assert_eq!(table.matches("<tr>").count(), objects + 1, "{context}");
    for name in ["hidden", "img", "heading", "mention", "long", "zzz-last"] {
        assert!(table.contains(name), "{name} not in the table: {context}");
    }
    assert!(table.contains("&lt;img src=x&gt;"), "{context}");

    // No raw HTML, comment, heading or quote of the pull request's own.
    for raw in [
        "<img",
        "<script",
        "<!--",
        "<h1",
        "<h2",
        "<h3",
        "<blockquote",
    ] {
        assert!(!html.contains(raw), "{raw} reached the HTML: {context}");
    }
    // No mention outside code.
    assert!(
        !outside_code(&html).contains("@octocat"),
        "a mention: {context}"
    );

    // Everything after the hostile rows is there: the policy, every diff, whole.
    assert!(html.contains("<h4>Policy</h4>"), "{context}");
    assert!(html.contains("<h4>Diffs</h4>"), "{context}");
    assert!(html.matches("<details>").count() >= objects, "{context}");
    assert!(
        html.contains("ConfigMap kmm-demo/zzz-last (create)</summary>"),
        "{context}"
    );
    assert!(html.contains("the last object"), "{context}");
    assert!(html.contains("~~~~ the end"), "{context}");
}

#[test]
fn a_name_the_api_server_would_refuse_is_an_error_that_cannot_reshape_the_comment() {
    let head = with_changes(
        &fleet_v1(),
        &[(
            "fleet/hidden.yaml",
            Some(config_map("x\n<!-- hidden", "before the comment")),
        )],
    );
    let fleet = FleetRepo::proposal(&fleet_v1(), &head);
    let args = ["plan", "--path", "fleet", "--format"];
    let json = capstan(fleet.path(), &[&args[..], &["json"]].concat());
    let plan: Value = serde_json::from_str(&stdout(&json)).expect("a JSON plan");
    let error = &plan["errors"][0];
    assert_eq!(
        (&error["file"], &error["field"]),
        (
            &Value::from("fleet/hidden.yaml"),
            &Value::from("metadata.name")
        ),
        "{plan}"
    );
    let output = capstan(fleet.path(), &[&args[..], &["markdown"]].concat());
    let html = cmark_gfm(&stdout(&output));
    assert!(!html.contains("<!--"), "{html}");
    assert!(html.contains("x\\n&lt;!-- hidden"), "{html}");
}
