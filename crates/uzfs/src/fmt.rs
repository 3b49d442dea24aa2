//! Output helpers shared by the commands: OpenZFS-style human numbers and
//! column tables (`-H` for tab-separated scripted output, `-p` for exact
//! numbers).

/// zfs_nicenum: at most 3 significant digits, binary units: 960M, 1.50G, 116K.
pub fn nicenum(n: u64) -> String {
    const UNITS: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    if n < 1024 {
        return n.to_string();
    }
    let mut i = 0;
    let mut v = n as f64;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    // An exact multiple of the unit shows no decimals ("64M", not
    // "64.0M"), as zfs_nicenum_format.
    if n & ((1u64 << (10 * i)) - 1) == 0 {
        return format!("{}{}", n >> (10 * i), UNITS[i]);
    }
    let s = if v < 10.0 {
        format!("{:.2}", v)
    } else if v < 100.0 {
        format!("{:.1}", v)
    } else {
        format!("{:.0}", v)
    };
    format!("{s}{}", UNITS[i])
}

/// zfs_nicebytes: like `nicenum` with a "B" below 1 KiB: 0B, 512B, 1.50M.
pub fn nicebytes(n: u64) -> String {
    if n < 1024 {
        format!("{n}B")
    } else {
        nicenum(n)
    }
}

pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Columns that are right-aligned.
    pub right: Vec<bool>,
}

impl Table {
    pub fn new(header: &[&str], right: &[bool]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
            right: right.to_vec(),
        }
    }

    pub fn render(&self, scripted: bool) -> String {
        let mut out = String::new();
        if scripted {
            for r in &self.rows {
                out.push_str(&r.join("\t"));
                out.push('\n');
            }
            return out;
        }
        let n = self.header.len();
        let mut w = vec![0usize; n];
        for r in std::iter::once(&self.header).chain(self.rows.iter()) {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.len());
            }
        }
        for r in std::iter::once(&self.header).chain(self.rows.iter()) {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate().take(n) {
                if i > 0 {
                    line.push_str("  ");
                }
                if self.right.get(i).copied().unwrap_or(false) {
                    line.push_str(&format!("{c:>width$}", width = w[i]));
                } else if i + 1 == n {
                    line.push_str(c);
                } else {
                    line.push_str(&format!("{c:<width$}", width = w[i]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::nicenum;
    #[test]
    fn nicenum_matches_zfs_style() {
        assert_eq!(nicenum(0), "0");
        assert_eq!(nicenum(1023), "1023");
        assert_eq!(nicenum(116 * 1024), "116K");
        assert_eq!(nicenum(960 << 20), "960M");
        assert_eq!(nicenum(3 << 29), "1.50G");
    }
}
