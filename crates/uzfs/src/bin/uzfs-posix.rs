//! uzfs-posix: a POSIX conformance suite for a mounted filesystem.
//!
//!     uzfs-posix DIR [--other DIR2] [--quota DIR3]
//!
//! Runs every check in a fresh subdirectory of DIR through raw system calls
//! and compares exact errno values. As root it also makes device nodes and
//! changes owners; as an unprivileged user it checks that the kernel's
//! permission rules hold (EACCES, EPERM). `--other` names a directory on a
//! different dataset (rename there must fail with EXDEV); `--quota` one on
//! a dataset with a small quota (filling it must fail with EDQUOT or ENOSPC
//! and leave it usable). Prints one line per check; exits with the number
//! of failures.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

struct Suite {
    dir: PathBuf,
    fails: u32,
    root: bool,
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Run a libc call returning -1 on error: Ok(ret) or Err(errno).
fn sys(r: i64) -> Result<i64, i32> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

fn stat(p: &Path) -> Result<libc::stat, i32> {
    // SAFETY: `st` is plain data written by the kernel; the path is valid.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        sys(libc::lstat(c(p).as_ptr(), &mut st) as i64).map(|_| st)
    }
}

fn fstat(fd: i32) -> Result<libc::stat, i32> {
    // SAFETY: as for `stat`.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        sys(libc::fstat(fd, &mut st) as i64).map(|_| st)
    }
}

fn open(p: &Path, flags: i32, mode: u32) -> Result<i32, i32> {
    // SAFETY: valid path pointer.
    sys(unsafe { libc::open(c(p).as_ptr(), flags, mode) } as i64).map(|f| f as i32)
}

fn close(fd: i32) {
    // SAFETY: closing a descriptor we own.
    unsafe {
        libc::close(fd);
    }
}

fn pwrite(fd: i32, b: &[u8], off: i64) -> Result<i64, i32> {
    // SAFETY: the buffer is valid for b.len() bytes.
    sys(unsafe { libc::pwrite(fd, b.as_ptr().cast(), b.len(), off) } as i64)
}

fn pread(fd: i32, n: usize, off: i64) -> Result<Vec<u8>, i32> {
    let mut b = vec![0u8; n];
    // SAFETY: the buffer is valid for n bytes.
    let r = sys(unsafe { libc::pread(fd, b.as_mut_ptr().cast(), n, off) } as i64)?;
    b.truncate(r as usize);
    Ok(b)
}

macro_rules! call {
    ($e:expr) => {
        // SAFETY: every pointer passed is a live CString or buffer.
        sys(unsafe { $e } as i64)
    };
}

impl Suite {
    fn p(&self, s: &str) -> PathBuf {
        self.dir.join(s)
    }

    fn check(&mut self, name: &str, r: Result<(), String>) {
        match r {
            Ok(()) => println!("ok   {name}"),
            Err(e) => {
                println!("FAIL {name}: {e}");
                self.fails += 1;
            }
        }
    }

    fn expect_err(what: &str, r: Result<i64, i32>, want: i32) -> Result<(), String> {
        match r {
            Err(e) if e == want => Ok(()),
            Err(e) => Err(format!("{what}: errno {e}, expected {want}")),
            Ok(_) => Err(format!("{what}: succeeded, expected errno {want}")),
        }
    }
}

fn ok<T>(what: &str, r: Result<T, i32>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: errno {e}"))
}

fn ensure(cond: bool, msg: impl Into<String>) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg.into())
    }
}

fn write_file(p: &Path, data: &[u8]) -> Result<(), String> {
    std::fs::write(p, data).map_err(|e| format!("write {}: {e}", p.display()))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(base) = args.get(1) else {
        eprintln!("usage: uzfs-posix DIR [--other DIR2] [--quota DIR3]");
        std::process::exit(2);
    };
    let opt = |n: &str| {
        args.iter()
            .position(|a| a == n)
            .and_then(|i| args.get(i + 1))
            .map(PathBuf::from)
    };
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let dir = Path::new(base).join(format!(
        "posix-{}-{}",
        if root { "root" } else { "user" },
        std::process::id()
    ));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        std::process::exit(2);
    }
    // SAFETY: umask has no preconditions.
    unsafe {
        libc::umask(0o022);
    }
    let mut s = Suite {
        dir,
        fails: 0,
        root,
    };
    files(&mut s);
    holes(&mut s);
    dirs(&mut s);
    unlink_open(&mut s);
    renames(&mut s);
    links(&mut s);
    special(&mut s);
    attrs(&mut s);
    perms(&mut s);
    xattrs(&mut s);
    mmap(&mut s);
    bigdir(&mut s);
    if let Some(o) = opt("--other") {
        let r = (|| {
            let f = s.p("xdev");
            write_file(&f, b"x")?;
            Suite::expect_err(
                "rename across datasets",
                call!(libc::rename(
                    c(&f).as_ptr(),
                    c(&o.join("xdev-target")).as_ptr()
                )),
                libc::EXDEV,
            )
        })();
        s.check("rename across datasets: EXDEV", r);
    }
    statfs(&mut s);
    if let Some(q) = opt("--quota") {
        full(&mut s, &q);
    }
    let _ = std::fs::remove_dir_all(&s.dir);
    println!("{} failures", s.fails);
    std::process::exit(s.fails.min(100) as i32);
}

fn files(s: &mut Suite) {
    let f = s.p("file");
    let r = (|| {
        let fd = ok(
            "create",
            open(&f, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644),
        )?;
        ok("write", pwrite(fd, b"hello world", 0))?;
        let back = ok("read", pread(fd, 100, 0))?;
        close(fd);
        ensure(back == b"hello world", format!("read back {back:?}"))?;
        Suite::expect_err(
            "O_EXCL on existing",
            open(&f, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644).map(i64::from),
            libc::EEXIST,
        )?;
        Suite::expect_err(
            "open missing",
            open(&s.p("missing"), libc::O_RDONLY, 0).map(i64::from),
            libc::ENOENT,
        )?;
        Suite::expect_err(
            "file as directory",
            open(&f.join("x"), libc::O_RDONLY, 0).map(i64::from),
            libc::ENOTDIR,
        )?;
        Suite::expect_err(
            "open dir for writing",
            open(&s.dir, libc::O_WRONLY, 0).map(i64::from),
            libc::EISDIR,
        )?;
        let long = s.p(&"n".repeat(256));
        Suite::expect_err(
            "256-byte name",
            open(&long, libc::O_CREAT | libc::O_RDWR, 0o644).map(i64::from),
            libc::ENAMETOOLONG,
        )?;
        let max = s.p(&"m".repeat(255));
        let fd = ok(
            "255-byte name",
            open(&max, libc::O_CREAT | libc::O_RDWR, 0o644),
        )?;
        close(fd);
        // O_APPEND, O_TRUNC
        let fd = ok("append", open(&f, libc::O_WRONLY | libc::O_APPEND, 0))?;
        ok(
            "append write",
            call!(libc::write(fd, b"!!".as_ptr().cast(), 2)),
        )?;
        close(fd);
        ensure(
            std::fs::read(&f).map_err(|e| e.to_string())? == b"hello world!!",
            "O_APPEND",
        )?;
        let fd = ok("trunc", open(&f, libc::O_WRONLY | libc::O_TRUNC, 0))?;
        let st = ok("fstat", fstat(fd))?;
        close(fd);
        ensure(st.st_size == 0, "O_TRUNC left data")?;
        // ftruncate grow and shrink
        let fd = ok("open", open(&f, libc::O_RDWR, 0))?;
        ok("write", pwrite(fd, &[7u8; 10000], 0))?;
        ok("ftruncate shrink", call!(libc::ftruncate(fd, 100)))?;
        ok("ftruncate grow", call!(libc::ftruncate(fd, 5000)))?;
        let b = ok("read", pread(fd, 5000, 0))?;
        ensure(
            b.len() == 5000 && b[..100].iter().all(|&x| x == 7) && b[100..].iter().all(|&x| x == 0),
            "truncate down/up contents",
        )?;
        Suite::expect_err(
            "ftruncate negative",
            call!(libc::ftruncate(fd, -1)),
            libc::EINVAL,
        )?;
        ok("fsync", call!(libc::fsync(fd)))?;
        ok("fdatasync", call!(libc::fdatasync(fd)))?;
        close(fd);
        Suite::expect_err(
            "truncate dir",
            call!(libc::truncate(c(&s.dir).as_ptr(), 0)),
            libc::EISDIR,
        )?;
        // Large write, crossing record boundaries, unaligned.
        let data: Vec<u8> = (0..3_000_001u32).map(|i| (i * 31 % 251) as u8).collect();
        write_file(&f, &data)?;
        ensure(
            std::fs::read(&f).map_err(|e| e.to_string())? == data,
            "3 MB round trip",
        )?;
        Ok(())
    })();
    s.check("create/open/read/write/truncate and their errors", r);
}

fn holes(s: &mut Suite) {
    let f = s.p("sparse");
    let r = (|| {
        let fd = ok("create", open(&f, libc::O_CREAT | libc::O_RDWR, 0o644))?;
        ok("write far", pwrite(fd, b"tail", 64 << 20))?;
        ok("fsync", call!(libc::fsync(fd)))?;
        let st = ok("fstat", fstat(fd))?;
        ensure(st.st_size == (64 << 20) + 4, "sparse size")?;
        ensure(
            st.st_blocks * 512 < (1 << 20),
            format!("sparse file takes {} blocks", st.st_blocks),
        )?;
        let z = ok("read hole", pread(fd, 65536, 1 << 20))?;
        ensure(
            z.iter().all(|&b| b == 0) && z.len() == 65536,
            "hole reads zeros",
        )?;
        let data_at = ok("SEEK_DATA", call!(libc::lseek(fd, 0, libc::SEEK_DATA)))?;
        ensure(
            data_at > 0 && data_at <= 64 << 20,
            format!("SEEK_DATA -> {data_at}"),
        )?;
        let hole_at = ok("SEEK_HOLE", call!(libc::lseek(fd, 0, libc::SEEK_HOLE)))?;
        ensure(hole_at == 0, format!("SEEK_HOLE -> {hole_at}"))?;
        // fallocate: extend, then punch a hole in written data
        ok(
            "fallocate extend",
            call!(libc::fallocate(fd, 0, 0, 70 << 20)),
        )?;
        ensure(
            ok("fstat", fstat(fd))?.st_size == 70 << 20,
            "fallocate extends",
        )?;
        let fill = noise(4 << 20, 3);
        ok("fill", pwrite(fd, &fill, 0))?;
        ok("fsync", call!(libc::fsync(fd)))?;
        // st_blocks is charged at txg commit and the kernel caches
        // attributes for 1 s: wait that out before comparing.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let before = ok("fstat", fstat(fd))?.st_blocks;
        ok(
            "punch",
            call!(libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                1000,
                3 << 20
            )),
        )?;
        ok("fsync", call!(libc::fsync(fd)))?;
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let after = ok("fstat", fstat(fd))?.st_blocks;
        ensure(
            after < before,
            format!("punch freed nothing ({before} -> {after} blocks)"),
        )?;
        let b = ok("read", pread(fd, 4 << 20, 0))?;
        ensure(b[..1000] == fill[..1000], "before the hole")?;
        ensure(
            b[1000..1000 + (3 << 20)].iter().all(|&x| x == 0),
            "the hole",
        )?;
        ensure(
            b[1000 + (3 << 20)..] == fill[1000 + (3 << 20)..],
            "after the hole",
        )?;
        Suite::expect_err(
            "punch without KEEP_SIZE",
            call!(libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE, 0, 10)),
            libc::EOPNOTSUPP,
        )?;
        close(fd);
        Ok(())
    })();
    s.check("sparse files, holes, fallocate, SEEK_DATA/SEEK_HOLE", r);
}

fn dirs(s: &mut Suite) {
    let d = s.p("d");
    let r = (|| {
        ok("mkdir", call!(libc::mkdir(c(&d).as_ptr(), 0o755)))?;
        Suite::expect_err(
            "mkdir existing",
            call!(libc::mkdir(c(&d).as_ptr(), 0o755)),
            libc::EEXIST,
        )?;
        ok(
            "mkdir sub",
            call!(libc::mkdir(c(&d.join("sub")).as_ptr(), 0o755)),
        )?;
        ensure(
            ok("stat", stat(&d))?.st_nlink == 3,
            "parent nlink counts subdirs",
        )?;
        Suite::expect_err(
            "rmdir non-empty",
            call!(libc::rmdir(c(&d).as_ptr())),
            libc::ENOTEMPTY,
        )?;
        write_file(&d.join("f"), b"x")?;
        Suite::expect_err(
            "rmdir file",
            call!(libc::rmdir(c(&d.join("f")).as_ptr())),
            libc::ENOTDIR,
        )?;
        Suite::expect_err(
            "unlink dir",
            call!(libc::unlink(c(&d.join("sub")).as_ptr())),
            libc::EISDIR,
        )?;
        Suite::expect_err(
            "rmdir missing",
            call!(libc::rmdir(c(&d.join("nope")).as_ptr())),
            libc::ENOENT,
        )?;
        Suite::expect_err(
            "rmdir .",
            call!(libc::rmdir(c(&d.join("sub/.")).as_ptr())),
            libc::EINVAL,
        )?;
        Suite::expect_err(
            "mkdir under file",
            call!(libc::mkdir(c(&d.join("f/x")).as_ptr(), 0o755)),
            libc::ENOTDIR,
        )?;
        ok("rmdir", call!(libc::rmdir(c(&d.join("sub")).as_ptr())))?;
        ensure(ok("stat", stat(&d))?.st_nlink == 2, "nlink after rmdir")?;
        let names: Vec<String> = std::fs::read_dir(&d)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        ensure(names == vec!["f".to_string()], format!("readdir {names:?}"))?;
        Ok(())
    })();
    s.check("mkdir/rmdir/readdir and their errors", r);
}

fn unlink_open(s: &mut Suite) {
    let f = s.p("doomed");
    let r = (|| {
        write_file(&f, &[5u8; 200_000])?;
        let fd = ok("open", open(&f, libc::O_RDWR, 0))?;
        ok("unlink", call!(libc::unlink(c(&f).as_ptr())))?;
        Suite::expect_err("stat after unlink", stat(&f).map(|_| 0), libc::ENOENT)?;
        let b = ok("read after unlink", pread(fd, 200_000, 0))?;
        ensure(
            b.len() == 200_000 && b.iter().all(|&x| x == 5),
            "data of an unlinked open file",
        )?;
        ok("write after unlink", pwrite(fd, b"more", 200_000))?;
        let st = ok("fstat", fstat(fd))?;
        ensure(st.st_nlink == 0, format!("nlink {}", st.st_nlink))?;
        close(fd);
        Ok(())
    })();
    s.check("unlink of an open file keeps its data until close", r);
}

fn renames(s: &mut Suite) {
    let r = (|| {
        let a = s.p("ra");
        let b = s.p("rb");
        write_file(&a, b"A")?;
        write_file(&b, b"B")?;
        ok(
            "rename over file",
            call!(libc::rename(c(&a).as_ptr(), c(&b).as_ptr())),
        )?;
        ensure(
            std::fs::read(&b).map_err(|e| e.to_string())? == b"A",
            "rename over file content",
        )?;
        let d1 = s.p("rd1");
        let d2 = s.p("rd2");
        std::fs::create_dir(&d1).map_err(|e| e.to_string())?;
        std::fs::create_dir(&d2).map_err(|e| e.to_string())?;
        ok(
            "rename dir over empty dir",
            call!(libc::rename(c(&d1).as_ptr(), c(&d2).as_ptr())),
        )?;
        std::fs::create_dir(&d1).map_err(|e| e.to_string())?;
        write_file(&d2.join("x"), b"x")?;
        Suite::expect_err(
            "rename over non-empty dir",
            call!(libc::rename(c(&d1).as_ptr(), c(&d2).as_ptr())),
            libc::ENOTEMPTY,
        )?;
        Suite::expect_err(
            "dir over file",
            call!(libc::rename(c(&d1).as_ptr(), c(&b).as_ptr())),
            libc::ENOTDIR,
        )?;
        Suite::expect_err(
            "file over dir",
            call!(libc::rename(c(&b).as_ptr(), c(&d1).as_ptr())),
            libc::EISDIR,
        )?;
        std::fs::create_dir(d1.join("inner")).map_err(|e| e.to_string())?;
        Suite::expect_err(
            "dir into itself",
            call!(libc::rename(
                c(&d1).as_ptr(),
                c(&d1.join("inner/x")).as_ptr()
            )),
            libc::EINVAL,
        )?;
        ok(
            "rename across dirs",
            call!(libc::rename(
                c(&b).as_ptr(),
                c(&d1.join("inner/moved")).as_ptr()
            )),
        )?;
        ensure(
            std::fs::read(d1.join("inner/moved")).map_err(|e| e.to_string())? == b"A",
            "moved content",
        )?;
        ok(
            "dir across dirs",
            call!(libc::rename(
                c(&d1.join("inner")).as_ptr(),
                c(&d2.join("inner2")).as_ptr()
            )),
        )?;
        ensure(
            ok("stat", stat(&d1))?.st_nlink == 2 && ok("stat", stat(&d2))?.st_nlink == 3,
            "nlink after moving a dir",
        )?;
        let p1 = c(&d2.join("x"));
        let p2 = c(&d2.join("inner2/moved"));
        Suite::expect_err(
            "RENAME_NOREPLACE",
            call!(libc::renameat2(
                libc::AT_FDCWD,
                p1.as_ptr(),
                libc::AT_FDCWD,
                p2.as_ptr(),
                libc::RENAME_NOREPLACE
            )),
            libc::EEXIST,
        )?;
        ok(
            "RENAME_EXCHANGE",
            call!(libc::renameat2(
                libc::AT_FDCWD,
                p1.as_ptr(),
                libc::AT_FDCWD,
                p2.as_ptr(),
                libc::RENAME_EXCHANGE
            )),
        )?;
        ensure(
            std::fs::read(d2.join("x")).map_err(|e| e.to_string())? == b"A",
            "exchanged",
        )?;
        Suite::expect_err(
            "rename missing",
            call!(libc::rename(c(&s.p("nope")).as_ptr(), c(&a).as_ptr())),
            libc::ENOENT,
        )?;
        Ok(())
    })();
    s.check("rename in all its forms and its errors", r);
}

fn links(s: &mut Suite) {
    let r = (|| {
        let f = s.p("lf");
        write_file(&f, b"L")?;
        ok(
            "link",
            call!(libc::link(c(&f).as_ptr(), c(&s.p("lf2")).as_ptr())),
        )?;
        ensure(ok("stat", stat(&f))?.st_nlink == 2, "nlink 2")?;
        Suite::expect_err(
            "link existing",
            call!(libc::link(c(&f).as_ptr(), c(&s.p("lf2")).as_ptr())),
            libc::EEXIST,
        )?;
        Suite::expect_err(
            "link dir",
            call!(libc::link(c(&s.dir).as_ptr(), c(&s.p("dl")).as_ptr())),
            libc::EPERM,
        )?;
        ok("unlink one", call!(libc::unlink(c(&f).as_ptr())))?;
        ensure(
            std::fs::read(s.p("lf2")).map_err(|e| e.to_string())? == b"L",
            "other link keeps data",
        )?;
        ok(
            "symlink",
            call!(libc::symlink(
                c(Path::new("lf2")).as_ptr(),
                c(&s.p("sl")).as_ptr()
            )),
        )?;
        ensure(
            std::fs::read(s.p("sl")).map_err(|e| e.to_string())? == b"L",
            "follow symlink",
        )?;
        let t = std::fs::read_link(s.p("sl")).map_err(|e| e.to_string())?;
        ensure(t == Path::new("lf2"), "readlink")?;
        ok(
            "loop a",
            call!(libc::symlink(
                c(Path::new("loopb")).as_ptr(),
                c(&s.p("loopa")).as_ptr()
            )),
        )?;
        ok(
            "loop b",
            call!(libc::symlink(
                c(Path::new("loopa")).as_ptr(),
                c(&s.p("loopb")).as_ptr()
            )),
        )?;
        Suite::expect_err(
            "symlink loop",
            open(&s.p("loopa"), libc::O_RDONLY, 0).map(i64::from),
            libc::ELOOP,
        )?;
        Suite::expect_err(
            "symlink existing",
            call!(libc::symlink(
                c(Path::new("x")).as_ptr(),
                c(&s.p("sl")).as_ptr()
            )),
            libc::EEXIST,
        )?;
        Ok(())
    })();
    s.check("hard links and symlinks and their errors", r);
}

fn special(s: &mut Suite) {
    let r = (|| {
        ok(
            "mkfifo",
            call!(libc::mkfifo(c(&s.p("fifo")).as_ptr(), 0o644)),
        )?;
        ensure(
            ok("stat", stat(&s.p("fifo")))?.st_mode & libc::S_IFMT == libc::S_IFIFO,
            "fifo type",
        )?;
        let sock =
            std::os::unix::net::UnixListener::bind(s.p("sock")).map_err(|e| e.to_string())?;
        drop(sock);
        ensure(
            ok("stat", stat(&s.p("sock")))?.st_mode & libc::S_IFMT == libc::S_IFSOCK,
            "socket type",
        )?;
        let dev = libc::makedev(1, 3);
        let r = call!(libc::mknod(
            c(&s.p("null")).as_ptr(),
            libc::S_IFCHR | 0o666,
            dev
        ));
        if s.root {
            ok("mknod char", r)?;
            let st = ok("stat", stat(&s.p("null")))?;
            ensure(
                st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == dev,
                "char device node",
            )?;
            ok(
                "mknod block",
                call!(libc::mknod(
                    c(&s.p("blk")).as_ptr(),
                    libc::S_IFBLK | 0o600,
                    libc::makedev(7, 0)
                )),
            )?;
        } else {
            Suite::expect_err("mknod char as user", r, libc::EPERM)?;
        }
        Ok(())
    })();
    s.check("mknod: fifo, socket, device nodes", r);
}

fn attrs(s: &mut Suite) {
    let f = s.p("attr");
    let r = (|| {
        write_file(&f, b"a")?;
        let st0 = ok("stat", stat(&f))?;
        std::thread::sleep(std::time::Duration::from_millis(20));
        ok("chmod", call!(libc::chmod(c(&f).as_ptr(), 0o600)))?;
        let st1 = ok("stat", stat(&f))?;
        ensure(st1.st_mode & 0o7777 == 0o600, "chmod mode")?;
        ensure(
            (st1.st_ctime, st1.st_ctime_nsec) > (st0.st_ctime, st0.st_ctime_nsec),
            "chmod updates ctime",
        )?;
        ensure(
            (st1.st_mtime, st1.st_mtime_nsec) == (st0.st_mtime, st0.st_mtime_nsec),
            "chmod keeps mtime",
        )?;
        let ts = [
            libc::timespec {
                tv_sec: 1_000_000_000,
                tv_nsec: 123_456_789,
            },
            libc::timespec {
                tv_sec: 1_500_000_000,
                tv_nsec: 5,
            },
        ];
        ok(
            "utimensat",
            call!(libc::utimensat(
                libc::AT_FDCWD,
                c(&f).as_ptr(),
                ts.as_ptr(),
                0
            )),
        )?;
        let st2 = ok("stat", stat(&f))?;
        ensure(
            st2.st_atime == 1_000_000_000 && st2.st_atime_nsec == 123_456_789,
            "atime set",
        )?;
        ensure(
            st2.st_mtime == 1_500_000_000 && st2.st_mtime_nsec == 5,
            "mtime set",
        )?;
        ensure(
            (st2.st_ctime, st2.st_ctime_nsec) >= (st1.st_ctime, st1.st_ctime_nsec),
            "utimens ctime",
        )?;
        std::thread::sleep(std::time::Duration::from_millis(20));
        write_file(&f, b"b")?;
        let st3 = ok("stat", stat(&f))?;
        ensure(st3.st_mtime > 1_500_000_000, "write updates mtime")?;
        // Writing a set-id file drops its set-id bits unless root writes.
        let sf = s.p("setid");
        write_file(&sf, b"#!/bin/sh\n")?;
        ok("chmod 6755", call!(libc::chmod(c(&sf).as_ptr(), 0o6755)))?;
        let fd = ok("open", open(&sf, libc::O_WRONLY | libc::O_APPEND, 0))?;
        ok(
            "write",
            call!(libc::write(fd, b"true\n".as_ptr().cast(), 5)),
        )?;
        close(fd);
        let m = ok("stat", stat(&sf))?.st_mode & 0o7777;
        if s.root {
            ensure(m == 0o6755, format!("root write kept set-id bits: {m:o}"))?;
        } else {
            ensure(m == 0o755, format!("user write clears set-id bits: {m:o}"))?;
        }
        if s.root {
            ok("chown", call!(libc::chown(c(&f).as_ptr(), 1234, 5678)))?;
            let st = ok("stat", stat(&f))?;
            ensure(st.st_uid == 1234 && st.st_gid == 5678, "chown ids")?;
        } else {
            Suite::expect_err(
                "chown to root as user",
                call!(libc::chown(c(&f).as_ptr(), 0, 0)),
                libc::EPERM,
            )?;
        }
        Ok(())
    })();
    s.check("chmod/chown/utimens with ctime updates", r);
}

fn perms(s: &mut Suite) {
    let r = (|| {
        let f = s.p("noperm");
        write_file(&f, b"secret")?;
        ok("chmod 000", call!(libc::chmod(c(&f).as_ptr(), 0)))?;
        let d = s.p("nox");
        std::fs::create_dir(&d).map_err(|e| e.to_string())?;
        write_file(&d.join("inner"), b"i")?;
        ok("chmod 600 dir", call!(libc::chmod(c(&d).as_ptr(), 0o600)))?;
        if s.root {
            // Root passes mode checks (CAP_DAC_OVERRIDE).
            let fd = ok("root opens mode 000", open(&f, libc::O_RDONLY, 0))?;
            close(fd);
        } else {
            Suite::expect_err(
                "open mode 000",
                open(&f, libc::O_RDONLY, 0).map(i64::from),
                libc::EACCES,
            )?;
            Suite::expect_err(
                "lookup in dir without x",
                stat(&d.join("inner")).map(|_| 0),
                libc::EACCES,
            )?;
            let ro = s.p("rodir");
            std::fs::create_dir(&ro).map_err(|e| e.to_string())?;
            ok("chmod 555", call!(libc::chmod(c(&ro).as_ptr(), 0o555)))?;
            Suite::expect_err(
                "create in read-only dir",
                open(&ro.join("x"), libc::O_CREAT | libc::O_RDWR, 0o644).map(i64::from),
                libc::EACCES,
            )?;
            ok("chmod back", call!(libc::chmod(c(&ro).as_ptr(), 0o755)))?;
            Suite::expect_err(
                "chmod a file of root",
                call!(libc::chmod(
                    c(s.dir.parent().unwrap_or(&s.dir)).as_ptr(),
                    0o777
                )),
                libc::EPERM,
            )?;
        }
        ok("chmod back", call!(libc::chmod(c(&d).as_ptr(), 0o755)))?;
        Ok(())
    })();
    s.check("permission checks (default_permissions)", r);
}

fn xattrs(s: &mut Suite) {
    let f = s.p("xf");
    let r = (|| {
        write_file(&f, b"x")?;
        let (n, v) = (c(Path::new("user.color")), b"blue");
        ok(
            "setxattr",
            call!(libc::setxattr(
                c(&f).as_ptr(),
                n.as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                0
            )),
        )?;
        let mut buf = [0u8; 64];
        let len = ok(
            "getxattr",
            call!(libc::getxattr(
                c(&f).as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len()
            )),
        )?;
        ensure(&buf[..len as usize] == v, "xattr value")?;
        let size = ok(
            "getxattr size",
            call!(libc::getxattr(
                c(&f).as_ptr(),
                n.as_ptr(),
                std::ptr::null_mut(),
                0
            )),
        )?;
        ensure(size == 4, "xattr size query")?;
        Suite::expect_err(
            "XATTR_CREATE existing",
            call!(libc::setxattr(
                c(&f).as_ptr(),
                n.as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                libc::XATTR_CREATE
            )),
            libc::EEXIST,
        )?;
        let m = c(Path::new("user.missing"));
        Suite::expect_err(
            "XATTR_REPLACE missing",
            call!(libc::setxattr(
                c(&f).as_ptr(),
                m.as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                libc::XATTR_REPLACE
            )),
            libc::ENODATA,
        )?;
        Suite::expect_err(
            "getxattr missing",
            call!(libc::getxattr(
                c(&f).as_ptr(),
                m.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len()
            )),
            libc::ENODATA,
        )?;
        Suite::expect_err(
            "getxattr small buffer",
            call!(libc::getxattr(
                c(&f).as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr().cast(),
                2
            )),
            libc::ERANGE,
        )?;
        let n2 = c(Path::new("user.big"));
        let big = vec![3u8; 60000];
        ok(
            "large xattr",
            call!(libc::setxattr(
                c(&f).as_ptr(),
                n2.as_ptr(),
                big.as_ptr().cast(),
                big.len(),
                0
            )),
        )?;
        let mut lb = [0u8; 256];
        let l = ok(
            "listxattr",
            call!(libc::listxattr(
                c(&f).as_ptr(),
                lb.as_mut_ptr().cast(),
                lb.len()
            )),
        )?;
        let names: Vec<&[u8]> = lb[..l as usize]
            .split(|&b| b == 0)
            .filter(|x| !x.is_empty())
            .collect();
        ensure(
            names.contains(&&b"user.color"[..]) && names.contains(&&b"user.big"[..]),
            format!("listxattr {names:?}"),
        )?;
        ok(
            "removexattr",
            call!(libc::removexattr(c(&f).as_ptr(), n.as_ptr())),
        )?;
        Suite::expect_err(
            "removexattr again",
            call!(libc::removexattr(c(&f).as_ptr(), n.as_ptr())),
            libc::ENODATA,
        )?;
        Ok(())
    })();
    s.check("extended attributes", r);
}

fn mmap(s: &mut Suite) {
    let f = s.p("mm");
    let r = (|| {
        write_file(&f, &vec![1u8; 1 << 20])?;
        let fd = ok("open", open(&f, libc::O_RDWR, 0))?;
        // SAFETY: mapping a file we opened read-write, 1 MiB long; the
        // mapping is unmapped before the descriptor is closed.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                1 << 20,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if p == libc::MAP_FAILED {
                close(fd);
                return Err(format!("mmap: errno {}", errno()));
            }
            let sl = std::slice::from_raw_parts_mut(p as *mut u8, 1 << 20);
            let first = sl[12345];
            sl[4096..8192].fill(0xAB);
            libc::msync(p, 1 << 20, libc::MS_SYNC);
            libc::munmap(p, 1 << 20);
            ensure(first == 1, "mmap read")?;
        }
        let b = ok("pread", pread(fd, 8192, 0))?;
        close(fd);
        ensure(
            b[..4096].iter().all(|&x| x == 1) && b[4096..].iter().all(|&x| x == 0xAB),
            "mmap write visible to read",
        )?;
        Ok(())
    })();
    s.check("mmap read/write", r);
}

fn bigdir(s: &mut Suite) {
    let d = s.p("many");
    let r = (|| {
        std::fs::create_dir(&d).map_err(|e| e.to_string())?;
        for i in 0..5000 {
            let fd = ok(
                "create",
                open(
                    &d.join(format!("f{i}")),
                    libc::O_CREAT | libc::O_WRONLY,
                    0o644,
                ),
            )?;
            close(fd);
        }
        let n = std::fs::read_dir(&d).map_err(|e| e.to_string())?.count();
        ensure(n == 5000, format!("readdir saw {n} of 5000"))?;
        for i in (0..5000).step_by(7) {
            ok(
                "unlink",
                call!(libc::unlink(c(&d.join(format!("f{i}"))).as_ptr())),
            )?;
        }
        let n = std::fs::read_dir(&d).map_err(|e| e.to_string())?.count();
        ensure(n == 5000 - 715, format!("after unlinks {n}"))?;
        ensure(
            stat(&d.join("f7")).is_err() && stat(&d.join("f8")).is_ok(),
            "lookups after unlinks",
        )?;
        Ok(())
    })();
    s.check("5000-entry directory: readdir, lookup, unlink", r);
}

/// Incompressible bytes (xorshift64*).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    v.truncate(n);
    v
}

fn statvfs(p: &Path) -> Result<libc::statvfs, String> {
    // SAFETY: `st` is plain data filled by the kernel; the path is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    ok("statvfs", call!(libc::statvfs(c(p).as_ptr(), &mut st)))?;
    Ok(st)
}

fn statfs(s: &mut Suite) {
    let r = (|| {
        let st = statvfs(&s.dir)?;
        ensure(
            st.f_blocks > 0 && st.f_bavail > 0 && st.f_bavail <= st.f_blocks,
            "statvfs numbers",
        )?;
        ensure(st.f_namemax == 255, "f_namemax")?;
        // Writing 8 MiB and syncing lowers free space by about that much
        // once the data is committed. As on ZFS, that is at the next txg:
        // an fsync answered by the intent log does not allocate the file's
        // blocks (free space counts what is on disk, `dsl_dataset_space`).
        // Live intent-log blocks count as allocated, as in OpenZFS, and
        // the log may hold up to 1/8 of a small pool (96 MiB of this one;
        // `spa/log_space.rs`) while fsyncs run; chunks lent to it without
        // a live block count as free (`Pool::snapshot_space`). So the
        // bound is loose: 4 MiB, where a fake statfs would move by 0, up
        // to the data plus the log's share.
        let before = st.f_bavail * st.f_frsize;
        let f = s.p("space");
        write_file(&f, &noise(8 << 20, 1))?;
        let fd = ok("open", open(&f, libc::O_RDONLY, 0))?;
        ok("fsync", call!(libc::fsync(fd)))?;
        close(fd);
        let mut used = 0;
        for _ in 0..300 {
            let st2 = statvfs(&s.dir)?;
            used = before.saturating_sub(st2.f_bavail * st2.f_frsize);
            if used >= 4 << 20 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        ensure(
            (4 << 20..=(8 << 20) + (96 << 20)).contains(&used),
            format!("8 MiB write moved free space by {used}"),
        )?;
        Ok(())
    })();
    s.check("statfs reports the pool's real free space", r);
}

fn full(s: &mut Suite, q: &Path) {
    let r = (|| {
        let d = q.join(format!("fill-{}", std::process::id()));
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        let f = d.join("fill");
        let fd = ok("create", open(&f, libc::O_CREAT | libc::O_RDWR, 0o644))?;
        let chunk = noise(1 << 20, 2);
        let mut off = 0i64;
        let mut errno_seen = 0;
        for _ in 0..4096 {
            match pwrite(fd, &chunk, off) {
                Ok(n) => off += n,
                Err(e) => {
                    errno_seen = e;
                    break;
                }
            }
            if off % (8 << 20) == 0 {
                if let Err(e) = call!(libc::fsync(fd)) {
                    errno_seen = e;
                    break;
                }
            }
        }
        if errno_seen == 0 {
            errno_seen = call!(libc::fsync(fd)).err().unwrap_or(0);
        }
        close(fd);
        ensure(
            errno_seen == libc::EDQUOT || errno_seen == libc::ENOSPC,
            format!("filling ended with errno {errno_seen} after {off} bytes"),
        )?;
        // Still consistent and usable: what was written reads back, the
        // file can be removed and space comes back.
        let fd = ok("reopen", open(&f, libc::O_RDONLY, 0))?;
        let back = ok("read", pread(fd, 1 << 20, 0))?;
        close(fd);
        ensure(back == chunk, "data written before the quota reads back")?;
        ok("unlink", call!(libc::unlink(c(&f).as_ptr())))?;
        let mut tries = 0;
        loop {
            let fd2 = ok(
                "create again",
                open(&d.join("again"), libc::O_CREAT | libc::O_RDWR, 0o644),
            )?;
            let r = pwrite(fd2, &chunk, 0).and_then(|_| call!(libc::fsync(fd2)));
            close(fd2);
            if r.is_ok() {
                break;
            }
            tries += 1;
            if tries > 50 {
                return Err("space never came back after unlink".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let _ = std::fs::remove_dir_all(&d);
        Ok(())
    })();
    s.check("ENOSPC/EDQUOT when full, filesystem still consistent", r);
}
