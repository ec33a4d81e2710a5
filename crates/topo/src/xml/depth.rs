//! A pre-check of element nesting. roxmltree descends recursively, one stack frame set per
//! open element, so a few hundred nested elements overflow a thread's stack (an abort, not an
//! error). Real topology files nest about a dozen deep; anything past [`MAX_NESTING`] is
//! refused before roxmltree sees it.

/// Deepest element nesting handed to roxmltree.
pub(super) const MAX_NESTING: usize = 100;

/// Byte offset of the first start tag nested deeper than `limit`, if any.
///
/// The scan follows XML's lexical rules where a parser could still be reading successfully
/// (quoted attribute values may hold `>`, comments, CDATA and processing instructions hold
/// no elements), so it never counts shallower than roxmltree would descend; on text roxmltree
/// would reject it may count deeper, which only refuses a file that was broken anyway.
pub(super) fn too_deep(text: &str, limit: usize) -> Option<usize> {
    let b = text.as_bytes();
    let skip_past = |from: usize, end: &[u8]| -> usize {
        b.get(from..)
            .and_then(|rest| rest.windows(end.len()).position(|w| w == end))
            .map_or(b.len(), |p| from + p + end.len())
    };
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'<' {
            i += 1;
            continue;
        }
        let rest = &b[i..];
        if rest.starts_with(b"<!--") {
            i = skip_past(i + 4, b"-->");
        } else if rest.starts_with(b"<![CDATA[") {
            i = skip_past(i + 9, b"]]>");
        } else if rest.starts_with(b"<?") {
            i = skip_past(i + 2, b"?>");
        } else if rest.starts_with(b"<!") {
            i = skip_past(i + 2, b">");
        } else if rest.starts_with(b"</") {
            depth = depth.saturating_sub(1);
            i = skip_past(i + 2, b">");
        } else {
            // A start tag: find its '>' outside quoted attribute values.
            let mut j = i + 1;
            let mut quote: Option<u8> = None;
            while j < b.len() {
                let c = b[j];
                match quote {
                    Some(q) if c == q => quote = None,
                    Some(_) => {}
                    None if c == b'"' || c == b'\'' => quote = Some(c),
                    None if c == b'>' => break,
                    None => {}
                }
                j += 1;
            }
            let empty = j < b.len() && j > i + 1 && b[j - 1] == b'/';
            if !empty {
                depth += 1;
                if depth > limit {
                    return Some(i);
                }
            }
            i = j + 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_open_elements_only() {
        assert_eq!(too_deep("<a><b/><c x='>'><d/></c></a>", 2), None);
        assert_eq!(too_deep("<a><b><c/></b></a>", 1), Some(3));
        assert_eq!(
            too_deep("<a><!-- <b><c> --><![CDATA[<d><e>]]></a>", 1),
            None
        );
        // A '/>' inside a quoted value closes nothing.
        assert_eq!(too_deep("<a x=\"/>\"><b x=\"/>\">", 1), Some(10));
        assert_eq!(too_deep("", 0), None);
        assert_eq!(too_deep("<", 0), Some(0));
    }
}
