//! docs/reference/cli.md is what clap says about meshd's command line now, so the page cannot drift
//! from `meshd --help`: the test renders the page from the same `Cli` the binary parses and fails
//! when the committed page differs.

// The binary's command-line types, compiled here as they are: the binary crate has no library
// target to import them from, and a copy would drift. Their fields are read by the binary only.
#[allow(dead_code)]
#[path = "../src/cli.rs"]
mod cli;

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Arg, Command, CommandFactory};

const REGENERATE: &str = "MESH_BLESS=1 cargo test -p meshd --test cli_reference";

fn page_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference/cli.md")
}

/// Escapes text for Markdown outside code spans: `<` and `>` would open HTML tags (`<GPU UUID>`
/// vanishes on most renderers), and `|` would end a table cell. Inside backtick spans only `|` needs
/// it, since a table splits cells before it parses spans.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '|' => out.push_str("\\|"),
            '<' if !in_code => out.push_str("&lt;"),
            '>' if !in_code => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
    out
}

/// One table cell: clap's paragraphs joined, since a cell holds one line.
fn cell(text: &str) -> String {
    let joined: Vec<&str> = text.split('\n').map(str::trim).filter(|l| !l.is_empty()).collect();
    escape(&joined.join(" "))
}

/// How an argument is written on the command line, e.g. `--grid <GRID>` or `<MESSAGES>...`.
fn spelling(arg: &Arg) -> String {
    let values: Vec<String> = arg
        .get_value_names()
        .map(|names| names.iter().map(|n| format!("<{n}>")).collect())
        .unwrap_or_else(|| vec![format!("<{}>", arg.get_id().as_str().to_uppercase())]);
    let repeated = matches!(arg.get_num_args(), Some(r) if r.max_values() > 1);
    let values = format!("{}{}", values.join(" "), if repeated { "..." } else { "" });
    if arg.is_positional() {
        return if arg.is_last_set() { format!("-- {values}") } else { values };
    }
    let mut names: Vec<String> = arg.get_short().map(|s| format!("-{s}")).into_iter().collect();
    names.extend(arg.get_long().map(|l| format!("--{l}")));
    let names = names.join(", ");
    if arg.get_action().takes_values() { format!("{names} {values}") } else { names }
}

/// An argument's description with what clap adds to `--help`: choices, default, variable.
fn description(arg: &Arg) -> String {
    let help = arg.get_long_help().or(arg.get_help()).map(ToString::to_string).unwrap_or_default();
    let mut out = cell(&help);
    // clap drops the full stop of a one-sentence help; what follows it here needs one.
    if !out.is_empty() && !out.ends_with(['.', '!', '?']) {
        out.push('.');
    }
    let choices: Vec<String> =
        arg.get_possible_values().iter().filter(|v| !v.is_hide_set()).map(|v| format!("`{}`", v.get_name())).collect();
    if !choices.is_empty() && arg.get_action().takes_values() {
        let _ = write!(out, " One of {}.", choices.join(", "));
    }
    let defaults: Vec<String> = arg.get_default_values().iter().map(|v| format!("`{}`", v.to_string_lossy())).collect();
    if !defaults.is_empty() && arg.get_action().takes_values() {
        let _ = write!(out, " Default: {}.", defaults.join(", "));
    }
    if let Some(var) = arg.get_env() {
        let _ = write!(out, " Environment: `{}`.", var.to_string_lossy());
    }
    if arg.is_required_set() && !arg.is_positional() {
        out.push_str(" Required.");
    }
    out
}

/// clap's `after_help`: indented lines are commands (code spans, one per list item), others prose.
fn after_help(text: &str, out: &mut String) {
    let mut in_list = false;
    for line in text.lines() {
        if let Some(command) = line.strip_prefix("  ") {
            let _ = writeln!(out, "- `{}`", command.trim());
            in_list = true;
        } else if !line.trim().is_empty() {
            if std::mem::take(&mut in_list) {
                out.push('\n');
            }
            let _ = writeln!(out, "{}\n", escape(line.trim()));
        }
    }
    if in_list {
        out.push('\n');
    }
}

/// Whether clap made the argument or command itself (help, version) rather than meshd.
fn is_clap_builtin(id: &str) -> bool {
    matches!(id, "help" | "version")
}

fn section(cmd: &Command, path: &str, out: &mut String) {
    let _ = writeln!(out, "## `{path}`\n");
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        for paragraph in about.to_string().split("\n\n") {
            let _ = writeln!(out, "{}\n", cell(paragraph));
        }
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.trim().trim_start_matches("Usage:").trim();
    let _ = writeln!(out, "Usage: `{usage}`\n");

    let subcommands: Vec<&Command> =
        cmd.get_subcommands().filter(|c| !c.is_hide_set() && !is_clap_builtin(c.get_name())).collect();
    if !subcommands.is_empty() {
        out.push_str("| Command | What it does |\n| --- | --- |\n");
        for sub in &subcommands {
            let about = sub.get_about().map(ToString::to_string).unwrap_or_default();
            let anchor = format!("{path} {}", sub.get_name()).replace(' ', "-");
            let _ = writeln!(out, "| [`{}`](#{anchor}) | {} |", sub.get_name(), cell(&about));
        }
        out.push('\n');
    }

    let shown = |a: &&Arg| !a.is_hide_set() && !is_clap_builtin(a.get_id().as_str()) && !a.is_global_set();
    let positionals: Vec<&Arg> = cmd.get_positionals().filter(shown).collect();
    if !positionals.is_empty() {
        out.push_str("| Argument | Description |\n| --- | --- |\n");
        for arg in positionals {
            let _ = writeln!(out, "| `{}` | {} |", spelling(arg), description(arg));
        }
        out.push('\n');
    }
    let options: Vec<&Arg> = cmd.get_arguments().filter(|a| !a.is_positional()).filter(shown).collect();
    if !options.is_empty() {
        out.push_str("| Option | Description |\n| --- | --- |\n");
        for arg in options {
            let _ = writeln!(out, "| `{}` | {} |", spelling(arg), description(arg));
        }
        out.push('\n');
    }
    if let Some(text) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        after_help(&text.to_string(), out);
    }
    for sub in subcommands {
        section(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

/// The page as the generator makes it now.
fn render() -> String {
    let mut cmd = cli::Cli::command();
    // Building propagates the global options and names each subcommand's usage in full
    // (`meshd service create ...` rather than `create ...`).
    cmd.build();
    let mut out = String::from(
        "# Command-line reference\n\n\
         <!-- Generated from meshd's clap definitions (crates/meshd/src/cli.rs); do not edit by hand. -->\n\n",
    );
    let _ = writeln!(
        out,
        "This page is generated from `meshd --help` and changes only with it: regenerate it with \
         `{REGENERATE}`.\n\nEvery command takes `-h` (a summary) and `--help` (the text below), and \
         the global options `--socket` and `--device` of [`meshd`](#meshd). `meshd --version` prints \
         the version. Exit codes and refusals: [errors.md](errors.md).\n"
    );
    section(&cmd, "meshd", &mut out);
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

#[test]
fn cli_page_is_what_clap_generates_now() {
    let expected = render();
    let path = page_path();
    if std::env::var_os("MESH_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &expected).unwrap_or_else(|e| panic!("{}: cannot write: {e}", path.display()));
        return;
    }
    let found = std::fs::read_to_string(&path).unwrap_or_default();
    if found != expected {
        let first = found.lines().zip(expected.lines()).position(|(a, b)| a != b);
        let line = first.unwrap_or_else(|| found.lines().count().min(expected.lines().count())) + 1;
        panic!(
            "{} differs from what clap generates now (first at line {line}); regenerate it with `{REGENERATE}`",
            path.display()
        );
    }
}

#[test]
fn page_documents_every_command_and_option() {
    // The renderer must not silently drop what clap knows: every subcommand has a section and every
    // long option of each appears in the page.
    let page = render();
    let mut cmd = cli::Cli::command();
    cmd.build();
    let mut stack = vec![("meshd".to_string(), &cmd)];
    let mut checked = 0;
    while let Some((path, c)) = stack.pop() {
        assert!(page.contains(&format!("## `{path}`\n")), "no section for `{path}`");
        for arg in c.get_arguments().filter(|a| !a.is_hide_set() && !is_clap_builtin(a.get_id().as_str())) {
            if let Some(long) = arg.get_long() {
                assert!(page.contains(&format!("`--{long}")), "`{path}`: --{long} is missing from the page");
                checked += 1;
            }
        }
        for sub in c.get_subcommands().filter(|s| !is_clap_builtin(s.get_name())) {
            stack.push((format!("{path} {}", sub.get_name()), sub));
        }
    }
    assert!(checked > 40, "only {checked} options found: is the command line empty?");
}

#[test]
fn escaping_keeps_placeholders_visible_and_tables_whole() {
    assert_eq!(escape("/tmp/meshd-<GPU UUID>.sock"), "/tmp/meshd-&lt;GPU UUID&gt;.sock");
    assert_eq!(escape("`a|b` <x>"), "`a\\|b` &lt;x&gt;");
    assert_eq!(escape("`<KEEP>` here"), "`<KEEP>` here");
    assert_eq!(cell("one\n\ntwo\n"), "one two");
}
