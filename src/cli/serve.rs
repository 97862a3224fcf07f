//! `ibjitter serve`: argument parsing; the server is `ibjitter::gen::server`.
use super::rdma_args::RdmaArgs;
use super::{exit, units};
use clap::Args;
use ibjitter::gen::server::{serve, ServeConfig};
use std::time::Duration;

#[derive(Args)]
#[command(
    after_help = "Exit status: 0 when stopped or (with --once) every session succeeded; \
1 when a session failed; 2 when the device or the port cannot be used."
)]
pub struct ServeArgs {
    #[command(flatten)]
    rdma: RdmaArgs,
    /// TCP port for the out-of-band exchange
    #[arg(long, short = 'p', default_value_t = 18515)]
    port: u16,
    /// Address to listen on
    #[arg(long, default_value = "0.0.0.0")]
    bind: String,
    /// Also accept `run --cm` clients: an rdma_cm listener on the same port number (bound to
    /// the device's IPv4 address unless --bind names one)
    #[arg(long)]
    cm: bool,
    /// Clients that start together: the start barrier waits for this many
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// Exit after one group of clients has finished
    #[arg(long)]
    once: bool,
    /// QP local ACK timeout exponent (4.096 us x 2^N, 0..=31; 0: no timeout)
    #[arg(long, default_value_t = 18, value_parser = clap::value_parser!(u8).range(0..=31))]
    qp_timeout: u8,
    /// How long a client group may take to gather at the start barrier; then the clients that
    /// are ready start without the missing ones
    #[arg(long, default_value = "120s", value_parser = units::duration)]
    start_timeout: Duration,
    /// Hold each full group at the start barrier until released: print "ibjitter serve: ready"
    /// on stdout, start on a line from stdin (what `incast --pattern` uses to start all of its
    /// receivers at once); --start-timeout bounds the wait
    #[arg(long)]
    hold: bool,
}

impl ServeArgs {
    fn config(self) -> ServeConfig {
        ServeConfig {
            device: self.rdma.device,
            ib_port: self.rdma.ib_port,
            gid_index: self.rdma.gid_index,
            cm: self.cm,
            bind: self.bind,
            port: self.port,
            clients: self.clients.max(1),
            once: self.once,
            qp_timeout: self.qp_timeout,
            start_timeout: self.start_timeout,
            hold: self.hold,
            ..ServeConfig::default()
        }
    }
}

/// The arguments after `ibjitter serve` that give `cfg` (spelled here, beside the flags;
/// `incast` launches its receiver with them). Its set-up timeout is not a flag.
pub(super) fn to_args(cfg: &ServeConfig) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "--port".into(),
        cfg.port.to_string(),
        "--bind".into(),
        cfg.bind.clone(),
        "--ib-port".into(),
        cfg.ib_port.to_string(),
        "--clients".into(),
        cfg.clients.to_string(),
        "--qp-timeout".into(),
        cfg.qp_timeout.to_string(),
        "--start-timeout".into(),
        format!("{}ms", cfg.start_timeout.as_millis()),
    ];
    if let Some(d) = &cfg.device {
        v.extend(["--dev".into(), d.clone()]);
    }
    if let Some(g) = cfg.gid_index {
        v.extend(["--gid-index".into(), g.to_string()]);
    }
    if cfg.cm {
        v.push("--cm".into());
    }
    if cfg.once {
        v.push("--once".into());
    }
    if cfg.hold {
        v.push("--hold".into());
    }
    v
}

pub fn run(a: ServeArgs) -> i32 {
    match serve(a.config()) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("ibjitter serve: {e}");
            exit::serve_error(&e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    #[test]
    fn to_args_parses_back_to_the_same_config() {
        let configs = [
            ServeConfig::default(),
            ServeConfig {
                device: Some("rxe1".into()),
                ib_port: 2,
                gid_index: Some(3),
                cm: true,
                bind: "10.0.0.2".into(),
                port: 19000,
                clients: 12,
                once: true,
                qp_timeout: 14,
                start_timeout: Duration::from_millis(61_500),
                hold: true,
                ..ServeConfig::default()
            },
        ];
        for cfg in configs {
            let argv = std::iter::once("serve".to_string()).chain(to_args(&cfg));
            let parsed = Serve::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(parsed.args.config(), cfg);
        }
    }
}
