//! A mirror side blanked behind the pool's back (truncated to 0 and grown
//! again, as a disk overwritten with zeros) is noticed by itself, without
//! a scrub: its labels are gone, so it is faulted, and `zpool clear`
//! resilvers it whole. Before, it stayed ONLINE with 0 errors until a
//! scrub, and `zpool clear` resilvered only the txgs it had missed while
//! out, leaving a later scrub to repair the rest.

mod common;
use common::{get_matches, noise, put_bytes, Env};

fn leaf_state(st: &str, dev: &str) -> String {
    st.lines()
        .find(|l| l.split_whitespace().next() == Some(dev))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("")
        .to_string()
}

#[test]
fn a_blanked_mirror_side_is_faulted_and_resilvered_whole() {
    blanked(true);
}

/// Truncated to 0 and left so: the pool's writes make it a sparse file
/// again, shorter than the device was.
#[test]
fn a_truncated_mirror_side_is_faulted_and_resilvered_whole() {
    blanked(false);
}

fn blanked(grow_back: bool) {
    let e = Env::new();
    let a = e.disk("a", 256);
    let b = e.disk("b", 256);
    e.ok(&["zpool", "create", "tank", "mirror", &a, &b]);
    let before = put_bytes(&e, "tank", 1, &noise(1, 40 << 20));
    e.ok(&["zpool", "sync", "tank"]);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&b)
        .expect("open b");
    f.set_len(0).expect("truncate");
    if grow_back {
        f.set_len(256 << 20).expect("grow");
    }
    drop(f);
    // The pool keeps working meanwhile, and notices within seconds.
    let mut seed = 10u8;
    let t0 = std::time::Instant::now();
    let mut st = String::new();
    while t0.elapsed().as_secs() < 20 {
        put_bytes(&e, "tank", seed, &noise(seed as u64, 64 << 10));
        seed += 1;
        st = e.ok(&["zpool", "status", "tank"]);
        if leaf_state(&st, &b) == "FAULTED" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    assert_eq!(leaf_state(&st, &b), "FAULTED", "{st}");
    assert_eq!(leaf_state(&st, &a), "ONLINE", "{st}");
    let hist = e.ok(&["zpool", "history", "-i", "tank"]);
    assert!(hist.contains("labels vanished"), "{hist}");
    let after = put_bytes(&e, "tank", 2, &noise(2, 4 << 20));
    e.ok(&["zpool", "clear", "tank"]);
    e.ok(&["zpool", "wait", "-t", "resilver", "tank"]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert_eq!(leaf_state(&st, &b), "ONLINE", "{st}");
    // Resilvered whole: a scrub finds nothing left to repair.
    e.ok(&["zpool", "scrub", "-w", "tank"]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(
        st.contains("scrub repaired 0B") && st.contains("with 0 errors"),
        "{st}"
    );
    get_matches(&e, "tank", &before, 1);
    get_matches(&e, "tank", &after, 2);
    // The blanked side alone holds everything: detach the other.
    e.ok(&["zpool", "detach", "tank", &a]);
    e.ok(&["zinject", "-a", "tank"]);
    get_matches(&e, "tank", &before, 1);
    e.export_and_zdb("tank");
}
