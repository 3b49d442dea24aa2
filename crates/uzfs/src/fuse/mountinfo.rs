//! `/proc/self/mountinfo`: which FUSE connection serves a mount point,
//! read without touching the mount (a daemon that stats its own mount
//! sends itself a request, and one killed while that request is being
//! served can never finish dying: see `crate::wedge`).

use std::path::Path;

/// The FUSE mounts of a `/proc/self/mountinfo` text, in its order: (the
/// `MAJ:MIN` of the mount's device, its mountpoint unescaped).
fn fuse_mounts(mountinfo: &str) -> impl Iterator<Item = (&str, String)> {
    mountinfo.lines().filter_map(|line| {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let mut f = line.split(' ');
        let (_, _, dev, _, at) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        is_fuse(line).then(|| (dev, unescape(at)))
    })
}

/// The `MAJ:MIN` of the last FUSE mount at `mountpoint` in a
/// `/proc/self/mountinfo` text (the last: a mount stacked over older ones
/// is listed after them).
pub fn fuse_mount_dev(mountinfo: &str, mountpoint: &Path) -> Option<String> {
    let want = mountpoint.to_str()?;
    fuse_mounts(mountinfo)
        .filter(|(_, at)| at == want)
        .last()
        .map(|(dev, _)| dev.to_string())
}

/// [`fuse_mount_dev`] of this process's mount table now.
pub fn fuse_dev(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    fuse_mount_dev(&info, mountpoint)
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether FUSE connection `minor` still serves a mount at `mountpoint`
/// (the minor is not reused by some other filesystem since it was noted).
pub fn serves(minor: u32, mountpoint: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let found = fuse_mounts(&info)
        .any(|(dev, at)| minor_of(dev) == Some(minor) && Path::new(&at) == mountpoint);
    found
}

/// "0:43" -> 43, the connection's name under `/sys/fs/fuse/connections`:
/// FUSE's devices are anonymous (major 0).
/// "0:43" -> 43: FUSE's devices are anonymous (major 0).
pub fn minor_of(dev: &str) -> Option<u32> {
    match dev.split_once(':') {
        Some(("0", m)) => m.parse().ok(),
        _ => None,
    }
}

fn is_fuse(line: &str) -> bool {
    let fstype = line.split(" - ").nth(1).and_then(|s| s.split(' ').next());
    fstype.is_some_and(|t| t == "fuse" || t.starts_with("fuse."))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:41 / /mnt/a\\040b rw,nosuid shared:2 - fuse.uzfs p1 rw,user_id=0
41 22 0:42 / /mnt/c rw shared:3 - fuse.uzfs p2/fs rw,user_id=0
42 41 0:43 / /mnt/c rw shared:4 - fuse.uzfs p3 rw,user_id=0
43 22 0:44 / /mnt/d rw shared:5 - tmpfs tmpfs rw
";

    #[test]
    fn finds_the_top_fuse_mount() {
        assert_eq!(
            fuse_mount_dev(INFO, Path::new("/mnt/a b")).as_deref(),
            Some("0:41")
        );
        assert_eq!(
            fuse_mount_dev(INFO, Path::new("/mnt/c")).as_deref(),
            Some("0:43")
        );
        assert_eq!(fuse_mount_dev(INFO, Path::new("/mnt/d")), None);
        assert_eq!(fuse_mount_dev(INFO, Path::new("/mnt")), None);
    }

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape("/a\\040b\\134c"), "/a b\\c");
        assert_eq!(unescape("/x\\04"), "/x\\04");
    }

    #[test]
    fn minors() {
        assert_eq!(minor_of("0:43"), Some(43));
        assert_eq!(minor_of("8:1"), None);
        assert_eq!(minor_of("junk"), None);
    }
}
