//! What a GID says about its port: the IPv4 address of a RoCE GID. Both the device's default
//! GID choice ([`super::context`]) and rdma_cm addressing ([`super::cm`]) read it.
use std::net::Ipv4Addr;

/// The IPv4 address of a RoCE GID, if it is IPv4-mapped (`::ffff:a.b.c.d`).
pub fn gid_ipv4(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    (gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
        .then(|| Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_gids_give_their_address() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(gid_ipv4(&gid), Some(Ipv4Addr::new(10, 0, 0, 2)));
        gid[0] = 0xfe;
        gid[1] = 0x80;
        assert_eq!(gid_ipv4(&gid), None);
    }
}
