//! From install to a first result, as a user without root, on the bench: `tools/install` into
//! a fresh prefix, then `mpirun -np 2 PREFIX/bin/ibjitter exec --delay 100us -- PROGRAM`
//! (the wrapper after the launcher, as HPC interposers go) delays both ranks, each rank's
//! coverage line exact; and `PREFIX/bin/ibjitter doctor` (found its installed shim) exits 0
//! with a verdict per path.
mod common;

use common::bench::{mpi_pingpong, release_artifact, repo_root, scratch_dir, Vm};

#[test]
fn a_user_installs_without_root_and_injects_into_an_mpi_job() {
    let bin = release_artifact("ibjitter", "ibjitter");
    release_artifact("ibjitter-shim", "libibjitter.so");
    let pp = mpi_pingpong();
    let dir = scratch_dir("install-bench");
    let (repo, pp, d) = (repo_root(), pp.display(), dir.display());
    let target = bin
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .display()
        .to_string();
    // The bench has no udev and no limits.conf: rdma-core's rules make the verbs device files
    // 0666 and an HPC site's limits give users unlimited locked memory (UCX registers tens of
    // MB), so the test does what they do. Then everything runs as `nobody`.
    let script = format!(
        r#"set -u
        chmod 666 /dev/infiniband/* 2>/dev/null
        ulimit -l unlimited
        as_user() {{ setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp "$@"; }}
        prefix=/tmp/ibjitter-prefix
        as_user env CARGO_TARGET_DIR={target} {repo}/tools/install --prefix $prefix --no-build || exit 11
        as_user $prefix/bin/ibjitter exec --help > /dev/null || exit 12
        as_user mpirun -np 2 --bind-to none --mca pml ucx --mca btl self --mca osc ^ucx \
            -x UCX_TLS=rc_verbs,ud_verbs:aux,self -x UCX_UD_VERBS_ETH_DGID_CHECK=n \
            {repo}/tools/mpi/rank-device $prefix/bin/ibjitter exec --delay 100us --layer verbs \
            -- {pp} 300 8 > {d}/mpi.out 2>&1 || {{ cat {d}/mpi.out; exit 13; }}
        cat {d}/mpi.out
        as_user $prefix/bin/ibjitter doctor --device rxe0 --delay 1000us > {d}/doctor.out 2>&1
        echo "doctor rc=$?"
        cat {d}/doctor.out
        exit 0
        "#,
        repo = repo.display(),
    );
    let out = Vm::new().timeout(900).writable(&dir).run(&script);
    out.assert_success();
    let text = &out.output;
    // Both ranks: every send that passed the hooks was delayed, and there were sends.
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("ibjitter: delayed "))
        .collect();
    assert_eq!(lines.len(), 2, "one coverage line per rank:\n{text}");
    for l in &lines {
        let w: Vec<&str> = l.split_whitespace().collect();
        let at = w.iter().position(|x| *x == "delayed").unwrap();
        let (delayed, total) = (w[at + 1], w[at + 3]);
        assert_eq!(delayed, total, "{l}");
        assert!(delayed.parse::<u64>().unwrap() >= 300, "{l}");
    }
    // Exit 0: no path FAILed. D = 1 ms, as doctor_bench: at the default 100 us
    // ibv_rc_pingpong's average round trip is noise on the bench (once 4.7 ms clean, +44 us
    // with D). A warn is a verdict too.
    assert!(text.contains("doctor rc=0"), "doctor:\n{text}");
    for path in ["ibv_post_send path", "ibv_wr_* path", "UCP path"] {
        assert!(
            text.lines()
                .any(|l| (l.starts_with("ok") || l.starts_with("warn")) && l.contains(path)),
            "doctor gives no verdict for the {path}:\n{text}"
        );
    }
}
