//! Argument values the commands share, parsed one way: sizes and size lists (the one gdx rule,
//! through `gdx_base::bytesize`), rates, durations, GPU pairs, percentages, `--listen`
//! addresses, NIC lists and libfabric provider names. It sits below the commands: a command
//! takes its parsers from here, never from another command.

use std::time::Duration;

use std::net::SocketAddr;

use gdx_base::bytesize::{parse_rate, parse_size_list, ByteSize, SIZE_HELP};

/// Parsed `--size`.
#[derive(Debug, Clone)]
pub struct SizeList(pub Vec<u64>);

/// The `--size` help: the list syntax and the one unit rule of every gdx command.
pub fn sizes_help() -> String {
    format!(
        "Sizes: a list (`8,4KiB,1MiB`) and/or ranges `LO:HI` in ×4 steps, `LO:HI:xN` in ×N \
         steps; {SIZE_HELP}"
    )
}

/// Most bytes one transfer may move.
const MAX_TRANSFER: u64 = 16 << 30;

/// Parse `8,4KiB,1MiB`, `8:1GiB`, `4KiB:1GiB:x2` with [`parse_size_list`] (sorted,
/// deduplicated), refusing what cannot be measured (0 bytes, over 16 GiB).
pub fn parse_sizes(s: &str) -> Result<SizeList, String> {
    let v = parse_size_list(s).map_err(|e| e.to_string())?;
    if v.contains(&0) {
        return Err("a size of 0 bytes cannot be measured".into());
    }
    if let Some(big) = v.iter().find(|&&b| b > MAX_TRANSFER) {
        return Err(format!(
            "{} is over the {} limit per transfer",
            ByteSize(*big),
            ByteSize(MAX_TRANSFER)
        ));
    }
    Ok(SizeList(v))
}

/// `--provider NAME`: a libfabric provider name as `fi_info -l` spells it (`tcp`, `efa`,
/// `verbs`, `shm`), checked for shape only; gdx-fabric says whether it offers FI_RMA here.
pub fn parse_provider(s: &str) -> Result<String, String> {
    let t = s.trim();
    if t.is_empty() || !t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "invalid provider {s:?}: give a libfabric provider name such as tcp, shm, efa or              verbs (`gdx doctor` lists what this machine offers)"
        ));
    }
    Ok(t.to_string())
}

/// Parse a percentage for --fail-on-drop: `5`, `5%`, `2.5`.
pub fn parse_pct(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("invalid percentage {s:?}: use e.g. 5 or 2.5"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("invalid percentage {s:?}: must be within 0..100"));
    }
    Ok(v)
}

/// Parse `200ms`, `1s`, `0.5` (seconds), `500us`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: use e.g. 200ms, 1s, 0.5"))?;
    let secs = v * mult;
    if !secs.is_finite() || secs <= 0.0 || secs > 3600.0 {
        return Err(format!(
            "invalid duration {s:?}: must be > 0 and at most an hour"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parse `0,1` into two different GPU ordinals.
pub fn parse_pair(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("invalid pair {s:?}: use two GPU ordinals, e.g. 0,1");
    let (a, b) = s.split_once([',', '-', ':']).ok_or_else(bad)?;
    let (a, b): (u32, u32) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    if a == b {
        return Err(format!("invalid pair {s:?}: the two GPUs must differ"));
    }
    Ok((a, b))
}

/// One size (`4096`, `64MiB`, `1.5GB`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    ByteSize::parse(s).map_err(|e| e.to_string())
}

/// A rate in bytes per second (`40GB/s`).
pub fn parse_rate_arg(s: &str) -> Result<u64, String> {
    parse_rate(s).map_err(|e| e.to_string())
}

/// `--listen` forms (see [`gdx_engine::parse_listen`]).
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    gdx_engine::parse_listen(s).map_err(|e| e.wire_message())
}

/// A `--nics` list: `A,B`, at most `gdx_engine::MAX_RAILS` entries (split with
/// `gdx_engine::parse_nics` where used).
pub fn parse_nic_list(s: &str) -> Result<String, String> {
    let v = gdx_engine::parse_nics(s);
    if v.is_empty() {
        return Err("expected NIC,NIC... (local addresses or devices)".into());
    }
    if v.len() > gdx_engine::MAX_RAILS {
        return Err(format!("at most {} rails", gdx_engine::MAX_RAILS));
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_lists_and_ranges() {
        assert_eq!(parse_sizes("8,4KiB").unwrap().0, vec![8, 4096]);
        assert_eq!(
            parse_sizes("1KiB:16KiB").unwrap().0,
            vec![1024, 4096, 16384]
        );
        assert_eq!(
            parse_sizes("1KiB:8KiB:x2").unwrap().0,
            vec![1024, 2048, 4096, 8192]
        );
        assert_eq!(parse_sizes("8:1GiB").unwrap().0.len(), 15);
        assert!(parse_sizes("0").is_err());
        assert!(parse_sizes("8KiB:1KiB").is_err());
        assert!(parse_sizes("1:8:x1").is_err());
        assert!(parse_sizes("").is_err());
    }

    #[test]
    fn decimal_and_binary_units_and_limits() {
        assert_eq!(parse_sizes("1GB").unwrap().0, vec![1_000_000_000]);
        assert_eq!(parse_sizes("1GiB").unwrap().0, vec![1 << 30]);
        assert!(parse_sizes("17GiB").unwrap_err().contains("16GiB limit"));
        assert_eq!(parse_pct("5%").unwrap(), 5.0);
        assert!(parse_pct("-1").is_err());
    }

    #[test]
    fn durations_and_pairs() {
        assert_eq!(parse_duration("200ms").unwrap(), Duration::from_millis(200));
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("0.5").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("fast").is_err());
        assert_eq!(parse_pair("0,1").unwrap(), (0, 1));
        assert!(parse_pair("1,1").is_err());
        assert!(parse_pair("x").is_err());
        assert_eq!(parse_provider("tcp").unwrap(), "tcp");
        assert!(parse_provider("tcp;ofi_rxm")
            .unwrap_err()
            .contains("provider name"));
        assert!(parse_provider("").is_err());
    }

    #[test]
    fn listen_forms() {
        assert_eq!(parse_listen("7447").unwrap().to_string(), "127.0.0.1:7447");
        assert_eq!(parse_listen(":7447").unwrap().to_string(), "0.0.0.0:7447");
        assert_eq!(
            parse_listen("10.0.0.1:80").unwrap().to_string(),
            "10.0.0.1:80"
        );
        assert_eq!(
            parse_listen("[::1]:7447").unwrap().to_string(),
            "[::1]:7447"
        );
        assert_eq!(parse_listen("localhost:7447").unwrap().port(), 7447);
        for bad in ["", ":", "70000", "host", "::1:7447", "[::1]", "a:b"] {
            assert!(parse_listen(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("0.5").is_err());
    }
}
