//! Dataset properties: names, defaults, inheritance and validation
//! (zfsprops(7)). Local values are stored as strings in the dataset's
//! record; `get` resolves local → inherited → default and says which.

use crate::dmu::checksum::ChecksumType;
use crate::dmu::compress::Compression;
use crate::error::{Error, Result};

pub struct PropDef {
    pub name: &'static str,
    pub default: &'static str,
    pub inherit: bool,
}

/// Settable properties. `mountpoint`'s default is computed (`/` + name).
pub const SETTABLE: &[PropDef] = &[
    PropDef {
        name: "mountpoint",
        default: "",
        inherit: true,
    },
    PropDef {
        name: "canmount",
        default: "on",
        inherit: false,
    },
    PropDef {
        name: "readonly",
        default: "off",
        inherit: true,
    },
    PropDef {
        name: "atime",
        default: "on",
        inherit: true,
    },
    PropDef {
        name: "acltype",
        default: "off",
        inherit: true,
    },
    PropDef {
        name: "recordsize",
        default: "128K",
        inherit: true,
    },
    PropDef {
        name: "compression",
        default: "on",
        inherit: true,
    },
    PropDef {
        name: "checksum",
        default: "on",
        inherit: true,
    },
    PropDef {
        name: "copies",
        default: "1",
        inherit: true,
    },
    PropDef {
        name: "sync",
        default: "standard",
        inherit: true,
    },
    PropDef {
        name: "logbias",
        default: "latency",
        inherit: true,
    },
    PropDef {
        name: "snapdir",
        default: "hidden",
        inherit: true,
    },
    PropDef {
        name: "quota",
        default: "none",
        inherit: false,
    },
    PropDef {
        name: "refquota",
        default: "none",
        inherit: false,
    },
    PropDef {
        name: "reservation",
        default: "none",
        inherit: false,
    },
    PropDef {
        name: "refreservation",
        default: "none",
        inherit: false,
    },
    PropDef {
        name: "snapshot_limit",
        default: "none",
        inherit: false,
    },
];

/// Read-only properties (computed).
pub const READONLY: &[&str] = &[
    "type",
    "creation",
    "used",
    "available",
    "referenced",
    "compressratio",
    "logicalused",
    "logicalreferenced",
    "mounted",
    "name",
    "usedbychildren",
    "usedbydataset",
    "usedbysnapshots",
    "snapshot_count",
    "usedbyrefreservation",
    "origin",
    "written",
];

pub fn def(name: &str) -> Option<&'static PropDef> {
    SETTABLE.iter().find(|d| d.name == name)
}

/// Parse a size with an optional K/M/G/T/P suffix (zfs(8) style).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let up = t.to_ascii_uppercase();
    let up = up.strip_suffix('B').unwrap_or(&up);
    let (num, mult) = match up.chars().last() {
        Some('K') => (&up[..up.len() - 1], 1u64 << 10),
        Some('M') => (&up[..up.len() - 1], 1 << 20),
        Some('G') => (&up[..up.len() - 1], 1 << 30),
        Some('T') => (&up[..up.len() - 1], 1 << 40),
        Some('P') => (&up[..up.len() - 1], 1 << 50),
        _ => (up, 1),
    };
    let bad = || Error::invalid(format!("bad size '{s}'"));
    if num.contains('.') {
        let f: f64 = num.parse().map_err(|_| bad())?;
        if !(0.0..1e18).contains(&f) {
            return Err(bad());
        }
        return Ok((f * mult as f64) as u64);
    }
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(bad)
}

fn on_off(v: &str) -> Result<String> {
    match v {
        "on" | "off" => Ok(v.to_string()),
        _ => Err(Error::invalid(format!("'{v}' must be 'on' or 'off'"))),
    }
}

/// Validate and normalize a value for property `name`.
pub fn validate(name: &str, v: &str) -> Result<String> {
    let bad = |why: &str| Err(Error::invalid(format!("bad {name} '{v}': {why}")));
    match name {
        "mountpoint" => {
            if v == "none" || v == "legacy" || (v.starts_with('/') && !v.contains('\0')) {
                Ok(v.trim_end_matches('/').to_string()).map(|s| {
                    if s.is_empty() {
                        "/".into()
                    } else {
                        s
                    }
                })
            } else {
                bad("must be an absolute path, 'none' or 'legacy'")
            }
        }
        "canmount" => match v {
            "on" | "off" | "noauto" => Ok(v.into()),
            _ => bad("must be 'on', 'off' or 'noauto'"),
        },
        "readonly" | "atime" => on_off(v),
        // OpenZFS's names; `noacl` and `posixacl` are its aliases. NFSv4
        // ACLs are not implemented: refused, never stored unenforced.
        "acltype" => match v {
            "off" | "noacl" => Ok("off".into()),
            "posix" | "posixacl" => Ok("posix".into()),
            "nfsv4" => bad("NFSv4 ACLs are not supported; use 'posix' or 'off'"),
            _ => bad("must be 'off' or 'posix'"),
        },
        "recordsize" => {
            let n = parse_size(v)?;
            if !(512..=1 << 20).contains(&n) || !n.is_power_of_two() {
                return bad("must be a power of 2 from 512B to 1M");
            }
            Ok(fmt_size(n))
        }
        "compression" => {
            compression_of(v)?;
            Ok(v.into())
        }
        "checksum" => {
            checksum_of(v)?;
            Ok(v.into())
        }
        // `disabled` acknowledges fsync at once: the pool stays consistent,
        // the last seconds of acknowledged writes can be lost in a crash.
        "sync" => match v {
            "standard" | "always" | "disabled" => Ok(v.into()),
            _ => bad("must be 'standard', 'always' or 'disabled'"),
        },
        // `throughput`: every whole block is logged by pointer (written
        // once), not only large ones (`zil/mod.rs`).
        "logbias" => match v {
            "latency" | "throughput" => Ok(v.into()),
            _ => bad("must be 'latency' or 'throughput'"),
        },
        // `.zfs` answers lookups either way; `visible` also lists it in
        // the root directory.
        "snapdir" => match v {
            "hidden" | "visible" => Ok(v.into()),
            _ => bad("must be 'hidden' or 'visible'"),
        },
        "copies" => match v {
            "1" | "2" | "3" => Ok(v.into()),
            _ => bad("must be 1, 2 or 3"),
        },
        // `refquota` limits what the dataset itself references (not its
        // snapshots or children); `quota` all it uses.
        "quota" | "reservation" | "refquota" | "refreservation" => {
            if v == "none" {
                return Ok(v.into());
            }
            let n = parse_size(v)?;
            if n == 0 {
                return Ok("none".into());
            }
            Ok(n.to_string())
        }
        // At most this many snapshots of the dataset and its descendants.
        "snapshot_limit" => {
            if v == "none" {
                return Ok(v.into());
            }
            match v.parse::<u64>() {
                Ok(n) => Ok(n.to_string()),
                Err(_) => bad("must be a number of snapshots or 'none'"),
            }
        }
        _ if is_user_prop(name) => {
            if v.len() > 8192 {
                return bad("a user property's value is at most 8192 bytes");
            }
            Ok(v.into())
        }
        _ if NOT_YET.contains(&name) => Err(Error::Unsupported(format!(
            "property '{name}' is not supported yet"
        ))),
        _ => Err(Error::invalid(format!("invalid property '{name}'"))),
    }
}

/// A user property (zfsprops(7), "User Properties"): `module:name`, at
/// most 256 bytes of lowercase letters, digits and `:-._`, with a colon.
/// Stored and inherited like native ones; uzfs gives them no meaning.
pub fn is_user_prop(name: &str) -> bool {
    name.contains(':')
        && !name.starts_with(':')
        && name.len() <= 256
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ":-._".contains(c))
}

/// A property set on a snapshot: user properties only (its native ones
/// are fixed); `Some(value)` comes back validated, `None` is an inherit.
pub fn snapshot_prop(name: &str, value: Option<&str>) -> Result<Option<String>> {
    if !is_user_prop(name) {
        return Err(Error::invalid(format!(
            "property '{name}' cannot be set on a snapshot (only user properties, module:name)"
        )));
    }
    value.map(|v| validate(name, v)).transpose()
}

/// zfsprops(7) properties uzfs does not have yet: refused as such, never
/// stored without effect.
pub const NOT_YET: &[&str] = &[
    "aclinherit",
    "aclmode",
    "casesensitivity",
    "context",
    "dedup",
    "defcontext",
    "devices",
    "direct",
    "dnodesize",
    "encryption",
    "exec",
    "filesystem_limit",
    "fscontext",
    "keyformat",
    "keylocation",
    "mlslabel",
    "nbmand",
    "normalization",
    "overlay",
    "pbkdf2iters",
    "prefetch",
    "primarycache",
    "redundant_metadata",
    "relatime",
    "rootcontext",
    "secondarycache",
    "setuid",
    "sharenfs",
    "sharesmb",
    "snapdev",
    "special_small_blocks",
    "utf8only",
    "volblocksize",
    "volmode",
    "volsize",
    "vscan",
    "xattr",
    "zoned",
];

/// `on` means lz4 (as in OpenZFS). zstd-N and gzip-N levels are accepted;
/// gzip is stored as zstd (the pool has no gzip codec; a documented departure).
pub fn compression_of(v: &str) -> Result<Compression> {
    match v {
        "off" => Ok(Compression::Off),
        "on" | "lz4" => Ok(Compression::Lz4),
        "zstd" | "gzip" => Ok(Compression::Zstd),
        _ => {
            let lvl = v
                .strip_prefix("zstd-")
                .or_else(|| v.strip_prefix("gzip-"))
                .and_then(|n| n.parse::<u32>().ok());
            match lvl {
                Some(1..=19) if v.starts_with("zstd") => Ok(Compression::Zstd),
                Some(1..=9) => Ok(Compression::Zstd),
                _ => Err(Error::invalid(format!(
                    "bad compression '{v}': use off, on, lz4, zstd, zstd-1..19 or gzip-1..9"
                ))),
            }
        }
    }
}

pub fn checksum_of(v: &str) -> Result<ChecksumType> {
    match v {
        "on" | "fletcher4" => Ok(ChecksumType::Fletcher4),
        "sha256" => Ok(ChecksumType::Sha256),
        "blake3" => Ok(ChecksumType::Blake3),
        "off" => Err(Error::invalid(
            "checksum=off is not supported: every block is checksummed",
        )),
        _ => Err(Error::invalid(format!(
            "bad checksum '{v}': use on, fletcher4, sha256 or blake3"
        ))),
    }
}

/// 131072 -> "128K", as zfs(8) prints sizes.
pub fn fmt_size(n: u64) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    if n < 1024 {
        return format!("{n}B").replace("B", if n == 0 { "" } else { "B" });
    }
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if (v - v.round()).abs() < 1e-9 {
        format!("{}{}", v.round() as u64, UNITS[u])
    } else if v < 10.0 {
        format!("{v:.2}{}", UNITS[u])
    } else if v < 100.0 {
        format!("{v:.1}{}", UNITS[u])
    } else {
        format!("{v:.0}{}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128K").ok(), Some(128 << 10));
        assert_eq!(parse_size("1.5G").ok(), Some(3 << 29));
        assert_eq!(parse_size("512").ok(), Some(512));
        assert!(parse_size("12Q").is_err());
        assert_eq!(fmt_size(131072), "128K");
        assert_eq!(fmt_size(1 << 20), "1M");
        assert_eq!(fmt_size(1536), "1.50K");
    }

    #[test]
    fn validation() {
        assert!(validate("recordsize", "3K").is_err());
        assert!(validate("recordsize", "2M").is_err());
        assert_eq!(
            validate("recordsize", "1048576").ok().as_deref(),
            Some("1M")
        );
        assert!(validate("compression", "zstd-3").is_ok());
        assert!(validate("compression", "zstd-30").is_err());
        assert!(validate("checksum", "off").is_err());
        assert!(validate("mountpoint", "rel/path").is_err());
        assert_eq!(
            validate("mountpoint", "/a/b/").ok().as_deref(),
            Some("/a/b")
        );
        assert!(validate("copies", "4").is_err());
        assert!(validate("nosuch", "x").is_err());
    }
}
