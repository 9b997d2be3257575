//! Escaping of what a pull request controls (names, paths, values, messages) for the
//! places the renderers put it: GitHub-flavoured markdown text, inline code, table cells,
//! HTML blocks and code fences, and terminals. Whatever a name holds, it stays inside its
//! cell, line or block: it cannot end a table row, open a heading, a list or a quote, add
//! raw HTML, mention someone, close a fence, or move a terminal's cursor.

/// The visible form of a control character (`\n`, `\r`, `\t`, `\x1b`, `\u{9b}`), for the
/// places where the character itself would act.
fn visible(c: char, out: &mut String) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
        c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
    }
}

/// Whether a character acts on a terminal or a renderer rather than showing: C0 and C1
/// controls, DEL, and the line and paragraph separators and bidirectional overrides that
/// make text read other than it is.
fn is_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// Whether `text` starts, once set at the start of a line, a block: a heading, quote,
/// list item, thematic break, setext underline or ordered list item.
fn starts_block(text: &str) -> bool {
    let mut chars = text.chars();
    match chars.next() {
        Some('-' | '+' | '=' | '>' | '#' | '*' | '_' | '~' | '`' | '|') => true,
        Some(c) if c.is_ascii_digit() => {
            let rest = text.trim_start_matches(|c: char| c.is_ascii_digit());
            rest.starts_with('.') || rest.starts_with(')')
        }
        _ => false,
    }
}

/// Text for a markdown paragraph, list item, heading or table cell: one line, markup
/// characters backslash-escaped, `<`, `>` and `&` as entities (no raw HTML), `@` followed
/// by a zero-width space (no mention), control characters visible (`\n`).
pub fn text(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    if starts_block(text) && text.starts_with(|c: char| c.is_ascii_digit()) {
        // `1.` starts an ordered list only at a line's start; escape its dot.
        let digits = text.len() - text.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        out.push_str(&text[..digits]);
        out.push('\\');
        return out + &self::text(&text[digits..]);
    }
    for (index, c) in text.chars().enumerate() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '@' => out.push_str("@\u{200b}"),
            // A list item, setext underline or thematic break only at a line's start.
            '-' | '+' | '=' if index == 0 => {
                out.push('\\');
                out.push(c);
            }
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '#' | '~' => {
                out.push('\\');
                out.push(c);
            }
            c if is_control(c) => visible(c, &mut out),
            c => out.push(c),
        }
    }
    out
}

/// The text of an inline code span, before fencing: one line, control characters visible.
fn code_content(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if is_control(c) {
            visible(c, &mut out);
        } else {
            out.push(c);
        }
    }
    out
}

/// The longest run of `mark` in `text`.
fn longest_run(text: &str, mark: char) -> usize {
    let (mut longest, mut run) = (0, 0);
    for c in text.chars() {
        run = if c == mark { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    longest
}

/// An inline code span holding `text` as it is: fenced by more backticks than any run it
/// holds, padded with a space each side (which the renderer strips) when it starts or ends
/// with a backtick or a space, control characters visible. Not for table cells: see
/// [`cell_code`].
pub fn code(text: &str) -> String {
    let content = code_content(text);
    let fence = "`".repeat(longest_run(&content, '`') + 1);
    let pad = content.is_empty()
        || content.starts_with('`')
        || content.ends_with('`')
        || (content.starts_with(' ') && content.ends_with(' '));
    if pad {
        format!("{fence} {content} {fence}")
    } else {
        format!("{fence}{content}{fence}")
    }
}

/// [`code`] for a table cell, where a `|` ends the cell even inside code unless escaped.
/// A backslash right before a `|` would escape the escape, so such text is given as
/// escaped [`text`] instead of code.
pub fn cell_code(text: &str) -> String {
    if text.contains("\\|") {
        return self::text(text);
    }
    code(text).replace('|', "\\|")
}

/// Text inside an HTML block (`<summary>`), where markdown escapes show as typed: only
/// entities, no mention, control characters visible.
pub fn html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '@' => out.push_str("&#64;\u{200b}"),
            c if is_control(c) => visible(c, &mut out),
            c => out.push(c),
        }
    }
    out
}

/// A fenced code block holding `body` (lines kept; control characters but tabs made
/// visible), fenced by more backticks than any run the body holds, at least three.
pub fn fenced(info: &str, body: &str) -> String {
    let mut content = String::with_capacity(body.len() + 1);
    for line in body.lines() {
        for c in line.chars() {
            if c != '\t' && is_control(c) {
                visible(c, &mut content);
            } else {
                content.push(c);
            }
        }
        content.push('\n');
    }
    let fence = "`".repeat((longest_run(&content, '`') + 1).max(3));
    format!("{fence}{info}\n{content}{fence}\n")
}

/// Text for a terminal: control characters but newlines and tabs made visible, so nothing
/// a repository holds moves the cursor, recolours the log or rewrites a line.
pub fn terminal(text: &str) -> String {
    if !text
        .chars()
        .any(|c| c != '\n' && c != '\t' && is_control(c))
    {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c != '\n' && c != '\t' && is_control(c) {
            visible(c, &mut out);
        } else {
            out.push(c);
        }
    }
    out
}

/// [`terminal`] for what must stay on one line (a name, a path, a subject): newlines and
/// tabs made visible too.
pub fn terminal_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if is_control(c) {
            visible(c, &mut out);
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_escapes_markup() {
        let cases: &[(&str, &str)] = &[
            ("plain words", "plain words"),
            ("a <b> & c", "a &lt;b&gt; &amp; c"),
            ("x\n<!-- y", "x\\n&lt;!-- y"),
            ("worker-1: a-b", "worker-1: a-b"),
            ("~~gone~~", "\\~\\~gone\\~\\~"),
            ("a | b", "a \\| b"),
            ("`c`", "\\`c\\`"),
            ("*d* _e_", "\\*d\\* \\_e\\_"),
            ("# title", "\\# title"),
            ("> quote", "&gt; quote"),
            ("- item", "\\- item"),
            ("1. item", "1\\. item"),
            ("12) item", "12\\) item"),
            ("hi @octocat", "hi @\u{200b}octocat"),
            ("a\r\nb", "a\\r\\nb"),
            ("esc \u{1b}[31m", "esc \\x1b\\[31m"),
            ("+x", "\\+x"),
            ("=x", "\\=x"),
            ("c1 \u{9b}", "c1 \\x9b"),
            ("back\\slash", "back\\\\slash"),
            ("[link](x)", "\\[link\\](x)"),
            ("</details>", "&lt;/details&gt;"),
            ("ns/name → v2", "ns/name → v2"),
        ];
        for (input, expected) in cases {
            assert_eq!(&text(input), expected, "text({input:?})");
        }
    }

    #[test]
    fn code_spans_outfence_their_backticks() {
        let cases: &[(&str, &str)] = &[
            ("ConfigMap default/x", "`ConfigMap default/x`"),
            (" padded ", "`  padded  `"),
            ("f`<img src=x>`.yaml", "``f`<img src=x>`.yaml``"),
            ("a``b", "```a``b```"),
            ("x\n<!-- y", "`x\\n<!-- y`"),
            ("`", "`` ` ``"),
            ("", "`  `"),
        ];
        for (input, expected) in cases {
            assert_eq!(&code(input), expected, "code({input:?})");
        }
    }

    #[test]
    fn cell_code_escapes_pipes() {
        let cases: &[(&str, &str)] = &[
            ("a|b", "`a\\|b`"),
            ("plain", "`plain`"),
            ("a\\|b", "a\\\\\\|b"),
        ];
        for (input, expected) in cases {
            assert_eq!(&cell_code(input), expected, "cell_code({input:?})");
        }
    }

    #[test]
    fn html_uses_entities() {
        assert_eq!(
            html("<script>&\"@x\n"),
            "&lt;script&gt;&amp;&quot;&#64;\u{200b}x\\n"
        );
    }

    #[test]
    fn fences_outrun_the_body() {
        assert_eq!(fenced("diff", "+a\n-b"), "```diff\n+a\n-b\n```\n");
        assert_eq!(
            fenced("diff", "+ x: ````\n+ y"),
            "`````diff\n+ x: ````\n+ y\n`````\n"
        );
        assert_eq!(
            fenced("diff", "+ a\rb\u{1b}c\td"),
            "```diff\n+ a\\rb\\x1bc\td\n```\n"
        );
    }

    #[test]
    fn terminals_see_no_escapes() {
        assert_eq!(terminal("ok\n\tline"), "ok\n\tline");
        assert_eq!(
            terminal("\u{1b}[2J\u{1b}]0;t\u{7}"),
            "\\x1b[2J\\x1b]0;t\\x07"
        );
        assert_eq!(terminal("\u{9b}31m\u{7f}"), "\\x9b31m\\x7f");
        assert_eq!(terminal_line("a\nb\rc"), "a\\nb\\rc");
        assert_eq!(terminal("\u{202e}txt"), "\\u{202e}txt");
    }
}
