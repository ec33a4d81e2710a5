//! Reading NCCL XML attributes and placing errors: every problem becomes a
//! [`TopoError::Xml`] with the line and column of the element or attribute at fault.

use crate::error::TopoError;
use crate::model::{Link, PciAddr};
use roxmltree::{Document, Node};
use std::path::Path;

/// A roxmltree error as [`TopoError::Xml`], placed where the problem is.
pub(super) fn syntax_error(text: &str, path: &Path, e: &roxmltree::Error) -> TopoError {
    let full = e.to_string();
    let (line, column, message) = match e {
        // roxmltree places these at 1:1; the place to look is where the text stops.
        roxmltree::Error::UnexpectedEndOfStream | roxmltree::Error::UnclosedRootNode => {
            let (line, column) = text_pos(text, text.trim_end().len());
            (
                line,
                column,
                format!("{full} (the file ends here: truncated?)"),
            )
        }
        // Refused so that entity expansion cannot blow up; NCCL files have no DTD.
        roxmltree::Error::DtdDetected => {
            let (line, column) = text_pos(text, text.find("<!DOCTYPE").unwrap_or(0));
            (line, column, full)
        }
        _ => {
            let pos = e.pos();
            // roxmltree ends its messages with " at line:col"; the error carries both.
            let suffix = format!(" at {pos}");
            let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
            (pos.row, pos.col, message)
        }
    };
    TopoError::Xml {
        path: path.to_path_buf(),
        line,
        column,
        message: format!("malformed XML: {message}"),
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(super) fn text_pos(text: &str, pos: usize) -> (u32, u32) {
    let before = text.get(..pos).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    let clamp = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    (clamp(line), clamp(column))
}

/// The document being read and its path, for error positions.
pub(super) struct Attrs<'a, 'input> {
    pub(super) doc: &'a Document<'input>,
    pub(super) path: &'a Path,
    /// Byte offsets where lines start, so a line number is a binary search, not a scan of
    /// the text before it (roxmltree's `text_pos_at` scans: quadratic over many notes).
    pub(super) line_starts: Vec<usize>,
}

impl<'a, 'input> Attrs<'a, 'input> {
    pub(super) fn new(doc: &'a Document<'input>, path: &'a Path) -> Self {
        let text = doc.input_text();
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Attrs {
            doc,
            path,
            line_starts,
        }
    }
}

impl Attrs<'_, '_> {
    // ---- errors -------------------------------------------------------------------------

    pub(super) fn err_at(&self, pos: usize, message: String) -> TopoError {
        let tp = self.doc.text_pos_at(pos);
        TopoError::Xml {
            path: self.path.to_path_buf(),
            line: tp.row,
            column: tp.col,
            message,
        }
    }

    pub(super) fn line_of(&self, node: Node) -> u32 {
        let pos = node.range().start;
        let line = self.line_starts.partition_point(|&s| s <= pos);
        u32::try_from(line).unwrap_or(u32::MAX)
    }

    /// `<pci busid="...">` for a pci element, `<name>` otherwise: enough to find it.
    pub(super) fn describe(node: Node) -> String {
        let name = node.tag_name().name();
        match node.attribute("busid") {
            Some(b) => format!("<{name} busid=\"{b}\">"),
            None => format!("<{name}>"),
        }
    }

    pub(super) fn elem_err(&self, node: Node, what: &str) -> TopoError {
        self.err_at(
            node.range().start,
            format!("{}: {what}", Self::describe(node)),
        )
    }

    pub(super) fn attr_err(&self, node: Node, attr: &str, what: &str) -> TopoError {
        let pos = node
            .attribute_node(attr)
            .map_or(node.range().start, |a| a.range().start);
        let value = node.attribute(attr).unwrap_or("");
        self.err_at(
            pos,
            format!(
                "{}: attribute {attr}=\"{value}\" {what}",
                Self::describe(node)
            ),
        )
    }

    // ---- attributes ---------------------------------------------------------------------

    /// An integer attribute (decimal or `0x` hex, as NCCL's `strtol(.., 0)` reads it);
    /// `None` when absent or empty.
    pub(super) fn opt_int(&self, node: Node, attr: &str) -> Result<Option<i64>, TopoError> {
        let Some(raw) = node.attribute(attr) else {
            return Ok(None);
        };
        let s = raw.trim();
        if s.is_empty() {
            return Ok(None);
        }
        let (neg, digits) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let parsed = match digits
            .strip_prefix("0x")
            .or_else(|| digits.strip_prefix("0X"))
        {
            Some(hex) => i64::from_str_radix(hex, 16),
            None => digits.parse::<i64>(),
        };
        match parsed {
            Ok(v) if !digits.starts_with(['+', '-']) => Ok(Some(if neg { -v } else { v })),
            _ => Err(self.attr_err(node, attr, "is not a number")),
        }
    }

    /// A non-negative count or index; NCCL's `-1` ("not set") reads as absent.
    pub(super) fn opt_u32(&self, node: Node, attr: &str) -> Result<Option<u32>, TopoError> {
        match self.opt_int(node, attr)? {
            None | Some(-1) => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| self.attr_err(node, attr, "is out of range")),
        }
    }

    pub(super) fn opt_u64(&self, node: Node, attr: &str) -> Result<Option<u64>, TopoError> {
        match self.opt_int(node, attr)? {
            None | Some(-1) => Ok(None),
            Some(v) => u64::try_from(v)
                .map(Some)
                .map_err(|_| self.attr_err(node, attr, "is out of range")),
        }
    }

    pub(super) fn req_u32(&self, node: Node, attr: &str) -> Result<u32, TopoError> {
        self.opt_u32(node, attr)?
            .ok_or_else(|| self.elem_err(node, &format!("missing {attr} attribute")))
    }

    /// A hex attribute (`0x030200`, `0x10de`) no larger than `max`.
    pub(super) fn opt_hex(
        &self,
        node: Node,
        attr: &str,
        max: u32,
    ) -> Result<Option<u32>, TopoError> {
        let Some(raw) = node.attribute(attr) else {
            return Ok(None);
        };
        let s = raw.trim();
        if s.is_empty() {
            return Ok(None);
        }
        let digits = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(s);
        match u32::from_str_radix(digits, 16) {
            Ok(v) if v <= max && !digits.starts_with('+') => Ok(Some(v)),
            _ => Err(self.attr_err(node, attr, &format!("is not a hex number up to {max:#x}"))),
        }
    }

    pub(super) fn opt_id(&self, node: Node, attr: &str) -> Result<Option<u16>, TopoError> {
        // The range check in opt_hex keeps the value within u16.
        Ok(self
            .opt_hex(node, attr, 0xffff)?
            .and_then(|v| u16::try_from(v).ok()))
    }

    pub(super) fn bus_id(&self, node: Node, attr: &str) -> Result<PciAddr, TopoError> {
        let raw = node
            .attribute(attr)
            .ok_or_else(|| self.elem_err(node, &format!("missing {attr} attribute")))?;
        raw.parse()
            .map_err(|_| self.attr_err(node, attr, "is not a PCI bus id (expected DDDD:BB:DD.F)"))
    }

    /// `link_speed` ("32.0 GT/s PCIe", "8 GT/s", "32 GT/s PCIe/s") and `link_width`; empty
    /// values and width 0 are NCCL's "unknown".
    pub(super) fn link(&self, node: Node) -> Result<Link, TopoError> {
        let speed_gts = node.attribute("link_speed").and_then(|s| {
            let s = s.trim();
            let num: String = s
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            // "Unknown" and other words from sysfs mean the same as an empty value.
            num.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
        });
        let width = self.opt_u32(node, "link_width")?.filter(|w| *w > 0);
        Ok(Link { speed_gts, width })
    }
}
