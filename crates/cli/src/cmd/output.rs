//! The output flags every printing subcommand shares (`--color`, and the rule for when colour is
//! on), so `gdx topo`, `doctor`, `bench`, `cp`, `serve` and `calibrate` behave the same.

use clap::ValueEnum;
use std::io::IsTerminal;

/// `--color WHEN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ColorWhen {
    /// Colour when stdout is a terminal and `NO_COLOR` is unset.
    #[default]
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

impl ColorWhen {
    /// Whether to colour text written to stdout.
    pub fn enabled(self) -> bool {
        self.enabled_for(std::io::stdout().is_terminal())
    }

    /// Whether to colour text written to stderr (warnings).
    pub fn enabled_on_stderr(self) -> bool {
        self.enabled_for(std::io::stderr().is_terminal())
    }

    fn enabled_for(self, terminal: bool) -> bool {
        match self {
            ColorWhen::Always => true,
            ColorWhen::Never => false,
            ColorWhen::Auto => terminal && std::env::var_os("NO_COLOR").is_none(),
        }
    }
}

/// `text` in ANSI colour `code` (`"32"` green, `"31"` red, `"33"` yellow) when `on`.
pub fn paint(on: bool, code: &str, text: &str) -> String {
    if on {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

/// JSON text as a terminal may get it: serde_json escapes only U+0000–U+001F, so DEL and the
/// C1 controls (U+007F–U+009F: 8-bit CSI and OSC to some terminals) in strings that came from a
/// peer, etcd, a file or a log are escaped as `\u00XX` too. The JSON value is the same (those
/// characters can only occur inside strings, where the escape means the character).
pub fn json_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if ('\u{7f}'..='\u{9f}').contains(&c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `serde_json::to_string_pretty`, then [`json_safe`]: every JSON document gdx prints.
pub fn json_pretty<T: serde::Serialize + ?Sized>(v: &T) -> serde_json::Result<String> {
    serde_json::to_string_pretty(v).map(|t| json_safe(&t))
}

/// The error and its causes on one line, each cause once. Library errors often carry their
/// source's text in their own message (`thiserror`'s `"{0}"`) *and* expose it as `source()`;
/// printing `{:#}` then says "No such file or directory (os error 2)" twice. A cause whose text
/// is already in the line is skipped.
pub fn error_chain(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// `-q/--quiet` and `--color`, flattened into subcommands that have no flags of their own for
/// them (`gdx nccl …`, `gdx peers`).
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct OutputArgs {
    /// Print only what answers the question (judgements that failed, export lines, the table,
    /// the names); warnings on stderr are dropped too.
    #[arg(long, short)]
    pub quiet: bool,

    /// Colour: auto (only on a terminal, and not under NO_COLOR), always or never.
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = ColorWhen::Auto)]
    pub color: ColorWhen,
}

/// Colour the verdict words of a text report (`FAIL`/`NOT BEST` red, `WARN` yellow,
/// `PASS`/`best` green) when `on`.
pub fn paint_verdicts(on: bool, text: &str) -> String {
    if !on {
        return text.to_string();
    }
    text.lines()
        .map(|l| {
            let t = l.trim_start();
            let indent = &l[..l.len() - t.len()];
            for (word, code) in [
                ("NOT BEST", "31"),
                ("FAIL", "31"),
                ("WARN", "33"),
                ("PASS", "32"),
                ("best", "32"),
            ] {
                if let Some(rest) = t.strip_prefix(word) {
                    if rest.is_empty() || rest.starts_with(' ') {
                        return format!("{indent}{}{rest}", paint(true, code, word));
                    }
                }
            }
            l.to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
        + if text.ends_with('\n') { "\n" } else { "" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes_c1_and_del_and_means_the_same() {
        let v = serde_json::json!({"name": "a\u{1b}]0;x\u{7}b\u{9b}31m\u{85}\u{7f}é"});
        let text = json_pretty(&v).unwrap_or_default();
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != ' '),
            "{text:?}"
        );
        let back: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(back, v);
    }
}
