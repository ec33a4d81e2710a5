//! CPU sets as NCCL writes them (`<cpu affinity>`: the kernel's `cpumap` form, 32-bit hex
//! groups separated by commas, most significant first) and as the model keeps them (a
//! `cpulist` such as `0-47,96-143`).

use crate::TopoError;

/// Highest CPU number written into an affinity mask: far above any real machine, low enough
/// that a hostile CPU list cannot make the mask huge.
const MAX_CPU: u64 = 65_535;

/// Mask (`00000000,0000ffff,ffffffff`) to CPU list (`0-47`); an empty mask gives `""`.
pub(super) fn mask_to_list(mask: &str) -> Result<String, TopoError> {
    let mask = mask.trim();
    if mask.is_empty() {
        return Ok(String::new());
    }
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    // The last group holds CPUs 0-31, the one before it 32-63, and so on.
    for (i, group) in mask.rsplit(',').enumerate() {
        let g = group.trim();
        if g.is_empty() || g.len() > 8 || !g.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TopoError::CpuMask {
                group: g.to_string(),
                index: i,
            });
        }
        let bits = u32::from_str_radix(g, 16).map_err(|_| TopoError::CpuMask {
            group: g.to_string(),
            index: i,
        })?;
        let base = 32 * i as u64;
        for b in 0..32u64 {
            if bits & (1 << b) == 0 {
                continue;
            }
            let cpu = base + b;
            match ranges.last_mut() {
                Some((_, end)) if *end + 1 == cpu => *end = cpu,
                _ => ranges.push((cpu, cpu)),
            }
        }
    }
    Ok(ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(","))
}

/// CPU list (`0-47,96-143`) to mask; `None` for an empty, malformed or absurdly large list.
pub(super) fn list_to_mask(list: &str) -> Option<String> {
    let mut ranges = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u64>().ok()?, b.trim().parse::<u64>().ok()?),
            None => {
                let a = part.parse::<u64>().ok()?;
                (a, a)
            }
        };
        if a > b || b > MAX_CPU {
            return None;
        }
        ranges.push((a, b));
    }
    let max = ranges.iter().map(|&(_, b)| b).max()?;
    let mut groups = vec![0u32; (max / 32 + 1) as usize];
    for (a, b) in ranges {
        for cpu in a..=b {
            groups[(cpu / 32) as usize] |= 1 << (cpu % 32);
        }
    }
    Some(
        groups
            .iter()
            .rev()
            .map(|g| format!("{g:08x}"))
            .collect::<Vec<_>>()
            .join(","),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_from_reference_files() {
        assert_eq!(mask_to_list("00000000,0000ffff,ffffffff").unwrap(), "0-47");
        assert_eq!(mask_to_list("ffffffff,ffff0000,00000000").unwrap(), "48-95");
        assert_eq!(
            mask_to_list("000000ff,ffff0000,00ffffff").unwrap(),
            "0-23,48-71"
        );
        assert_eq!(mask_to_list("00000000,000fffff").unwrap(), "0-19");
        assert_eq!(mask_to_list("").unwrap(), "");
        assert_eq!(mask_to_list("5").unwrap(), "0,2");
        assert!(mask_to_list("0000zzzz").is_err());
        assert!(mask_to_list("123456789").is_err());
        assert!(mask_to_list("ff,,ff").is_err());
    }

    #[test]
    fn lists_to_masks_and_back() {
        assert_eq!(list_to_mask("0-47").unwrap(), "0000ffff,ffffffff");
        assert_eq!(
            list_to_mask("0-23,48-71").unwrap(),
            "000000ff,ffff0000,00ffffff"
        );
        assert_eq!(list_to_mask("0").unwrap(), "00000001");
        assert_eq!(list_to_mask(""), None);
        assert_eq!(list_to_mask("3-1"), None);
        assert_eq!(list_to_mask("x"), None);
        assert_eq!(list_to_mask("0-99999999"), None);
        for list in ["0-47", "48-95", "0-23,48-71", "1,3,5-9,64"] {
            assert_eq!(mask_to_list(&list_to_mask(list).unwrap()).unwrap(), list);
        }
    }
}
