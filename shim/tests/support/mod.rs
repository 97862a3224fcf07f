//! Shared by the host tests and the benchmark: builds libibjitter.so (release) and a stub
//! libibverbs.so.1, loads both with dlopen, and provides fake provider objects (a context
//! inside a `verbs_context`, QPs with `ibv_qp_ex`) whose functions are trivial.
#![allow(dead_code)]

#[path = "../../src/abi/verbs.rs"]
pub mod verbs_abi;

use std::ffi::{c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use verbs_abi::*;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Builds the release libibjitter.so (a no-op when up to date) and returns its path. The
/// whole workspace, as `tools/test` builds it: `-p ibjitter-shim` alone unifies features
/// differently, and the cdylib (no hash in its file name) was rebuilt at every switch.
pub fn build_shim() -> PathBuf {
    let st = Command::new(env!("CARGO"))
        .args(["build", "--release", "--workspace"])
        .current_dir(workspace_root())
        .status()
        .expect("run cargo build");
    assert!(st.success(), "cargo build --release --workspace failed");
    let so = target_dir().join("release/libibjitter.so");
    assert!(so.is_file(), "{} missing after build", so.display());
    so
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Compiles the stub libibverbs.so.1 (soname set, so the shim's
/// `dlopen("libibverbs.so.1", RTLD_NOLOAD)` fallback finds it) and returns its path.
pub fn build_stub() -> PathBuf {
    let dir = target_dir().join("ibjitter-stub-verbs");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("libibverbs.so.1");
    // A temporary per process and call, then rename: parallel tests (processes, or threads of
    // one) never see half a file, nor rename one another's away.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        "libibverbs.so.1.{}.{}",
        std::process::id(),
        CALLS.fetch_add(1, Relaxed)
    ));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/stub_verbs.c");
    let st = Command::new("cc")
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-Wl,-soname,libibverbs.so.1",
            "-o",
        ])
        .arg(&tmp)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed to build the stub libibverbs");
    std::fs::rename(&tmp, &out).unwrap();
    out
}

/// Compiles `tests/support/NAME.c` (with `-ldl`) into the target directory; returns the program.
pub fn build_program(name: &str) -> PathBuf {
    build_c(name, name, &["-ldl"])
}

/// Compiles `tests/support/SOURCE.c` with `flags` into `ibjitter-host-bin/OUT`; returns it.
pub fn build_c(source: &str, out: &str, flags: &[&str]) -> PathBuf {
    let dir = target_dir().join("ibjitter-host-bin");
    std::fs::create_dir_all(&dir).unwrap();
    let name = source;
    let out = dir.join(out);
    // Unique per process and call: parallel tests in one process build the same output.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        "{}.{}.{}",
        out.display(),
        std::process::id(),
        CALLS.fetch_add(1, Relaxed)
    ));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/support/{name}.c"));
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&tmp)
        .arg(&src)
        .args(flags)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed on {}", src.display());
    std::fs::rename(&tmp, &out).unwrap();
    out
}

/// Compiles the stand-in libucp.so.0 (tests/support/stub_ucp.c, soname set) and returns it.
pub fn build_stub_ucp() -> PathBuf {
    build_c(
        "stub_ucp",
        "libucp.so.0",
        &["-shared", "-fPIC", "-Wl,-soname,libucp.so.0"],
    )
}

/// Runs `cmd`, asserts it succeeded, returns its (stdout, stderr).
pub fn run_ok(cmd: &mut Command) -> (String, String) {
    let out = cmd.output().expect("spawn");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{stdout}{stderr}",
        out.status
    );
    (stdout, stderr)
}

fn dlopen(path: &Path) -> *mut c_void {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a valid C string after a failure.
        let e = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        panic!("dlopen {}: {}", path.display(), e.to_string_lossy());
    }
    h
}

fn sym<T: Copy>(h: *mut c_void, name: &str) -> T {
    let c = CString::new(name).unwrap();
    // SAFETY: valid handle and name.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(!p.is_null(), "{name} not exported");
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is the function pointer type of the symbol.
    unsafe { std::mem::transmute_copy(&p) }
}

/// The shim's exported hooks, loaded from the built .so (whose constructor has read the
/// environment of this process).
pub struct Shim {
    pub open_device: unsafe extern "C" fn(*mut c_void) -> *mut ibv_context,
    pub import_device: unsafe extern "C" fn(c_int) -> *mut ibv_context,
    /// The stub's: what its ibv_import_device returns.
    pub set_imported_context: unsafe extern "C" fn(*mut ibv_context),
    /// The stub's: how many times `ibv_qp_to_qp_ex` was called.
    pub qp_to_qp_ex_calls: unsafe extern "C" fn() -> std::ffi::c_long,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut c_void, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub create_cq:
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub get_cq_event:
        unsafe extern "C" fn(*mut c_void, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
}

impl Shim {
    /// Loads the stub libibverbs first, then `so`.
    pub fn load(so: &Path, stub: &Path) -> Shim {
        let stub = dlopen(stub);
        let h = dlopen(so);
        Shim {
            open_device: sym(h, "ibv_open_device"),
            import_device: sym(h, "ibv_import_device"),
            set_imported_context: sym(stub, "stub_set_imported_context"),
            qp_to_qp_ex_calls: sym(stub, "stub_qp_to_qp_ex_calls"),
            close_device: sym(h, "ibv_close_device"),
            create_qp: sym(h, "ibv_create_qp"),
            destroy_qp: sym(h, "ibv_destroy_qp"),
            modify_qp: sym(h, "ibv_modify_qp"),
            dealloc_pd: sym(h, "ibv_dealloc_pd"),
            create_cq: sym(h, "ibv_create_cq"),
            destroy_cq: sym(h, "ibv_destroy_cq"),
            get_cq_event: sym(h, "ibv_get_cq_event"),
        }
    }
}

/// Calls made into the fake provider's counting post functions.
pub static PROVIDER_POSTS: AtomicU64 = AtomicU64::new(0);
pub static PROVIDER_CREATE_QP_EX: AtomicU64 = AtomicU64::new(0);

/// A provider post_send that does nothing (for measuring the wrapper).
pub unsafe extern "C" fn bare_post_send(
    _qp: *mut ibv_qp,
    _wr: *mut ibv_send_wr,
    _bad: *mut *mut ibv_send_wr,
) -> c_int {
    0
}

pub unsafe extern "C" fn counting_post_send(
    _qp: *mut ibv_qp,
    _wr: *mut ibv_send_wr,
    _bad: *mut *mut ibv_send_wr,
) -> c_int {
    PROVIDER_POSTS.fetch_add(1, Relaxed);
    0
}

/// Calls into the second provider of the mixed-provider test.
pub static PROVIDER_B_POSTS: AtomicU64 = AtomicU64::new(0);

pub unsafe extern "C" fn counting_post_send_b(
    _qp: *mut ibv_qp,
    _wr: *mut ibv_send_wr,
    _bad: *mut *mut ibv_send_wr,
) -> c_int {
    PROVIDER_B_POSTS.fetch_add(1, Relaxed);
    0
}

pub unsafe extern "C" fn counting_wr_complete_b(_qpx: *mut ibv_qp_ex) -> c_int {
    PROVIDER_B_POSTS.fetch_add(1, Relaxed);
    0
}

/// Provider A's and B's `wr_start` (distinct functions: the mixed-provider tests need them).
pub unsafe extern "C" fn noop_wr_start(_qpx: *mut ibv_qp_ex) {}
pub unsafe extern "C" fn noop_wr_start_b(_qpx: *mut ibv_qp_ex) {
    std::hint::black_box(1);
}

pub unsafe extern "C" fn counting_wr_complete(_qpx: *mut ibv_qp_ex) -> c_int {
    PROVIDER_POSTS.fetch_add(1, Relaxed);
    0
}

/// The fake provider's `create_qp_ex`: counts, and returns the fake QP passed as the pd (as
/// the stub's `ibv_create_qp` does), or null without one.
pub unsafe extern "C" fn fake_create_qp_ex(
    _ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    PROVIDER_CREATE_QP_EX.fetch_add(1, Relaxed);
    if attr.is_null() {
        return std::ptr::null_mut();
    }
    (*attr).pd.cast()
}

/// `ibv_create_qp_ex` as verbs.h inlines it (through the context's `create_qp_ex`, the
/// shim's once it patched the context), asking for the `ibv_wr_*` API as perftest does: the
/// only way a QP gets an `ibv_qp_ex` the shim patches. Returns the QP (`qpx` itself, from
/// the fake provider).
///
/// # Safety
/// `qpx` a fake QP whose context is a [`FakeContext`]'s.
pub unsafe fn create_qp_for_wr_api(qpx: *mut ibv_qp_ex) -> *mut ibv_qp {
    let ctx = (*qpx).qp_base.context;
    let vctx = ctx
        .cast::<u8>()
        .sub(std::mem::offset_of!(verbs_context, context))
        .cast::<verbs_context>();
    let create = std::ptr::read_volatile(&(*vctx).create_qp_ex).expect("create_qp_ex");
    let mut attr: ibv_qp_init_attr_ex = std::mem::zeroed();
    attr.comp_mask = ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD
        | ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attr.pd = qpx.cast();
    attr.send_ops_flags = ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE as u64;
    create(ctx, &mut attr)
}

/// A fake device context: an `ibv_context` inside a `verbs_context`, as providers allocate.
pub struct FakeContext {
    vctx: Box<verbs_context>,
}

impl FakeContext {
    pub fn new(post_send: PostSendFn) -> FakeContext {
        // SAFETY: bindgen structs of pointers, integers and Option<fn> are valid all-zero.
        let mut vctx: Box<verbs_context> = unsafe { Box::new(std::mem::zeroed()) };
        vctx.sz = std::mem::size_of::<verbs_context>();
        vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED as *mut c_void;
        vctx.context.ops.post_send = Some(post_send);
        vctx.create_qp_ex = Some(fake_create_qp_ex);
        FakeContext { vctx }
    }

    /// The pointer libibverbs would hand out.
    pub fn ctx(&mut self) -> *mut ibv_context {
        &mut self.vctx.context
    }

    /// Gives the context a provider `create_cq_ex` (before it is opened through the shim).
    pub fn set_create_cq_ex(
        &mut self,
        f: unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex,
    ) {
        self.vctx.create_cq_ex = Some(f);
    }

    /// The context's `create_cq_ex` now (the shim's, once opened through it).
    pub fn create_cq_ex(
        &self,
    ) -> unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
        self.vctx.create_cq_ex.unwrap()
    }

    /// Gives the context a provider `poll_cq` (before it is opened through the shim).
    pub fn set_poll_cq(
        &mut self,
        f: unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int,
    ) {
        self.vctx.context.ops.poll_cq = Some(f);
    }

    /// Gives the context a provider `alloc_parent_domain` (before it is opened through the
    /// shim).
    pub fn set_alloc_parent_domain(
        &mut self,
        f: unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd,
    ) {
        self.vctx.alloc_parent_domain = Some(f);
    }

    /// The context's `alloc_parent_domain` now (the shim's, once opened through it in line
    /// mode): what the inline `ibv_alloc_parent_domain` calls.
    pub fn alloc_parent_domain(
        &self,
    ) -> unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd
    {
        self.vctx.alloc_parent_domain.unwrap()
    }

    pub fn set_req_notify_cq(&mut self, f: unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int) {
        self.vctx.context.ops.req_notify_cq = Some(f);
    }

    pub fn post_send_ptr(&self) -> usize {
        self.vctx.context.ops.post_send.map_or(0, |f| f as usize)
    }

    pub fn create_qp_ex_ptr(&self) -> usize {
        self.vctx.create_qp_ex.map_or(0, |f| f as usize)
    }
}

/// A fake QP of `ctx`, with an `ibv_qp_ex` whose `wr_complete` counts.
/// (Give it provider B's `wr_start` and `wr_complete` together.)
pub fn fake_qp(ctx: *mut ibv_context) -> Box<ibv_qp_ex> {
    // SAFETY: as above, all-zero is valid.
    let mut q: Box<ibv_qp_ex> = unsafe { Box::new(std::mem::zeroed()) };
    q.qp_base.context = ctx;
    q.wr_start = Some(noop_wr_start);
    q.wr_complete = Some(counting_wr_complete);
    q
}

/// `ibv_post_send` as verbs.h inlines it: through `qp->context->ops.post_send`, re-read on
/// every call.
#[inline(always)]
pub unsafe fn ibv_post_send(qp: *mut ibv_qp) -> c_int {
    let ctx = std::ptr::read_volatile(&(*qp).context);
    let f = std::ptr::read_volatile(&(*ctx).ops.post_send).unwrap();
    let mut bad = std::ptr::null_mut();
    f(qp, std::ptr::null_mut(), &mut bad)
}

/// A one-request batch of the `ibv_wr_*` API: `ibv_wr_start` then `ibv_wr_complete`, as
/// verbs.h inlines them (the work request builders in between do not concern the shim).
#[inline(always)]
pub unsafe fn ibv_wr_batch(qpx: *mut ibv_qp_ex) -> c_int {
    let start = std::ptr::read_volatile(&(*qpx).wr_start).unwrap();
    start(qpx);
    let complete = std::ptr::read_volatile(&(*qpx).wr_complete).unwrap();
    complete(qpx)
}

/// CLOCK_MONOTONIC in ns.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The least a wait of `ns` the shim made can measure on [`now_ns`]: the shim keeps time on
/// the TSC, calibrated against CLOCK_MONOTONIC at each load (good to ~100 ppm), so a wait
/// shows up to 0.1 % short here (one run measured a 1 ms wait as 999,998 ns).
pub fn waited(ns: u64) -> u64 {
    ns - ns / 1000
}

/// This test binary re-run as a child for test `test`: `var` set to `scenario`, the
/// shim and stub paths in `IBJITTER_TEST_SO`/`IBJITTER_TEST_STUB`, `env` added, and no
/// other `IBJITTER_*` variable or launcher rank of this process; under `wrapper` (a
/// command and its arguments, e.g. strace) if given.
pub fn child_command(
    test: &str,
    var: &str,
    scenario: &str,
    env: &[(&str, &str)],
    wrapper: &[&str],
) -> Command {
    // Built once per test binary (its tests run in parallel threads).
    static BUILT: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    let (so, stub) = BUILT.get_or_init(|| (build_shim(), build_stub()));
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrapper.split_first() {
        Some((w, args)) => {
            let mut c = Command::new(w);
            c.args(args).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") || LAUNCHER_RANK_ENV.contains(&k.as_str()) {
            cmd.env_remove(k);
        }
    }
    cmd.env(var, scenario)
        .env("IBJITTER_TEST_SO", so)
        .env("IBJITTER_TEST_STUB", stub)
        .envs(env.iter().copied());
    cmd
}

/// The shim and stub a [`child_command`] child was given.
pub fn load_child_shim() -> Shim {
    Shim::load(
        Path::new(&std::env::var("IBJITTER_TEST_SO").unwrap()),
        Path::new(&std::env::var("IBJITTER_TEST_STUB").unwrap()),
    )
}

/// This host's name, as the shim puts it in the stats file of a process that does not own a
/// `%p`-less path (`NAME.<host>.<pid>.json`).
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer and its length.
    assert_eq!(
        unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) },
        0
    );
    let end = buf.iter().position(|&b| b == 0).unwrap();
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The launcher variables the shim reads a rank from (and torchrun's mark): a test run
/// inside an MPI, Slurm or torchrun job leaves them out of its children's environment, which
/// would otherwise name their stats files by host and pid and draw per-rank seeds.
pub const LAUNCHER_RANK_ENV: [&str; 8] = [
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "MV2_COMM_WORLD_RANK",
    "SLURM_PROCID",
    "RANK",
    "TORCHELASTIC_RUN_ID",
    "LOCAL_RANK",
];
