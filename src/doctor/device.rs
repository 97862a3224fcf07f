//! Devices, ports, link layer, GIDs, MTU, and whether the port's counters can be read.
use super::verdict::{Check, Verdict};
use crate::gen::port_counters::PortCounters;
use crate::verbs::{self, cm::gid_ipv4, mtu_bytes};
use serde_json::json;
use std::path::Path;

/// The port the ping-pongs run on, as found.
#[derive(Debug, Clone)]
pub struct Target {
    pub device: String,
    pub port: u8,
    pub gid_index: i32,
    /// `Ethernet` (RoCE) or `InfiniBand`, as sysfs says.
    pub link_layer: String,
}

const GROUP: &str = "device";

/// Checks the device (`name`, or the first one) and its `port`; returns the port to use when
/// it is usable.
pub fn check(name: Option<&str>, port: u8) -> (Option<Target>, Vec<Check>) {
    let mut out = Vec::new();
    let names = verbs::device_names();
    let listed = Check::new(GROUP, "devices", Verdict::Ok);
    if names.is_empty() {
        out.push(
            listed
                .verdict(Verdict::Fail)
                .detail("libibverbs finds no RDMA device")
                .advice(
                    "load the NIC's RDMA driver (mlx5_ib, rdma_rxe, ...) and install its \
                     user-space provider (rdma-core / ibverbs-providers)",
                ),
        );
        return (None, out);
    }
    out.push(
        listed
            .detail(names.join(", "))
            .data(json!({ "names": names })),
    );
    let ctx = match verbs::open_device(name) {
        Ok(c) => c,
        Err(e) => {
            out.push(
                Check::new(GROUP, name.unwrap_or("device"), Verdict::Fail)
                    .detail(format!("cannot open: {e}"))
                    .advice("give one of the devices above with --device"),
            );
            return (None, out);
        }
    };
    let dev = ctx.name().to_string();
    let what = format!("{dev} port {port}");
    let info = match ctx.port(port) {
        Ok(i) => i,
        Err(e) => {
            out.push(
                Check::new(GROUP, what, Verdict::Fail)
                    .detail(format!("cannot query the port: {e}"))
                    .advice("give an existing port with --port"),
            );
            return (None, out);
        }
    };
    let sys_port = Path::new("/sys/class/infiniband")
        .join(&dev)
        .join("ports")
        .join(port.to_string());
    let read = |f: &str| {
        std::fs::read_to_string(sys_port.join(f))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let link_layer = read("link_layer");
    let mtu = mtu_bytes(info.active_mtu);
    let port_check = Check::new(GROUP, what.clone(), Verdict::Ok).data(json!({
        "active": info.active, "link_layer": link_layer, "active_mtu": mtu,
        "link_gbps": info.link_gbps, "lid": info.lid, "state": read("state"),
    }));
    let described = format!(
        "{}, link layer {}, active MTU {mtu}, {:.0} Gb/s",
        if info.active { "ACTIVE" } else { "not active" },
        if link_layer.is_empty() {
            "unknown"
        } else {
            &link_layer
        },
        info.link_gbps
    );
    if !info.active {
        out.push(
            port_check
                .verdict(Verdict::Fail)
                .detail(described)
                .advice("bring the link up (cable, switch port, subnet manager on InfiniBand)"),
        );
        return (None, out);
    }
    out.push(port_check.detail(described));

    let gid_index = ctx.default_gid_index(port).unwrap_or(0);
    let gid = ctx.gid(port, gid_index).unwrap_or([0; 16]);
    let gid_type = read(&format!("gid_attrs/types/{gid_index}"));
    let (verdict, why) = gid_verdict(&link_layer, &gid_type, &gid, info.lid);
    let mut g = Check::new(GROUP, format!("{what} GID"), verdict)
        .detail(format!(
            "index {gid_index}{}{}: {why}",
            if gid_type.is_empty() {
                String::new()
            } else {
                format!(" ({gid_type})")
            },
            gid_ipv4(&gid).map(|a| format!(" {a}")).unwrap_or_default()
        ))
        .data(json!({ "index": gid_index, "type": gid_type, "gid": gid_text(&gid) }));
    if verdict != Verdict::Ok {
        g = g.advice(
            "give the RoCE interface an IP address (RoCE v2 GIDs follow the netdev's \
             addresses); check `rdma link` and `ibv_devinfo -v`",
        );
    }
    let usable = verdict != Verdict::Fail;
    out.push(g);

    let counters = PortCounters::open(Path::new("/sys"), &dev, port);
    out.push(counters_check(&what, &counters.read()));
    let target = usable.then_some(Target {
        device: dev,
        port,
        gid_index,
        link_layer,
    });
    (target, out)
}

/// Whether the GID chosen for a port can carry the ping-pong: on Ethernet (RoCE) a non-zero
/// GID, RoCE v2 preferred; on InfiniBand a LID.
pub fn gid_verdict(
    link_layer: &str,
    gid_type: &str,
    gid: &[u8; 16],
    lid: u16,
) -> (Verdict, String) {
    if *gid == [0; 16] {
        return (Verdict::Fail, "the port has no GID".into());
    }
    if link_layer.eq_ignore_ascii_case("ethernet") {
        if gid_type.contains("RoCE v2") {
            (Verdict::Ok, "RoCE v2 (routable)".into())
        } else {
            (
                Verdict::Warn,
                "no RoCE v2 GID: RoCE v1 works on one L2 segment only".into(),
            )
        }
    } else if lid == 0 {
        (
            Verdict::Fail,
            "InfiniBand port without a LID: is a subnet manager running?".into(),
        )
    } else {
        (Verdict::Ok, format!("InfiniBand, LID {lid}"))
    }
}

/// The port's counters: readable (the injector's coverage line says what the port sent from
/// them) or not.
pub fn counters_check(what: &str, values: &[Option<u64>]) -> Check {
    let c = Check::new(GROUP, format!("{what} counters"), Verdict::Ok);
    let readable = values.iter().filter(|v| v.is_some()).count();
    let data = json!({ "files": values.len(), "readable": readable });
    if values.is_empty() {
        c.verdict(Verdict::Warn)
            .detail("the port exposes no counters in sysfs")
            .advice(
                "the injector's coverage line cannot say what the port sent; \
                 nothing else depends on it",
            )
            .data(data)
    } else if readable < values.len() {
        c.verdict(Verdict::Warn)
            .detail(format!(
                "{readable} of {} counter files readable",
                values.len()
            ))
            .advice("some counters need privileges (or are not numbers): those are left out")
            .data(data)
    } else {
        c.detail(format!("{readable} counter files readable"))
            .data(data)
    }
}

fn gid_text(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];

    #[test]
    fn a_roce_port_wants_a_v2_gid_and_an_infiniband_port_a_lid() {
        assert_eq!(gid_verdict("Ethernet", "RoCE v2", &V4, 0).0, Verdict::Ok);
        assert_eq!(
            gid_verdict("Ethernet", "IB/RoCE v1", &V4, 0).0,
            Verdict::Warn
        );
        assert_eq!(
            gid_verdict("Ethernet", "RoCE v2", &[0; 16], 0).0,
            Verdict::Fail
        );
        let ib = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(gid_verdict("InfiniBand", "", &ib, 7).0, Verdict::Ok);
        let (v, why) = gid_verdict("InfiniBand", "", &ib, 0);
        assert_eq!(v, Verdict::Fail);
        assert!(why.contains("subnet manager"), "{why}");
    }

    #[test]
    fn counters_are_ok_only_when_all_read() {
        assert_eq!(
            counters_check("d", &[Some(1), Some(2)]).verdict,
            Verdict::Ok
        );
        let partly = counters_check("d", &[Some(1), None]);
        assert_eq!(partly.verdict, Verdict::Warn);
        assert!(partly.detail.contains("1 of 2"), "{}", partly.detail);
        assert_eq!(counters_check("d", &[]).verdict, Verdict::Warn);
    }

    #[test]
    fn gids_print_as_eight_groups() {
        assert_eq!(gid_text(&V4), "0000:0000:0000:0000:0000:ffff:0a00:0001");
    }
}
