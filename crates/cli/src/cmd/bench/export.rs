//! Export files: `-` is stdout, a plot is SVG or PNG (through `rsvg-convert`).

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context as _, Result};
use gdx_bench::Report;

/// Writes `text` to `path`, or stdout for `-`.
pub fn write_out(path: &Path, text: &str) -> Result<()> {
    if path.as_os_str() == "-" {
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        return Ok(out.flush()?);
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Renders `report` as an SVG or PNG plot at `path`.
pub fn write_plot(path: &Path, report: &Report) -> Result<()> {
    let title = format!(
        "gdx bench on {} ({}), gdx {}",
        report.header.host, report.header.cpu, report.header.gdx_version
    );
    let svg = gdx_bench::plot::svg(report, &title).map_err(anyhow::Error::msg)?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("svg") => write_out(path, &svg),
        Some("png") => {
            let tmp = path.with_extension("svg.tmp");
            std::fs::write(&tmp, &svg).with_context(|| format!("writing {}", tmp.display()))?;
            let st = std::process::Command::new("rsvg-convert")
                .arg("-o")
                .arg(path)
                .arg(&tmp)
                .status();
            let _ = std::fs::remove_file(&tmp);
            match st {
                Ok(s) if s.success() => Ok(()),
                Ok(s) => bail!("rsvg-convert failed ({s}) writing {}", path.display()),
                Err(e) => bail!(
                    "writing a PNG needs rsvg-convert ({e}; apt-get install librsvg2-bin), or give a .svg file"
                ),
            }
        }
        _ => bail!(
            "--plot {}: the file must end in .svg or .png",
            path.display()
        ),
    }
}
