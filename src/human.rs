//! How numbers read for people, one way everywhere: a count with its noun ([`plural`]), a size
//! in bytes ([`size`]) and an integer with thousands separators ([`grouped`]). Imports nothing
//! of wanbake, so every layer can use it. Does not own: sizes people type (`recipe::parse_size`)
//! or what the JSON documents hold (exact integers).

/// `n` with the noun in the form that agrees with it: `1 entry`, `0 entries`, `2 entries`.
pub fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{} {}", grouped(n as u64), if n == 1 { one } else { many })
}

/// A size in decimal units, as disks are sold: `512 B`, `122.35 kB`, `1.43 GB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    match u {
        0 => format!("{bytes} B"),
        _ => format!("{v:.2} {}", UNITS[u]),
    }
}

/// An integer with `,` between groups of three digits: `1,418,996,800`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_sizes_and_groups_read_as_written() {
        assert_eq!(plural(1, "entry", "entries"), "1 entry");
        assert_eq!(plural(0, "entry", "entries"), "0 entries");
        assert_eq!(plural(1200, "file", "files"), "1,200 files");
        assert_eq!(size(999), "999 B");
        assert_eq!(size(122_350), "122.35 kB");
        assert_eq!(size(1_430_000_000), "1.43 GB");
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(100), "100");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(1_418_996_800), "1,418,996,800");
    }
}
