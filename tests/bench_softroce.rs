//! The Soft-RoCE bench itself: real rdma_rxe devices in the VM, driven by unmodified rdma-core,
//! perftest and Open MPI programs. If these fail, every other bench test is meaningless.
mod common;
use common::bench::{mpi_pingpong, Vm};
use common::perftest::{field, latency_rows};

#[test]
fn two_active_rxe_devices() {
    let out = Vm::new().run("ibv_devinfo");
    out.assert_success();
    for dev in ["rxe0", "rxe1"] {
        assert!(
            out.output.contains(&format!("hca_id:\t{dev}")),
            "{dev} missing:\n{}",
            out.output
        );
    }
    let active = out.output.matches("PORT_ACTIVE").count();
    assert_eq!(active, 2, "expected two ACTIVE ports:\n{}", out.output);
}

#[test]
fn one_device_when_asked() {
    let out = Vm::new().devices(1).run("ibv_devices");
    out.assert_success();
    assert!(
        out.output.contains("rxe0") && !out.output.contains("rxe1"),
        "{}",
        out.output
    );
}

#[test]
fn rc_pingpong_crosses_the_veth_pair() {
    let out = Vm::new().run(
        r#". tools/vm/lib.sh
        tx=$(cat /sys/class/net/veth0/statistics/tx_packets)
        pair rc_pingpong "tcp_listening 18515" \
            "ibv_rc_pingpong -d rxe1 -g 1 -n 1000" "ibv_rc_pingpong -d rxe0 -g 1 -n 1000 10.0.0.2"
        echo "veth0_tx=$(( $(cat /sys/class/net/veth0/statistics/tx_packets) - tx ))""#,
    );
    out.assert_success();
    assert_eq!(
        out.output.matches("1000 iters in").count(),
        2,
        "{}",
        out.output
    );
    // 1000 round trips: at least 1000 RoCE packets left rxe0 through veth0.
    let tx = field(&out.output, "veth0_tx").expect("veth0_tx line");
    assert!(tx >= 1000.0, "only {tx} packets on veth0:\n{}", out.output);
}

#[test]
fn ib_write_lat_reports_latency() {
    let out = Vm::new().run(
        r#". tools/vm/lib.sh
        pair ib_write_lat "tcp_listening 18515" \
            "ib_write_lat -d rxe1 -x 1 -p 18515 -n 1000" "ib_write_lat -d rxe0 -x 1 -p 18515 -n 1000 10.0.0.2""#,
    );
    out.assert_success();
    let rows = latency_rows(&out.output);
    let row = rows
        .first()
        .expect("no latency line in ib_write_lat output");
    // bytes, iterations, t_min, t_max, t_typical, t_avg, t_stdev, ...
    assert_eq!((row[0], row[1]), (2.0, 1000.0), "{row:?}");
    let (t_min, t_max, t_typical) = (row[2], row[3], row[4]);
    assert!(
        t_min > 0.0 && t_min <= t_typical && t_typical <= t_max,
        "{row:?}"
    );
}

#[test]
fn open_mpi_over_ucx_rc_verbs_uses_rxe() {
    let pingpong = mpi_pingpong();
    let out = Vm::new().run(&format!(
        r#". tools/vm/lib.sh
        rx=$(rxe_counter rxe1 rcvd_pkts)
        mpirun --allow-run-as-root -np 2 --bind-to none --mca pml ucx --mca btl self --mca osc ^ucx \
            -x UCX_TLS=rc_verbs,ud_verbs:aux,self -x UCX_UD_VERBS_ETH_DGID_CHECK=n \
            tools/mpi/rank-device {} 500 4096
        echo "rxe1_rcvd=$(( $(rxe_counter rxe1 rcvd_pkts) - rx ))""#,
        pingpong.display()
    ));
    out.assert_success();
    let line = out
        .output
        .lines()
        .find(|l| l.starts_with("pingpong "))
        .expect("no result line");
    assert_eq!(field(line, "iters"), Some(500.0), "{line}");
    assert!(
        field(line, "half_rtt_us").is_some_and(|t| t > 0.0),
        "{line}"
    );
    // No shared memory: every one of the 500 messages to rank 1 arrived through rxe1.
    let rcvd = field(&out.output, "rxe1_rcvd").expect("rxe1_rcvd line");
    assert!(
        rcvd >= 500.0,
        "only {rcvd} packets reached rxe1:\n{}",
        out.output
    );
}
